"""The hooks on SGLang's model registry, inside SGLang's own processes: the engine guard, the record of
what the target's setter did, a named release's capture rule, and the draft's fc probe.

Every model class SGLang resolves passes through ``on_resolved`` once. Nothing here is a CPU accommodation
(those are ``cpu/``, pinned to one release) and nothing puts a stand-in ``sgl_kernel`` anywhere, so this
runs unchanged on a CUDA host with the real kernels. Installed by:

- SGLang's own plugin framework (``sglang.srt.plugins``, 0.5.23 on: ``plugin.register``, through
  ``HookRegistry``), the way a user's stock server loads it after ``pip install``;
- on a release without that framework, ``site/sitecustomize.py`` (this folder's ``site``: no
  ``sgl_kernel`` in it), which watches the registry's import (``install_watch``);
- on a CPU host, ``cpu/site/sitecustomize.py`` with the accommodations.

``install_*`` are idempotent: a class is handled once however many of them ran. Each thing done appends
one record (name, what, why, where) to the report file ``EAGLE3_WORKBOOK_SGLANG_REPORT`` names.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import os
import sys
import textwrap

HOOKS_ENV = "EAGLE3_WORKBOOK_SGLANG_HOOKS"        # "cpu": the CPU accommodations apply (cpu/site)
REPORT_ENV = "EAGLE3_WORKBOOK_SGLANG_REPORT"      # JSONL the hooks append their records to
RULE_ENV = "EAGLE3_WORKBOOK_SGLANG_CAPTURE_RULE"  # JSON file: a release's setter to install
PROBE_ENV = "EAGLE3_WORKBOOK_SGLANG_PROBE_DIR"    # folder: the draft's fc inputs, saved by row count
RULE_RELEASE = "0.5.23"   # the runtime whose capture machinery a replaced setter is compiled against
REGISTRY = "sglang.srt.models.registry"
SETTER = "set_eagle3_layers_to_capture"
_after: dict[str, list] = {}
_before: dict[str, list] = {}
_done: set[str] = set()
_depth: list[int] = []
_probing: list[int] = []


def report(name: str, what: str, why: str, where: str = "", **extra) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    row = {"name": name, "what": what, "why": why, "where": where, "pid": os.getpid(), **extra}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, name):
        self.inner, self.name = inner, name

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        for fn in _after.get(self.name, ()):
            fn(module)


class _Watcher(importlib.abc.MetaPathFinder):
    """Runs the ``_before`` hooks of a watched module ahead of its import, the ``_after`` ones once it
    has executed; every other import passes through untouched."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname in _done or (fullname not in _after and fullname not in _before):
            return None
        _done.add(fullname)
        for fn in _before.get(fullname, ()):
            fn()
        if fullname not in _after:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader, fullname)
        return spec


def watch(module: str, *, before=None, after=None) -> None:
    """Run ``before()`` ahead of ``module``'s import and ``after(module)`` once it has executed (every
    other import passes through untouched); the watcher goes first on ``sys.meta_path`` once."""
    if before is not None:
        _before.setdefault(module, []).append(before)
    if after is not None:
        _after.setdefault(module, []).append(after)
    if not any(isinstance(f, _Watcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _Watcher())


# --------------------------------------------------------------------------- the hooks


def _load_rule() -> dict | None:
    path = os.environ.get(RULE_ENV)
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _install_rule(cls, rule: dict) -> None:
    """Compile the named release's own setter (text read from its wheel by the workbook) in the live
    model module's namespace and make it the class's method: the id-to-layer rule of that release, with
    this runtime's capture machinery (0.5.23 captures index v as boundary v at any v)."""
    if installed_release() != RULE_RELEASE:      # the setter text leans on this runtime's capture machinery
        sys.stderr.write(f"eagle3-workbook: a replaced capture rule needs the sglang=={RULE_RELEASE} "
                         f"runtime; "
                         f"found sglang=={installed_release()}\n")
        raise SystemExit(2)
    namespace = dict(vars(sys.modules[cls.__module__]))
    code = compile(textwrap.dedent(rule["source"]), f"<sglang {rule['release']} {rule['file']}>", "exec")
    exec(code, namespace)
    setattr(cls, SETTER, namespace[SETTER])
    report("capture-rule", f"{cls.__name__}.{SETTER} replaced by sglang {rule['release']}'s own "
           f"({rule['file']}:{rule['line']})", "to serve the original case's wiring on this runtime: "
           f"runtime {installed_release()}, capture rule {rule['release']}", f"{rule['file']}:{rule['line']}")


def _record_setter(cls) -> None:
    """Log what the setter did: the ids it was given and the capture indices it left on the model."""
    inner = getattr(cls, SETTER)
    if getattr(inner, "_workbook_recorded", False):
        return

    def setter(self, layer_ids=None, *args, **kwargs):
        if _probing:                          # the guard trying ids: no records, no nested judgement
            return inner(self, layer_ids, *args, **kwargs)
        _depth.append(1)
        try:
            out = inner(self, layer_ids, *args, **kwargs)
        finally:
            _depth.pop()
        holder = _capture_holder(self)
        ltc = getattr(holder, "layers_to_capture", None)
        report("layers-to-capture", f"{cls.__name__}.{SETTER}({layer_ids}) -> layers_to_capture {ltc}",
               "the served layout as the live model holds it", "", event="capture",
               ids=None if layer_ids is None else [int(i) for i in layer_ids],
               layers_to_capture=None if ltc is None else [int(i) for i in ltc])
        if not _depth:                         # a wrapper's setter delegating: judged once, outermost
            def set_ids(ids):
                _probing.append(1)
                try:
                    inner(self, ids, *args, **kwargs)
                finally:
                    _probing.pop()

            _guard(self, holder, layer_ids, set_ids)
        return out

    setter._workbook_recorded = True
    setattr(cls, SETTER, setter)


def _capture_holder(model):
    """The module whose forward loop tests ``layers_to_capture`` (``self.model`` for most classes; a
    wrapper such as kimi_k25's keeps it one level further down)."""
    for module in model.modules():
        if hasattr(module, "layers_to_capture") and hasattr(module, "layers"):
            return module
    return getattr(model, "model", None)


class NoServerArgs(RuntimeError):
    """The running SGLang exposes its server arguments through none of the readers this module knows."""


def server_args():
    """The process's ``ServerArgs``, from SGLang's own accessor: ``runtime_context.get_server_args()`` (0.5.23
    on), else the earlier ``server_args.get_global_server_args()``. Raises ``NoServerArgs`` when neither
    answers: a release that moved them again is said, never searched for on the call stack."""
    import importlib

    tried = []
    for module, name in (("sglang.srt.runtime_context", "get_server_args"),
                         ("sglang.srt.server_args", "get_global_server_args")):
        try:
            found = getattr(importlib.import_module(module), name)()
        except Exception as exc:     # noqa: BLE001 - absent, retired (0.5.23's raises) or not yet published
            tried.append(f"{module}.{name}: {type(exc).__name__}")
            continue
        if found is not None:
            return found
        tried.append(f"{module}.{name}: None")
    raise NoServerArgs(f"sglang {installed_release()} exposes no server args to read the draft path from "
                       f"({'; '.join(tried)})")


def _draft_path():
    """The draft the launch serves: ``speculative_draft_model_path`` of the server args SGLang publishes
    (None in capture-only launches, which have no draft)."""
    return getattr(server_args(), "speculative_draft_model_path", None) or None


def _feeds_draft(model, holder) -> bool:
    """False on a pipeline rank before the last: SGLang's setter returns there without capturing
    (``if not self.pp_group.is_last_rank: return``, deepseek_v2.py:3459-3460 in 0.5.23), so an empty
    ``layers_to_capture`` on that rank is correct, not miswired."""
    for obj in (model, holder):
        pp = getattr(obj, "pp_group", None)
        if pp is not None and hasattr(pp, "is_last_rank"):
            return bool(pp.is_last_rank)
    return True


def _boundary0_hazard(holder) -> dict[int, str]:
    """{0: what serving boundary 0 needs} when the live forward adds a residual that is still None at the
    capture before layer 0 (SGLang releases before the fix; the original case's crash)."""
    import inspect

    from helpers.live import guard

    try:
        source = inspect.getsource(type(holder).forward)
    except (OSError, TypeError):
        return {}
    if not guard.adds_unset_residual(source, "layers_to_capture"):
        return {}
    release = installed_release()
    return {0: f"boundary 0 crashes {type(holder).__name__}.forward on sglang {release} (it adds a residual "
               f"that is still None before layer 0): first python -m helpers patch-sglang apply --version "
               f"{release} --target installed"}


def _guard(model, holder, layer_ids, set_ids) -> None:
    """``EAGLE3_WORKBOOK_GUARD``: judge the live capture against what the draft was trained on
    (``helpers.live.guard``); refusing raises inside the scheduler, so SGLang stops before serving. Every way
    it cannot judge (no server args, no holder with ``layers_to_capture``) goes through the guard's one
    unjudged path: ``refuse`` stops the launch with one line, ``warn`` starts."""
    from helpers.live import guard

    how = guard.mode()
    if how is guard.Mode.OFF:
        return

    def logged(row: dict) -> None:
        report("guard", row["line"], "EAGLE3_WORKBOOK_GUARD=" + row["mode"], "", event="guard", verdict=row)

    draft = None
    try:
        draft = _draft_path()
        if draft is None:
            return                          # a capture-only launch: no draft to judge
        if holder is None or getattr(holder, "layers_to_capture", None) is None:
            raise RuntimeError(f"{type(model).__name__}.{SETTER} left no layers_to_capture on any module "
                               f"(sglang {installed_release()} keeps the capture elsewhere)")
        layers = getattr(holder, "layers", None)
        num_layers = len(layers) if layers is not None else int(model.config.num_hidden_layers)
        rule = _rule_cache[0] if _rule_cache else None
        hazards, feeds = _boundary0_hazard(holder), _feeds_draft(model, holder)
    except Exception as exc:     # noqa: BLE001 - one path for every way the guard cannot judge
        guard.cannot_judge(how, draft, exc, logged, engine=f"sglang {installed_release()}")
        return
    # the loop tests i in layers_to_capture at the entry of layer i only (deepseek_v2.py:3194 in 0.5.23)
    guard.at_load(family="sglang", version=installed_release(), draft=draft, holder=holder,
                  attr="layers_to_capture",
                  highest=num_layers - 1, ids=layer_ids, set_ids=set_ids,
                  ids_key="eagle_config.eagle_aux_hidden_state_layer_ids", hazards=hazards,
                  feeds_draft=feeds, arch=type(model).__name__,
                  rules_release=rule["release"] if rule else None, report=logged)


def _probe_draft(cls) -> None:
    """Save the fused features the EAGLE-3 draft's ``fc`` receives (one file per row count, the
    latest kept), so the workbook can tell which boundaries the live engine concatenated."""
    folder = os.environ.get(PROBE_ENV)
    init = cls.__init__
    if not folder or getattr(init, "_workbook_probe", False):
        return

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        fc = getattr(getattr(self, "model", None), "fc", None)
        if fc is None:
            return
        import torch

        def save(_module, inputs):
            x = inputs[0] if inputs else None
            if isinstance(x, torch.Tensor) and x.dim() == 2 and x.shape[0] >= 8:
                tmp = os.path.join(folder, f".fc-{x.shape[0]}.pt.tmp")
                torch.save(x.detach().float().cpu().clone(), tmp)
                os.replace(tmp, os.path.join(folder, f"fc-{x.shape[0]}.pt"))

        fc.register_forward_pre_hook(save)
        report("fc-probe", f"{cls.__name__}.model.fc inputs saved to {folder}",
               "measures which boundaries the live engine feeds the draft", "srt/models/llama_eagle3.py:247")

    __init__._workbook_probe = True
    cls.__init__ = __init__


_rule_cache: list = []
_handled: set = set()


def on_resolved(cls) -> None:
    """Each model class SGLang resolves, once: the capture rule is installed on the target class it names,
    the setter is wrapped to record and judge, and an EAGLE-3 draft gets the fc probe."""
    if cls in _handled:
        return
    _handled.add(cls)
    if not _rule_cache:
        _rule_cache.append(_load_rule())
    rule = _rule_cache[0]
    if rule is not None and cls.__name__ == rule["arch"]:
        _install_rule(cls, rule)
    if hasattr(cls, SETTER):
        _record_setter(cls)
    if cls.__name__.endswith("Eagle3"):
        _probe_draft(cls)


def around_resolve(original, *args, **kwargs):
    """``_ModelRegistry.resolve_model_cls`` wrapped (an AROUND hook in SGLang's ``HookRegistry`` terms)."""
    cls, arch = original(*args, **kwargs)
    on_resolved(cls)
    return cls, arch


around_resolve._workbook_hook = True


def is_wrapped(registry_cls) -> bool:
    """Whether ``resolve_model_cls`` already passes through ``around_resolve`` (however it was installed)."""
    fn = registry_cls.resolve_model_cls
    while fn is not None:
        if getattr(fn, "_workbook_hook", False):
            return True
        fn = getattr(fn, "__wrapped__", None)
    return False


def wrap_registry(module) -> None:
    """Wrap the registry class directly (the fallback, and the CPU launches' sitecustomize)."""
    registry_cls = type(module.ModelRegistry)
    if is_wrapped(registry_cls):
        return
    resolve = registry_cls.resolve_model_cls

    def resolve_model_cls(self, architectures, *args, **kwargs):
        return around_resolve(resolve, self, architectures, *args, **kwargs)

    resolve_model_cls._workbook_hook = True
    resolve_model_cls.__wrapped__ = resolve
    registry_cls.resolve_model_cls = resolve_model_cls


def install_watch() -> None:
    """Wrap the registry when it is imported (or now, if it already was): no release-specific name but the
    registry and the setter every EAGLE-3 release has."""
    if REGISTRY in sys.modules:
        wrap_registry(sys.modules[REGISTRY])
    else:
        watch(REGISTRY, after=wrap_registry)


def installed_release() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "none"
