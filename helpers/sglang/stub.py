"""Running a version's own ``set_eagle3_layers_to_capture`` on a stub model."""
from __future__ import annotations

import ast
import builtins
import copy
import sys
import textwrap
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..boundaries import WiringError
from . import classes
from .classes import ClassRef
from .sites import SETTER, CaptureSite, CaptureStyle, SourceLine, dedupe
from .source import SglangSource

# --------------------------------------------------------------------------------------
# Running the version's own setter on a stub.


class _Placeholder:
    """Anything the stub does not model: falsy, callable, absorbs attribute access."""

    def __init__(self, name: str, log: list[str]):
        self._name, self._log = name, log

    def __getattr__(self, name):
        return _Placeholder(f"{self._name}.{name}", self._log)

    def __call__(self, *args, **kwargs):
        self._log.append(f"{self._name}()")
        return _Placeholder(f"{self._name}()", self._log)

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __repr__(self):
        return f"<stub {self._name}>"


class _Globals(dict):
    """Module globals for an extracted function: builtins, typing, else placeholders."""

    def __init__(self, log: list[str]):
        super().__init__()
        self._log = log
        self.update({k: getattr(typing, k) for k in ("Optional", "List", "Dict", "Tuple", "Union", "Any")})

    def __missing__(self, key):
        if key == "__builtins__":
            raise KeyError(key)
        if hasattr(builtins, key):
            return getattr(builtins, key)
        self._log.append(f"global {key}")
        return _Placeholder(key, self._log)


@dataclass
class _StubContext:
    src: SglangSource
    num_layers: int
    config: types.SimpleNamespace
    pp_group: types.SimpleNamespace
    log: list[str] = field(default_factory=list)
    assigned: list[tuple[Any, list]] = field(default_factory=list)
    traced: list[tuple[str, int]] = field(default_factory=list)
    layer_lists: list[list] = field(default_factory=list)  # every stub's self.layers, to read flags


class _StubModule:
    """A model object as the setter sees it: methods come from the version's source."""

    def __init__(self, ctx: _StubContext, cls: ClassRef | None):
        object.__setattr__(self, "_ctx", ctx)
        object.__setattr__(self, "_cls", cls)
        L = ctx.num_layers
        layers = [types.SimpleNamespace(layer_id=i) for i in range(L)]  # setattr-able, like modules
        ctx.layer_lists.append(layers)
        for k, v in dict(config=ctx.config, pp_group=ctx.pp_group, start_layer=0, end_layer=L,
                         layers=layers, layers_to_capture=[], capture_aux_hidden_states=False,
                         num_layers=L).items():
            object.__setattr__(self, k, v)

    def __getattr__(self, name):
        ctx, cls = self._ctx, self._cls
        if cls is not None and not name.startswith("__"):
            found = classes.find_method(ctx.src, cls, name)
            if found is not None:
                return types.MethodType(_compile_method(ctx, found[0], found[1]), self)
            inner = classes.child_class(ctx.src, cls, name)
            if inner is not None:
                child = _StubModule(ctx, inner)
                object.__setattr__(self, name, child)
                return child
        if name.startswith("__") or name.endswith("_layers_to_capture"):
            # a capture setter the class does not define must look absent, as it would to
            # `hasattr(self.model, "set_eagle3_layers_to_capture")` in the real model
            raise AttributeError(name)
        ctx.log.append(f"self.{name}")
        return _Placeholder(f"self.{name}", ctx.log)

    def __setattr__(self, name, value):
        if name == "layers_to_capture":
            self._ctx.assigned.append((self, value))
        object.__setattr__(self, name, value)


def _compile_method(ctx: _StubContext, owner: ClassRef, fn: ast.FunctionDef):
    """Compile one method from source with its real file name and line numbers."""
    node = copy.deepcopy(fn)
    node.decorator_list = []
    node.returns = None
    a = node.args
    for arg in a.posonlyargs + a.args + a.kwonlyargs + [x for x in (a.vararg, a.kwarg) if x]:
        arg.annotation = None
    module = ast.Module(body=[node], type_ignores=[])
    code = compile(module, str(owner.path), "exec")
    namespace = _Globals(ctx.log)
    # the module-level accessors some setters use instead of self.pp_group
    namespace["get_pp_group"] = lambda: ctx.pp_group
    namespace["get_parallel"] = lambda: types.SimpleNamespace(pp_group=ctx.pp_group)
    exec(code, namespace)
    return namespace[fn.name]


@dataclass
class SetterRun:
    layers_to_capture: list[int] | None
    owner: str | None
    executed: list[SourceLine]
    touched: list[str]
    error: str | None = None
    flagged: dict[str, list[int]] = field(default_factory=dict)  # attribute -> layers it was set on
    takes_ids: bool = True  # False: the version's setter has no ids parameter, so draft ids never reach it


def run_setter(src: SglangSource, arch: str, num_layers: int, ids: Sequence[int] | None,
               target_config: dict | None = None) -> SetterRun:
    """Call the version's own ``set_eagle3_layers_to_capture(ids)`` on a stub of ``arch``.

    A single-stage pipeline is modelled (first and last rank); the config carries
    ``num_hidden_layers`` plus whatever the target's config.json provides.
    """
    extra = {k: v for k, v in (target_config or {}).items() if isinstance(k, str)}
    extra["num_hidden_layers"] = num_layers
    # multimodal wrappers read the decoder's depth from config.text_config (gemma4_mm)
    text = extra.get("text_config") if isinstance(extra.get("text_config"), dict) else {}
    extra["text_config"] = types.SimpleNamespace(**{**text, "num_hidden_layers": num_layers})
    ctx = _StubContext(src, num_layers, types.SimpleNamespace(**extra),
                       types.SimpleNamespace(is_first_rank=True, is_last_rank=True, rank_in_group=0,
                                             world_size=1))
    top = classes.class_for_arch(src, arch)
    stub = _StubModule(ctx, top)
    if classes.find_method(src, top, SETTER) is None:
        attr = classes.wrapped_attr(src, top)
        if attr is None:
            return SetterRun(None, None, [], [], f"{arch} has no {SETTER}")
        stub = getattr(stub, attr)
    owner_cls = stub._cls if isinstance(stub, _StubModule) else None
    found = classes.find_method(src, owner_cls, SETTER) if owner_cls is not None else None
    params = found[1].args if found is not None else None
    takes_ids = params is None or len(params.posonlyargs + params.args) > 1 or params.vararg is not None
    files = {}

    def tracer(frame, event, arg):
        fname = frame.f_code.co_filename
        if fname in files or fname.startswith(str(src.root)):
            files.setdefault(fname, None)
            if event == "line":
                ctx.traced.append((fname, frame.f_lineno))
            return tracer
        return None

    error = None
    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        setter = getattr(stub, SETTER)
        if takes_ids:
            setter(list(ids) if ids is not None else None)
        else:
            setter()
    except Exception as exc:  # the version's code rejected the stub or the ids
        error = f"{type(exc).__name__}: {exc}"
    finally:
        sys.settrace(old)
    executed = _executed_lines(src, ctx.traced)
    if error is None and not ctx.assigned:
        error = f"{SETTER} of sglang {src.version} returned without setting layers_to_capture"
    ltc, owner = None, None
    if ctx.assigned:
        holder, value = ctx.assigned[-1]
        ltc = [int(v) for v in value]
        owner = holder._cls.name if holder._cls else None
    flagged: dict[str, set[int]] = {}
    for layers in ctx.layer_lists:
        for layer in layers:
            for k, v in vars(layer).items():
                if k != "layer_id" and v is True:
                    flagged.setdefault(k, set()).add(layer.layer_id)
    return SetterRun(ltc, owner, executed, sorted(set(ctx.log)), error,
                     {k: sorted(v) for k, v in flagged.items()}, takes_ids)


def _executed_lines(src: SglangSource, traced: list[tuple[str, int]]) -> list[SourceLine]:
    out = []
    for fname, line in traced:
        parsed = classes.parse_file(fname)
        out.append(SourceLine(src.rel(fname), line, parsed.line(line).strip()))
    return dedupe(out)


def exec_capture_site(site: CaptureSite, i: int, hidden_states: Any, residual: Any,
                      layers_to_capture: Sequence[int], first_rank: bool = True) -> list:
    """Execute the version's own capture statement once, as the loop would at layer ``i``.

    Only for inline sites. This is how the workbook shows the TypeError at boundary 0
    without importing sglang: the statement text comes from the file, and the rest of
    the loop's world is a handful of plain values.
    """
    if site.style not in (CaptureStyle.INLINE_ADD, CaptureStyle.INLINE_GUARDED,
                          CaptureStyle.INLINE_HIDDEN_ONLY):
        raise WiringError(f"the capture at {site.file}:{site.line} is {site.style}; only inline sites "
                          f"execute")
    code = compile(textwrap.dedent(site.source), site.path, "exec")
    log: list[str] = []
    namespace = _Globals(log)
    aux: list = []
    self_stub = types.SimpleNamespace(
        layers_to_capture=list(layers_to_capture), enable_a2a_moe=False, first_k_dense_replace=0,
        pp_group=types.SimpleNamespace(is_first_rank=first_rank, is_last_rank=True))
    namespace.update(self=self_stub, i=i, hidden_states=hidden_states, residual=residual,
                     aux_hidden_states=aux)
    exec(code, namespace)
    return aux
