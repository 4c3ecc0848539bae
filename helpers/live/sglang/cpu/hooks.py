"""Import-time hooks inside SGLang's processes: the accommodations that cannot be flags.

Installed by ``site/sitecustomize.py`` in every interpreter of a workbook launch (launcher, scheduler,
detokenizer), this module watches a few SGLang modules and adjusts them right after they execute,
before any other module binds their names, so no SGLang file is edited. Each adjustment appends one
record (name, what, why, where) to the report file the engine reads back into the run's record.

With ``EAGLE3_WORKBOOK_SGLANG_HOOKS=cpu`` all hooks apply; with ``rules`` (a CUDA host) only the
capture-rule override and the capture records; with it unset and ``EAGLE3_WORKBOOK_GUARD`` set (a user's
own deployment), only the capture record and the guard. Everything here names private symbols of sglang 0.5.23
(line numbers below are that wheel's), so ``install`` refuses any other release.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import os
import sys
import textwrap

from . import HOOKS_ENV, PROBE_ENV, RELEASE, REPORT_ENV, RULE_ENV

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
    with open(path, "a") as f:
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


# --------------------------------------------------------------------------- the hooks


def _torchvision_schemas() -> None:
    """PyPI's torchvision is a CUDA build; beside torch 2.13.0+cpu its ops library does not load, and its
    ``_meta_registrations.py:163`` then fails registering fakes for ops that do not exist. SGLang imports
    it from ``srt/configs/nano_nemotron_vl.py:22`` but never calls nms; defining the two schemas lets the
    import finish."""
    import torch

    try:
        torch.ops.torchvision.nms  # noqa: B018 - a loaded ops library already defines them
        return
    except (AttributeError, RuntimeError):
        pass
    lib = torch.library.Library("torchvision", "DEF")
    for op in ("nms", "qnms"):
        lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
    _KEEP.append(lib)
    report("torchvision-schemas", "defined torchvision::nms and torchvision::qnms (schemas only)",
           "PyPI's torchvision is a CUDA build whose import fails beside CPU torch without them",
           "torchvision/_meta_registrations.py:163 via srt/configs/nano_nemotron_vl.py:22")


_KEEP: list = []


def _amx(module) -> None:
    """The only reader of ``has_amx`` that matters here is the server-args pass that rewrites
    ``--attention-backend intel_amx`` to torch_native on a CPU without AMX; the intel_amx backend's two
    ops come from the stand-in, which needs no AMX. Direct ``cpu_has_amx_support()`` checks (AMX GEMM
    and MoE kernels) stay False, so layers keep their native torch paths."""
    module.override_platform(has_amx=True).install()
    report("amx-reported", "get_platform().has_amx reads True (platform override; cpu_has_amx_support() "
           "itself unchanged)", "otherwise --attention-backend intel_amx falls back to torch_native, which "
           "EAGLE rejects", "srt/arg_groups/overrides.py:1301-1310, srt/runtime_context.py:1838")


def _rope(module) -> None:
    """``get_rope_cpu`` asserts a yarn ``rope_scaling``; a target with default rope takes the generic
    ``get_rope`` instead, whose ``forward_cpu`` falls back to the native rotation."""
    original = module.get_rope_cpu
    generic = module.get_rope
    reported = []

    def get_rope_cpu(head_size, rotary_dim, max_position, base, is_neox_style=True, rope_scaling=None,
                     dtype=None, partial_rotary_factor=1.0, device=None):
        if rope_scaling is None:
            if not reported:
                reported.append(1)
                report("default-rope", "a default-rope target takes get_rope instead of get_rope_cpu",
                       "get_rope_cpu accepts only deepseek_yarn scaling",
                       "srt/layers/rotary_embedding/factory.py:478")
            return generic(head_size, rotary_dim, max_position, base, is_neox_style, rope_scaling, dtype,
                           partial_rotary_factor)
        return original(head_size, rotary_dim, max_position, base, is_neox_style, rope_scaling, dtype,
                        partial_rotary_factor, device)

    module.get_rope_cpu = get_rope_cpu


def _load_rule() -> dict | None:
    path = os.environ.get(RULE_ENV)
    if not path:
        return None
    with open(path) as f:
        return json.load(f)


def _install_rule(cls, rule: dict) -> None:
    """Compile the named release's own setter (text read from its wheel by the workbook) in the live
    model module's namespace and make it the class's method: the id-to-layer rule of that release, with
    this runtime's capture machinery (0.5.23 captures index v as boundary v at any v)."""
    namespace = dict(vars(sys.modules[cls.__module__]))
    code = compile(textwrap.dedent(rule["source"]), f"<sglang {rule['release']} {rule['file']}>", "exec")
    exec(code, namespace)
    setattr(cls, SETTER, namespace[SETTER])
    report("capture-rule", f"{cls.__name__}.{SETTER} replaced by sglang {rule['release']}'s own "
           f"({rule['file']}:{rule['line']})", "to serve the original case's wiring on this runtime: "
           f"runtime {RELEASE}, capture rule {rule['release']}", f"{rule['file']}:{rule['line']}")


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
        if ltc is not None and not _depth:     # a wrapper's setter delegating: judged once, outermost
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


def _draft_path():
    """The draft the launch serves, from the ``server_args`` of the model runner that called the setter
    (every release keeps them there); None in capture-only launches, which have no draft."""
    frame = sys._getframe(2)
    while frame is not None:
        for name in ("self", "model_runner", "server_args"):
            obj = frame.f_locals.get(name)
            args = obj if name == "server_args" else getattr(obj, "server_args", None)
            path = getattr(args, "speculative_draft_model_path", None)
            if path:
                return path
        frame = frame.f_back
    return None


def _guard(model, holder, layer_ids, set_ids) -> None:
    """``EAGLE3_WORKBOOK_GUARD``: judge the live capture against the draft's training record
    (``helpers.live.guard``); refusing raises inside the scheduler, so SGLang stops before serving."""
    from helpers.live import guard

    if guard.mode() is guard.Mode.OFF:
        return
    draft = _draft_path()
    if draft is None:
        return
    layers = getattr(holder, "layers", None)
    num_layers = len(layers) if layers is not None else int(model.config.num_hidden_layers)
    # the loop tests i in layers_to_capture at the entry of layer i only (deepseek_v2.py:3194 in 0.5.23)
    guard.at_load(family="sglang", version=_release(), draft=draft, holder=holder, attr="layers_to_capture",
                  highest=num_layers - 1, ids=layer_ids, set_ids=set_ids,
                  ids_key="eagle_config.eagle_aux_hidden_state_layer_ids",
                  report=lambda row: report("guard", row["line"], "EAGLE3_WORKBOOK_GUARD=" + row["mode"],
                                            "", event="guard", verdict=row))


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


def _registry(module) -> None:
    """Every model class SGLang resolves passes here once: the capture rule is installed on the target
    class it names, the setter is wrapped to record, and an EAGLE-3 draft gets the fc probe."""
    registry_cls = type(module.ModelRegistry)
    resolve = registry_cls.resolve_model_cls
    rule = _load_rule()
    seen = set()

    def resolve_model_cls(self, architectures):
        cls, arch = resolve(self, architectures)
        if cls not in seen:
            seen.add(cls)
            if rule is not None and cls.__name__ == rule["arch"]:
                _install_rule(cls, rule)
            if hasattr(cls, SETTER):
                _record_setter(cls)
            if cls.__name__.endswith("Eagle3"):
                _probe_draft(cls)
        return cls, arch

    registry_cls.resolve_model_cls = resolve_model_cls


def _release() -> str:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return "none"


def install() -> None:
    """Called from sitecustomize. The accommodations (``cpu``) and the capture-rule override (``rules``)
    name private symbols of one release and refuse (exit status 2, one line) any other; the guard alone
    (``EAGLE3_WORKBOOK_GUARD`` with the hooks unset) uses only the model registry and the setter every
    EAGLE-3 release has, so it installs on any release."""
    mode = os.environ.get(HOOKS_ENV, "")
    found = _release()
    if not mode:
        _after.setdefault("sglang.srt.models.registry", []).append(_registry)
        if not any(isinstance(f, _Watcher) for f in sys.meta_path):
            sys.meta_path.insert(0, _Watcher())
        return
    if found != RELEASE:
        sys.stderr.write(f"eagle3-workbook: the SGLang hooks are written for sglang=={RELEASE}; found "
                         f"sglang=={found}\n")
        raise SystemExit(2)
    if mode == "cpu":
        _before.setdefault("torchvision", []).append(_torchvision_schemas)
        _after.setdefault("sglang.srt.runtime_context", []).append(_amx)
        _after.setdefault("sglang.srt.layers.rotary_embedding.factory", []).append(_rope)
    _after.setdefault("sglang.srt.models.registry", []).append(_registry)
    if not any(isinstance(f, _Watcher) for f in sys.meta_path):
        sys.meta_path.insert(0, _Watcher())
