"""Which boundaries an engine really serves to an EAGLE-3 draft, read from its own code.

Conventions drift between engine versions (SGLang 0.5.23 changed DeepSeek's id rule, and
moved the capture into the layers), so this module does not keep a table of rules for
SGLang. It finds the version's ``set_eagle3_layers_to_capture`` with ``ast``, runs that very
function on a stub model to learn ``layers_to_capture``, and then reads the forward loop
to decide which of those captures actually happen: a capture index no layer visits is
silently dropped, and one taken before the first layer can meet ``residual = None``.

vLLM is not read from source here; its rule (id = boundary, top-level key first) is the
one recorded in DESIGN.md section 3 for vLLM 0.33.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import copy
import json
import sys
import textwrap
import types
import typing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from helpers.boundaries import (
    CapturePlan,
    WiringError,
    eagle3_default_boundaries,
    layout_label,
)
from helpers import sglang_source as ss
from helpers.sglang_source import ClassRef, ParsedFile, SglangSource

SETTER = "set_eagle3_layers_to_capture"
IDS_KEY = "eagle_aux_hidden_state_layer_ids"
DEFAULT_ENGINES = ("sglang==0.5.9", "sglang==0.5.23", "vllm")


# --------------------------------------------------------------------------------------
# What the inspector returns.


@dataclass
class SourceLine:
    """One line of engine source, cited by its path inside the distribution."""

    file: str
    line: int
    text: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SetterSite:
    """A ``set_eagle3_layers_to_capture`` definition on the path from the architecture."""

    cls: str
    file: str
    path: str
    line: int
    end_line: int
    source: str
    delegates_to: str | None = None  # "language_model" when it hands the ids on
    last_rank_only: bool = False  # returns early unless pp_group.is_last_rank


@dataclass
class CaptureSite:
    """Where the forward loop of the model class appends to the aux hidden states.

    ``style`` is ``inline-add`` (the loop itself evaluates ``hidden_states + residual``,
    unguarded at i == 0), ``inline-guarded`` (same, but the missing residual is handled),
    ``delegated`` (the loop hands a collector to the layer, whose boundary code captures
    the residual stream itself) or ``unknown``.
    """

    cls: str
    file: str
    path: str
    line: int
    end_line: int
    source: str
    style: str
    loop_line: int
    loop_text: str
    loop_range: tuple[str, str] | None = None
    residual_none: SourceLine | None = None
    first_rank: SourceLine | None = None
    unguarded_add: SourceLine | None = None
    post_loop: list[SourceLine] = field(default_factory=list)
    post_loop_exprs: list[str] = field(default_factory=list)  # e.g. 'self.end_layer'
    handler: list[SourceLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def boundary0_hazard(self) -> bool:
        """True when capturing before layer 0 on the first PP rank raises TypeError."""
        return self.unguarded_add is not None and self.residual_none is not None


@dataclass
class ModelWiring:
    """The capture machinery of one architecture in one SGLang version."""

    version: str
    arch: str
    entry_file: str
    entry_class: str
    chain: list[str]
    setters: list[SetterSite]
    capture: CaptureSite | None
    owner: str | None
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def boundary0_capturable(self) -> bool:
        return self.capture is not None and not self.capture.boundary0_hazard and \
            self.capture.style != "unknown"

    def source_lines(self) -> list[SourceLine]:
        out: list[SourceLine] = []
        for s in self.setters:
            out.append(SourceLine(s.file, s.line, s.source.splitlines()[0] if s.source else ""))
        c = self.capture
        if c is not None:
            out.append(SourceLine(c.file, c.loop_line, c.loop_text))
            out.append(SourceLine(c.file, c.line, ss.parse_file(c.path).line(c.line).strip()))
            out.extend(x for x in (c.unguarded_add, c.first_rank, c.residual_none) if x)
            out.extend(c.post_loop)
            out.extend(c.handler)
        return _dedupe(out)

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.capture is not None:
            d["capture"]["boundary0_hazard"] = self.capture.boundary0_hazard
        d["boundary0_capturable"] = self.boundary0_capturable
        return d


def _dedupe(lines: list[SourceLine]) -> list[SourceLine]:
    seen, out = set(), []
    for ln in lines:
        key = (ln.file, ln.line)
        if key not in seen:
            seen.add(key)
            out.append(ln)
    return out


# --------------------------------------------------------------------------------------
# The inspector.


def inspect_model(arch: str, version: str | None = None, *, source: SglangSource | None = None,
                  root: str | Path | None = None) -> ModelWiring:
    """Locate the setter chain and the forward-loop capture site for ``arch``."""
    src = source or ss.get_source(version, root=root)
    top = ss.class_for_arch(src, arch)
    chain, setters, errors, notes = [top.name], [], [], []
    cls = top
    found = ss.find_method(src, cls, SETTER)
    if found is None:
        attr = ss.wrapped_attr(src, cls)
        inner = ss.child_class(src, cls, attr) if attr else None
        errors.append(
            f"{top.name} defines no {SETTER} in sglang {src.version}: SGLang cannot enable EAGLE3 "
            f"aux capture for it" + (f" (the wrapped self.{attr} is {inner.name}; shown below)" if inner else ""))
        if inner is None:
            return ModelWiring(src.version, arch, src.rel(top.path), top.name, chain, [], None, None, errors)
        cls = inner
        chain.append(f"{attr}:{inner.name}")
    owner = _follow_setters(src, cls, setters, chain, notes)
    capture = None
    if owner is None:
        errors.append(f"could not tell which model class receives layers_to_capture in sglang {src.version}")
    else:
        fwd = ss.find_method(src, owner, "forward")
        if fwd is None:
            errors.append(f"{owner.name} has no forward method in sglang {src.version}")
        else:
            capture = analyse_forward(src, fwd[0], fwd[1])
            if capture is None:
                errors.append(f"no `i in self.layers_to_capture` loop found in {fwd[0].name}.forward "
                              f"({src.rel(fwd[0].path)})")
    return ModelWiring(src.version, arch, src.rel(top.path), top.name, chain, setters, capture,
                       owner.name if owner else None, errors, notes)


def _follow_setters(src: SglangSource, cls: ClassRef, setters: list[SetterSite], chain: list[str],
                    notes: list[str]) -> ClassRef | None:
    """Walk setter -> inner setter until one assigns ``layers_to_capture``; return its owner."""
    for _ in range(5):
        found = ss.find_method(src, cls, SETTER)
        if found is None:
            return None
        owner_cls, fn = found
        parsed = ss.parse_file(owner_cls.path)
        delegate = _delegated_attr(fn)
        site = SetterSite(owner_cls.name, src.rel(owner_cls.path), str(owner_cls.path), fn.lineno,
                          fn.end_lineno or fn.lineno, parsed.segment(fn), delegate, _last_rank_only(fn))
        setters.append(site)
        if site.last_rank_only:
            notes.append(f"{owner_cls.name}.{SETTER} returns early unless pp_group.is_last_rank: with "
                         f"pipeline parallelism only the last stage gets layers_to_capture")
        target = _capture_target(fn)
        if target == "self":
            return cls
        if target is not None:
            return ss.child_class(src, cls, target)
        if delegate is None:
            return None
        inner = ss.child_class(src, cls, delegate)
        if inner is None:
            return None
        chain.append(f"{delegate}:{inner.name}")
        cls = inner
    return None


def _delegated_attr(fn: ast.FunctionDef) -> str | None:
    for node in ast.walk(fn):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == SETTER
                and isinstance(node.func.value, ast.Attribute)
                and isinstance(node.func.value.value, ast.Name) and node.func.value.value.id == "self"):
            return node.func.value.attr
    return None


def _capture_target(fn: ast.FunctionDef) -> str | None:
    """'model' for ``self.model.layers_to_capture = ...``, 'self' for ``self.layers_to_capture``."""
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Attribute) and t.attr == "layers_to_capture":
                    base = t.value
                    if isinstance(base, ast.Name) and base.id == "self":
                        return "self"
                    if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
                        return base.attr
    return None


def _last_rank_only(fn: ast.FunctionDef) -> bool:
    for node in fn.body[:3]:
        if isinstance(node, ast.If) and "is_last_rank" in ast.unparse(node.test) and \
                any(isinstance(b, ast.Return) for b in node.body):
            return True
    return False


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    out = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            out[child] = node
    return out


def _is_capture_test(node: ast.AST) -> bool:
    return (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In)
            and isinstance(node.comparators[0], ast.Attribute)
            and node.comparators[0].attr == "layers_to_capture")


def analyse_forward(src: SglangSource, cls: ClassRef, fn: ast.FunctionDef) -> CaptureSite | None:
    """Classify the capture in the forward loop and find what boundary 0 depends on."""
    parsed = ss.parse_file(cls.path)
    parents = _parents(fn)
    loop, test = _capture_loop(fn)
    if loop is None:
        return None
    rel = src.rel(cls.path)
    loop_var = loop.target.id if isinstance(loop.target, ast.Name) else None
    stmt = _enclosing_statement(test, parents)
    site = CaptureSite(cls.name, rel, str(cls.path), test.lineno, stmt.end_lineno or stmt.lineno,
                       parsed.segment(stmt), "unknown", loop.lineno, parsed.line(loop.lineno).strip(),
                       _range_args(loop))
    parent = parents.get(test)
    if isinstance(parent, ast.If) and parent.test is test or isinstance(parent, ast.BoolOp):
        if_node = parent if isinstance(parent, ast.If) else _enclosing(parent, parents, ast.If)
        adds, guarded = [], []
        _scan_capture_body(if_node.body, loop_var, adds, guarded)
        if adds:
            site.style = "inline-add"
            site.unguarded_add = SourceLine(rel, adds[0].lineno, parsed.line(adds[0].lineno).strip())
        else:
            site.style = "inline-guarded"
    elif isinstance(parent, ast.IfExp) and isinstance(parents.get(parent), ast.keyword):
        site.style = "delegated"
        kw = parents[parent].arg
        site.notes.append(f"the loop passes the collector to the layer as `{kw}=`; the layer's boundary "
                          f"code captures the residual stream itself, so no `hidden_states + residual` "
                          f"is evaluated in {rel}")
        site.handler = _boundary_handlers(src)
        if not site.handler:
            site.notes.append("could not find where the layer code handles the missing residual "
                              "before the first layer; boundary 0 is not verified")
            site.style = "unknown"
    _find_residual_none(fn, parents, parsed, rel, site)
    for n in ast.walk(fn):
        if _is_capture_test(n) and not _inside(n, loop, parents):
            site.post_loop.append(SourceLine(rel, n.lineno, parsed.line(n.lineno).strip()))
            site.post_loop_exprs.append(ast.unparse(n.left))
    _loop_notes(fn, loop, site, parsed)
    return site


def _capture_loop(fn: ast.FunctionDef) -> tuple[ast.For | None, ast.Compare | None]:
    for node in ast.walk(fn):
        if isinstance(node, ast.For):
            for inner in ast.walk(node):
                if _is_capture_test(inner):
                    left = inner.left
                    if isinstance(node.target, ast.Name) and isinstance(left, ast.Name) and \
                            left.id == node.target.id:
                        return node, inner
    return None, None


def _range_args(loop: ast.For) -> tuple[str, str] | None:
    it = loop.iter
    if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range" and len(it.args) == 2:
        return ast.unparse(it.args[0]), ast.unparse(it.args[1])
    return None


def _enclosing_statement(node: ast.AST, parents: dict) -> ast.stmt:
    while not isinstance(node, ast.stmt):
        node = parents[node]
    return node


def _enclosing(node: ast.AST, parents: dict, kind: type) -> ast.AST | None:
    while node is not None and not isinstance(node, kind):
        node = parents.get(node)
    return node


def _inside(node: ast.AST, ancestor: ast.AST, parents: dict) -> bool:
    while node is not None:
        if node is ancestor:
            return True
        node = parents.get(node)
    return False


def _mentions(node: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))


def _residual_test(test: ast.expr) -> bool:
    """``residual is None`` / ``residual is not None`` (possibly inside an ``and``)."""
    return any(isinstance(n, ast.Compare) and isinstance(n.left, ast.Name) and n.left.id == "residual"
               and isinstance(n.ops[0], (ast.Is, ast.IsNot)) for n in ast.walk(test))


def _skips_first_layer(test: ast.expr, loop_var: str | None) -> bool:
    """A branch test that is false at i == 0 (``... and i > first_k_dense_replace``)."""
    conjuncts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) else [test]
    for c in conjuncts:
        if (isinstance(c, ast.Compare) and isinstance(c.left, ast.Name) and c.left.id == loop_var
                and isinstance(c.ops[0], ast.Gt)):
            return True  # layer counts are non-negative, so i > k excludes i == 0
    return False


def _scan_capture_body(stmts: list[ast.stmt], loop_var: str | None, adds: list, guarded: list) -> None:
    """Collect ``... + residual`` reachable at i == 0 without a residual-None guard."""
    for stmt in stmts:
        if isinstance(stmt, ast.If):
            if _residual_test(stmt.test):
                guarded.append(stmt)
                continue
            if not _skips_first_layer(stmt.test, loop_var):
                _scan_capture_body(stmt.body, loop_var, adds, guarded)
            _scan_capture_body(stmt.orelse, loop_var, adds, guarded)
            continue
        _scan_expr(stmt, adds, guarded)


def _scan_expr(node: ast.AST, adds: list, guarded: list) -> None:
    if isinstance(node, ast.IfExp) and _residual_test(node.test):
        guarded.append(node)
        return
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and \
            (_mentions(node.left, "residual") or _mentions(node.right, "residual")):
        adds.append(node)
        return
    for child in ast.iter_child_nodes(node):
        _scan_expr(child, adds, guarded)


def _find_residual_none(fn: ast.FunctionDef, parents: dict, parsed: ParsedFile, rel: str,
                        site: CaptureSite) -> None:
    for node in ast.walk(fn):
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "residual"
                                                 for t in node.targets)
                and isinstance(node.value, ast.Constant) and node.value.value is None):
            site.residual_none = SourceLine(rel, node.lineno, parsed.line(node.lineno).strip())
            branch = _enclosing(parents.get(node), parents, ast.If)
            if branch is not None and "is_first_rank" in ast.unparse(branch.test):
                site.first_rank = SourceLine(rel, branch.lineno, parsed.line(branch.lineno).strip())
            return


def _boundary_handlers(src: SglangSource) -> list[SourceLine]:
    """Lines of the layer-boundary code (0.5.23+) that deal with 'no residual yet'.

    Two places matter: the capture callback path (``capture=``, used by Llama/Qwen), which
    captures the input alone when the stream has no residual, and the stage input path
    (``enters_stack``), which starts the residual from the embedding so that a collector
    reading the residual after it (``capture_gathered``, used by DeepSeek) gets boundary 0.
    """
    out = []
    folder = src.package_dir / "srt" / "layers" / "layer_boundary"
    for path in sorted(folder.glob("*.py")) if folder.is_dir() else []:
        text = ss._safe_read(path)
        if "residual is None" not in text:
            continue
        parsed = ss.parse_file(path)
        for node in ast.walk(parsed.tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            argnames = [a.arg for a in node.args.args + node.args.kwonlyargs]
            if not any(a.startswith("capture") or a == "enters_stack" for a in argnames):
                continue
            for n in ast.walk(node):
                if isinstance(n, ast.Compare) and "residual is None" in ast.unparse(n):
                    out.append(SourceLine(src.rel(path), n.lineno, parsed.line(n.lineno).strip()))
    return sorted(_dedupe(out), key=lambda ln: (ln.file, ln.line))


def _loop_notes(fn: ast.FunctionDef, loop: ast.For, site: CaptureSite, parsed: ParsedFile) -> None:
    text = parsed.segment(fn)
    if site.loop_range and site.loop_range != ("self.start_layer", "self.end_layer") and "can_run_tbo" in text:
        site.notes.append(f"the capture loop runs over {site.loop_range}; with two-batch overlap "
                          f"(forward_batch.can_run_tbo) it stops at first_k_dense_replace and later "
                          f"layers run without capture")
    if "AuxHiddenStatePacker(len(self.layers_to_capture))" in text:
        site.notes.append("captures go into AuxHiddenStatePacker(len(layers_to_capture)); a capture "
                          "index no layer visits makes finalize() raise 'captured k of n'")


def exec_capture_site(site: CaptureSite, i: int, hidden_states: Any, residual: Any,
                      layers_to_capture: Sequence[int], first_rank: bool = True) -> list:
    """Execute the version's own capture statement once, as the loop would at layer ``i``.

    Only for inline sites. This is how the workbook shows the TypeError at boundary 0
    without importing sglang: the statement text comes from the file, and the rest of
    the loop's world is a handful of plain values.
    """
    if site.style not in ("inline-add", "inline-guarded"):
        raise WiringError(f"the capture at {site.file}:{site.line} is {site.style}; only inline sites execute")
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


class _StubModule:
    """A model object as the setter sees it: methods come from the version's source."""

    def __init__(self, ctx: _StubContext, cls: ClassRef | None):
        object.__setattr__(self, "_ctx", ctx)
        object.__setattr__(self, "_cls", cls)
        L = ctx.num_layers
        layers = [types.SimpleNamespace(layer_id=i) for i in range(L)]  # setattr-able, like modules
        for k, v in dict(config=ctx.config, pp_group=ctx.pp_group, start_layer=0, end_layer=L,
                         layers=layers, layers_to_capture=[], capture_aux_hidden_states=False,
                         num_layers=L).items():
            object.__setattr__(self, k, v)

    def __getattr__(self, name):
        ctx, cls = self._ctx, self._cls
        if cls is not None and not name.startswith("__"):
            found = ss.find_method(ctx.src, cls, name)
            if found is not None:
                return types.MethodType(_compile_method(ctx, found[0], found[1]), self)
            inner = ss.child_class(ctx.src, cls, name)
            if inner is not None:
                child = _StubModule(ctx, inner)
                object.__setattr__(self, name, child)
                return child
        if name.startswith("__"):
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


def run_setter(src: SglangSource, arch: str, num_layers: int, ids: Sequence[int] | None,
               target_config: dict | None = None) -> SetterRun:
    """Call the version's own ``set_eagle3_layers_to_capture(ids)`` on a stub of ``arch``.

    A single-stage pipeline is modelled (first and last rank); the config carries
    ``num_hidden_layers`` plus whatever the target's config.json provides.
    """
    extra = {k: v for k, v in (target_config or {}).items() if isinstance(k, str)}
    extra["num_hidden_layers"] = num_layers
    ctx = _StubContext(src, num_layers, types.SimpleNamespace(**extra),
                       types.SimpleNamespace(is_first_rank=True, is_last_rank=True, rank_in_group=0,
                                             world_size=1))
    top = ss.class_for_arch(src, arch)
    stub = _StubModule(ctx, top)
    if ss.find_method(src, top, SETTER) is None:
        attr = ss.wrapped_attr(src, top)
        if attr is None:
            return SetterRun(None, None, [], [], f"{arch} has no {SETTER}")
        stub = getattr(stub, attr)
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
        getattr(stub, SETTER)(list(ids) if ids is not None else None)
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
    return SetterRun(ltc, owner, executed, sorted(set(ctx.log)), error)


def _executed_lines(src: SglangSource, traced: list[tuple[str, int]]) -> list[SourceLine]:
    out = []
    for fname, line in traced:
        parsed = ss.parse_file(fname)
        out.append(SourceLine(src.rel(fname), line, parsed.line(line).strip()))
    return _dedupe(out)


# --------------------------------------------------------------------------------------
# Draft configs and where each engine reads ids from.


def load_draft_config(draft: str | Path | dict) -> dict:
    """A draft's config.json as a dict, from a dict, a checkpoint folder or the file itself."""
    if isinstance(draft, dict):
        return draft
    path = Path(draft)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise WiringError(f"draft folder {draft} has no config.json")
    elif not path.is_file():
        raise WiringError(f"draft {draft} not found (expected a checkpoint folder or its config.json)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise WiringError(f"cannot read draft config {path}: {exc}") from None


@dataclass
class DraftIds:
    ids: list[int] | None
    source: str  # "eagle_config" | "top-level" | "default"
    warnings: list[str]
    lines: list[SourceLine]
    use_aux: bool = True


def sglang_draft_ids(cfg: dict, src: SglangSource | None = None) -> DraftIds:
    """The ids SGLang passes to the setter: only ``eagle_config.eagle_aux_hidden_state_layer_ids``.

    When the version's reading site is available it is cited, and if that code also falls
    back to a top-level key (no released version seen so far does) the fallback is honoured.
    """
    lines, top_level_read = (_sglang_ids_site(src) if src is not None else ([], False))
    warnings: list[str] = []
    nested = cfg.get("eagle_config")
    top = cfg.get(IDS_KEY)
    use_aux = True
    ids, origin = None, "default"
    if isinstance(nested, dict):
        use_aux = bool(nested.get("use_aux_hidden_state", True))
        if nested.get(IDS_KEY) is not None:
            ids, origin = list(nested[IDS_KEY]), "eagle_config"
    if ids is None and top is not None:
        if top_level_read:
            ids, origin = list(top), "top-level"
        else:
            warnings.append(
                f"the draft config has a top-level {IDS_KEY} = {list(top)} (speculators/vLLM format); "
                f"SGLang reads ids only from eagle_config.{IDS_KEY}, so it ignores them and uses its defaults")
    elif ids is not None and top is not None and list(top) != ids:
        warnings.append(f"top-level {IDS_KEY} = {list(top)} differs from eagle_config's {ids}; "
                        f"SGLang uses eagle_config's, vLLM the top-level one")
    if not use_aux:
        warnings.append("eagle_config.use_aux_hidden_state is false: SGLang captures no aux hidden states")
    return DraftIds(ids, origin, warnings, lines, use_aux)


def _sglang_ids_site(src: SglangSource) -> tuple[list[SourceLine], bool]:
    """Where the version reads the draft's ids, and whether that code reads a top-level key."""
    folder = src.package_dir / "srt" / "model_executor"
    lines, top_level = [], False
    for path in sorted(folder.rglob("*.py")) if folder.is_dir() else []:
        if "eagle_config" not in ss._safe_read(path):
            continue
        parsed = ss.parse_file(path)
        for fn in ast.walk(parsed.tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            hits = [n for n in ast.walk(fn) if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)
                    and n.value.id == "eagle_config" and isinstance(n.slice, ast.Constant)
                    and n.slice.value == IDS_KEY]
            if not hits:
                continue
            for n in ast.walk(fn):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr" and \
                        len(n.args) >= 2 and isinstance(n.args[1], ast.Constant):
                    if n.args[1].value == "eagle_config":
                        lines.append(SourceLine(src.rel(path), n.lineno, parsed.line(n.lineno).strip()))
                    elif n.args[1].value == IDS_KEY:
                        top_level = True
            lines.extend(SourceLine(src.rel(path), h.lineno, parsed.line(h.lineno).strip()) for h in hits)
    return _dedupe(lines), top_level


def vllm_draft_ids(cfg: dict) -> DraftIds:
    """vLLM: the top-level key first, then the nested eagle_config one."""
    if cfg.get(IDS_KEY) is not None:
        return DraftIds(list(cfg[IDS_KEY]), "top-level", [], [])
    nested = cfg.get("eagle_config")
    if isinstance(nested, dict) and nested.get(IDS_KEY) is not None:
        return DraftIds(list(nested[IDS_KEY]), "eagle_config", [], [])
    return DraftIds(None, "default", [], [])


# --------------------------------------------------------------------------------------
# The resolver.


@dataclass
class WiringResult:
    """What an engine will feed the draft's fc, and whether it can at all."""

    engine: str
    version: str | None
    arch: str
    num_layers: int
    served_layout: tuple[int, ...]
    layers_to_capture: list[int]
    ids_used: list[int] | None
    ids_source: str
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    source_lines: list[dict] = field(default_factory=list)

    @property
    def capturable(self) -> bool:
        return not self.errors

    @property
    def label(self) -> str:
        return layout_label(self.served_layout, self.num_layers)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["served_layout"] = list(self.served_layout)
        d["capturable"] = self.capturable
        d["label"] = self.label
        return d


def resolve(engine: str, arch: str, num_layers: int, ids: Sequence[int] | None = None,
            draft: str | Path | dict | None = None, *, source: SglangSource | None = None,
            root: str | Path | None = None, target_config: dict | None = None) -> WiringResult:
    """Resolve a draft's ids to the served layout the way ``engine`` itself would.

    ``ids`` are passed as given (``ids_source='explicit'``); otherwise they are read from
    ``draft`` with the engine's own rule; with neither, the engine's defaults apply.
    Problems with the wiring go to ``errors``; malformed input raises WiringError.
    """
    num_layers = _check_num_layers(num_layers)
    name, version = ss.parse_engine(engine)
    if ids is not None and draft is not None:
        raise WiringError("give either explicit ids or a draft config, not both")
    cfg = load_draft_config(draft) if draft is not None else None
    if name == "vllm":
        return _resolve_vllm(version, arch, num_layers, ids, cfg)
    src = source or _sglang_source(version, root)
    if version is not None and src.version not in (version, "unknown"):
        raise WiringError(f"engine asks for sglang {version} but the source given is sglang {src.version}")
    return _resolve_sglang(src, arch, num_layers, ids, cfg, target_config)


def _check_num_layers(num_layers: Any) -> int:
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 3:
        raise WiringError(f"num_layers must be an integer >= 3 (the default ids use L-3), got {num_layers!r}")
    return num_layers


def _check_ids(ids: Sequence[int] | None, num_layers: int, low: int) -> list[int] | None:
    if ids is None:
        return None
    out = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise WiringError(f"layer ids must be integers, got {i!r}")
        if not low <= i <= num_layers:
            raise WiringError(f"layer id {i} is outside {low}..{num_layers} for a target with {num_layers} layers")
        out.append(i)
    if not out:
        raise WiringError("the id list is empty")
    return out


def _sglang_source(version: str | None, root: str | Path | None) -> SglangSource:
    try:
        if root is not None:
            return ss.source_at(root, version)
        if version is None:
            src = ss.installed_sglang()
            if src is None:
                raise WiringError("engine 'sglang' without a version needs an installed sglang; "
                                  "use e.g. 'sglang==0.5.9'")
            return src
        return ss.fetch_sglang(version)
    except ss.UnknownVersionError as exc:
        raise WiringError(str(exc)) from None


def _resolve_vllm(version, arch, num_layers, ids, cfg) -> WiringResult:
    if ids is not None:
        chosen = DraftIds(_check_ids(ids, num_layers, -1), "explicit", [], [])
    elif cfg is not None:
        chosen = vllm_draft_ids(cfg)
        chosen.ids = _check_ids(chosen.ids, num_layers, -1)
    else:
        chosen = DraftIds(None, "default", [], [])
    used = chosen.ids if chosen.ids is not None else list(eagle3_default_boundaries(num_layers))
    errors = [f"vLLM id {i} is not a boundary (0 = embedding output, {num_layers} = final state)"
              for i in used if i < 0]
    if len(set(used)) != len(used):
        errors.append(f"ids {used} repeat a boundary; the draft's fc would get fewer features than slots")
    served = tuple(sorted({i for i in used if 0 <= i <= num_layers}))
    warnings = chosen.warnings + ["vLLM rule from DESIGN.md section 3 (vLLM 0.33: id = boundary, "
                                  "top-level key first, ascending order); not read from vLLM source"]
    return WiringResult("vllm" + (f"=={version}" if version else ""), version, arch, num_layers, served,
                        sorted(used), chosen.ids, "explicit" if ids is not None else chosen.source,
                        errors, warnings, [])


def _resolve_sglang(src, arch, num_layers, ids, cfg, target_config) -> WiringResult:
    try:
        wiring = inspect_model(arch, source=src)
    except ss.UnknownArchitectureError as exc:
        raise WiringError(str(exc)) from None
    warnings, lines = [], []
    if ids is not None:
        chosen = DraftIds(_check_ids(ids, num_layers, -1), "explicit", [], [])
    elif cfg is not None:
        chosen = sglang_draft_ids(cfg, src)
        chosen.ids = _check_ids(chosen.ids, num_layers, -1)
        lines.extend(chosen.lines)
    else:
        chosen = DraftIds(None, "default", [], [])
    warnings.extend(chosen.warnings)
    errors = list(wiring.errors)
    run = run_setter(src, arch, num_layers, chosen.ids, target_config)
    lines.extend(run.executed)
    lines.extend(wiring.source_lines())
    if run.touched:
        warnings.append("the stub supplied placeholders for: " + ", ".join(run.touched))
    if run.error:
        errors.append(f"running sglang {src.version}'s {SETTER} failed: {run.error}")
    ltc = run.layers_to_capture or []
    captured, capture_errors = _captured(ltc, chosen.ids, wiring, num_layers, src)
    errors.extend(capture_errors)
    if not chosen.use_aux:
        errors.append("SGLang will not capture aux hidden states for this draft (use_aux_hidden_state false)")
    return WiringResult(f"sglang=={src.version}", src.version, arch, num_layers, tuple(sorted(captured)),
                        ltc, chosen.ids, chosen.source, errors, warnings, [l.to_dict() for l in _dedupe(lines)])


def _visited(capture: CaptureSite, num_layers: int) -> tuple[set[int], set[int]]:
    """Indices the loop passes (single PP stage: 0..L-1) and extra ones checked after it."""
    inside = set(range(0, num_layers))
    after = set()
    stub_self = types.SimpleNamespace(start_layer=0, end_layer=num_layers, layers=[None] * num_layers,
                                      config=types.SimpleNamespace(num_hidden_layers=num_layers),
                                      num_layers=num_layers)
    for text in capture.post_loop_exprs:
        try:
            value = eval(compile(text, "<post-loop>", "eval"), {"__builtins__": {"len": len}},
                         {"self": stub_self, "num_layers": num_layers})
        except Exception:
            continue  # an expression the stub cannot evaluate: the index is not assumed captured
        if isinstance(value, int):
            after.add(value)
    return inside, after


def _captured(ltc: list[int], ids: list[int] | None, wiring: ModelWiring, num_layers: int,
              src: SglangSource) -> tuple[set[int], list[str]]:
    """Which capture indices happen, and why the others do not."""
    errors: list[str] = []
    capture = wiring.capture
    if capture is None:
        return set(), errors
    inside, after = _visited(capture, num_layers)
    L = num_layers
    where = f"{capture.file}:{capture.loop_line} `{capture.loop_text}`"
    captured = set()
    for k, v in enumerate(ltc):
        src_id = f" (from id {ids[k]})" if ids is not None and k < len(ids) else ""
        if v in inside or v in after:
            captured.add(v)
        elif v == L:
            errors.append(f"capture index {v}{src_id} = boundary {L} (final state before the norm) is never "
                          f"captured by sglang {src.version}: the loop {where} visits 0..{L - 1} and nothing "
                          f"captures after it")
        else:
            errors.append(f"capture index {v}{src_id} matches no layer: the loop {where} visits 0..{L - 1}, "
                          f"so that feature is missing from the concatenation")
    if len(set(ltc)) != len(ltc):
        errors.append(f"layers_to_capture {ltc} repeats an index; each layer is captured once")
    if len(captured) != len(ltc):
        packer = any("AuxHiddenStatePacker" in n for n in capture.notes)
        errors.append(f"the draft's fc expects {len(ltc)} features but sglang {src.version} would "
                      f"concatenate {len(captured)}" + (" (AuxHiddenStatePacker.finalize() raises "
                      f"'captured {len(captured)} of {len(ltc)} aux hidden states')" if packer else ""))
    if 0 in captured and capture.boundary0_hazard:
        add, rn, fr = capture.unguarded_add, capture.residual_none, capture.first_rank
        errors.append(
            f"boundary 0 (embedding output) cannot be captured by unpatched sglang {src.version}: on the first "
            f"pipeline rank `residual` is None before layer 0 ({rn.file}:{rn.line}"
            + (f", under `{fr.text}`" if fr else "") + f") and {add.file}:{add.line} evaluates "
            f"`{add.text}` -> TypeError on the first forward (fix: `python -m helpers patch-sglang apply "
            f"--version {src.version}`)")
    return captured, errors


# --------------------------------------------------------------------------------------
# Conveniences for notebooks.


def served_plan(draft_dir_or_config: str | Path | dict | Sequence[int] | None, num_layers: int, arch: str,
                engine: str = "sglang==0.5.9", *, root: str | Path | None = None, strict: bool = False,
                target_config: dict | None = None) -> CapturePlan:
    """The CapturePlan an engine serves for a draft; errors become notes unless ``strict``."""
    if isinstance(draft_dir_or_config, (list, tuple)):
        result = resolve(engine, arch, num_layers, ids=list(draft_dir_or_config), root=root,
                         target_config=target_config)
    else:
        result = resolve(engine, arch, num_layers, draft=draft_dir_or_config, root=root,
                         target_config=target_config)
    if strict and result.errors:
        raise WiringError("; ".join(result.errors))
    source = (f"{result.engine} {arch}: ids {result.ids_used} ({result.ids_source}) -> "
              f"layers_to_capture {result.layers_to_capture} -> served {result.served_layout}")
    notes = tuple([f"error: {e}" for e in result.errors] + [f"warning: {w}" for w in result.warnings])
    return CapturePlan(layout=result.served_layout, num_layers=num_layers, source=source, notes=notes)


def conventions_table(draft_or_ids: str | Path | dict | Sequence[int] | None, num_layers: int,
                      arch: str | Sequence[str] = ("DeepseekV3ForCausalLM", "LlamaForCausalLM"),
                      engines: Sequence[str] = DEFAULT_ENGINES):
    """One row per engine x architecture: what each would serve for the same draft."""
    import pandas as pd

    archs = [arch] if isinstance(arch, str) else list(arch)
    rows = []
    for engine in engines:
        for a in archs:
            if isinstance(draft_or_ids, (list, tuple)):
                r = resolve(engine, a, num_layers, ids=list(draft_or_ids))
            else:
                r = resolve(engine, a, num_layers, draft=draft_or_ids)
            rows.append({"engine": r.engine, "arch": a, "ids_source": r.ids_source,
                         "ids_used": r.ids_used, "layers_to_capture": r.layers_to_capture,
                         "served_layout": r.served_layout, "label": r.label, "capturable": r.capturable,
                         "errors": "; ".join(r.errors)})
    return pd.DataFrame(rows)


def ids_for_layout(layout: Sequence[int], arch: str, num_layers: int, engine: str = "sglang==0.5.9", *,
                   root: str | Path | None = None) -> list[int] | None:
    """Draft ids that make ``engine`` serve ``layout`` without errors, or None."""
    target = tuple(sorted(layout))
    for candidate in ([b - 1 for b in target], list(target)):
        try:
            r = resolve(engine, arch, num_layers, ids=candidate, root=root)
        except WiringError:
            continue
        if r.served_layout == target and not r.errors:
            return candidate
    return None


# --------------------------------------------------------------------------------------
# CLI.


class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _ArgError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m helpers wiring",
                description="Resolve a draft's layer ids to the boundaries an engine serves.")
    p.add_argument("--engine", default="sglang==0.5.9", help="sglang==VERSION, sglang (installed) or vllm")
    p.add_argument("--arch", help="target architecture, e.g. DeepseekV3ForCausalLM")
    p.add_argument("--layers", type=int, help="number of decoder layers L of the target")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--ids", help="explicit ids, e.g. -1,2,6")
    g.add_argument("--draft", help="draft checkpoint folder (or its config.json)")
    p.add_argument("--target", help="target folder: arch and num_hidden_layers from its config.json")
    p.add_argument("--sglang-root", help="folder holding an sglang/ tree to read instead of the cache")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    return p


def _join_negative_ids(argv: list[str]) -> list[str]:
    """Let '--ids -1,2,6' through argparse, which would take '-1,2,6' for an option."""
    out, i = [], 0
    while i < len(argv):
        if argv[i] == "--ids" and i + 1 < len(argv):
            out.append(f"--ids={argv[i + 1]}")
            i += 2
            continue
        out.append(argv[i])
        i += 1
    return out


def _target_config(folder: str) -> dict:
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise WiringError(f"target folder {folder} has no config.json")
    cfg = json.loads(path.read_text(encoding="utf-8"))
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "architectures": cfg.get("architectures")}
    return cfg


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(p) for p in text.replace(" ", "").split(",") if p]
    except ValueError:
        raise WiringError(f"cannot read ids from {text!r}; expected integers like -1,2,6") from None


def format_report(r: WiringResult) -> str:
    lines = [f"{r.engine}  {r.arch}  L={r.num_layers}",
             f"  ids used          : {r.ids_used} ({r.ids_source})",
             f"  layers_to_capture : {r.layers_to_capture}",
             f"  served layout     : {r.served_layout}  {r.label}",
             f"  capturable        : {'yes' if r.capturable else 'NO'}"]
    lines += [f"  error: {e}" for e in r.errors]
    lines += [f"  warning: {w}" for w in r.warnings]
    if r.source_lines:
        lines.append("  source:")
        lines += [f"    {s['file']}:{s['line']}: {s['text']}" for s in r.source_lines]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: 0 = capturable, 1 = resolved but not capturable, 2 = bad input."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = _parser().parse_args(_join_negative_ids(argv))
        target_cfg = _target_config(args.target) if args.target else None
        arch = args.arch or ((target_cfg or {}).get("architectures") or [None])[0]
        layers = args.layers if args.layers is not None else (target_cfg or {}).get("num_hidden_layers")
        if not arch or layers is None:
            raise WiringError("need --arch and --layers (or --target DIR with a config.json)")
        result = resolve(args.engine, arch, layers, ids=_parse_ids(args.ids) if args.ids else None,
                         draft=args.draft, root=args.sglang_root, target_config=target_cfg)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except (_ArgError, WiringError, ValueError, ss.SglangSourceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_report(result))
    return 0 if result.capturable else 1
