"""Which boundaries an engine really serves to an EAGLE-3 draft, read from its own code.

Conventions drift between engine versions (SGLang 0.5.23 changed DeepSeek's id rule, and
moved the capture into the layers), so this module does not keep a table of rules for
SGLang. It finds the version's ``set_eagle3_layers_to_capture`` with ``ast``, runs that very
function on a stub model to learn ``layers_to_capture``, and then reads the forward loop
to decide which of those captures actually happen: a capture index no layer visits is
silently dropped, and one taken before the first layer can meet ``residual = None``.

vLLM is not read from source here; its rule (id = boundary, top-level key first) is the
one recorded in docs/conventions.md for vLLM 0.33.
"""
from __future__ import annotations

import argparse
import ast
import builtins
import copy
import json
import re
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
from helpers.errors import glue_option_values
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
    ``inline-hidden-only`` (the loop appends ``hidden_states`` alone while the layers hand
    the residual back separately, so past layer 0 the feature is one layer's output branch,
    not a boundary), ``delegated`` (the loop hands a collector to the layer, whose boundary
    code captures the residual stream itself) or ``unknown``.

    Which layers capture is decided either by the loop index (``i in self.layers_to_capture``)
    or, in the Qwen-MoE family, by a per-layer attribute that the setter sets
    (``setattr(self.layers[k], "_is_layer_to_capture", True)``); ``flag`` names that
    attribute, and then ``self.layers[k]`` indexing, negative k included, decides the boundary.
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
    flag: str | None = None  # per-layer attribute tested instead of the index (Qwen-MoE family)
    layer_call: SourceLine | None = None  # where the decoder layer hands the collector on
    split_residual: SourceLine | None = None  # `hidden_states, residual = layer(...)` (hidden-only)

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
            out.extend(x for x in (c.unguarded_add, c.first_rank, c.residual_none, c.split_residual,
                                   c.layer_call) if x)
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
    """Locate the setter chain and the forward-loop capture site for ``arch``.

    Every way this can fail becomes one error that names the reason, because each failure
    means the same thing to the user (this engine version will not serve the draft's ids
    for this architecture) and a pile of follow-on errors would hide which one it is.
    """
    src = source or ss.get_source(version, root=root)
    top = ss.class_for_arch(src, arch)
    chain, setters, errors, notes = [top.name], [], [], []
    cls = top
    found = ss.find_method(src, cls, SETTER)
    if found is None:
        attr = ss.wrapped_attr(src, cls)
        inner = ss.child_class(src, cls, attr) if attr else None
        if inner is None or ss.find_method(src, inner, SETTER) is None:
            who = (f"neither {top.name} ({src.rel(top.path)}) nor the model it wraps (self.{attr} is "
                   f"{inner.name}) defines {SETTER}" if inner else
                   f"{top.name} ({src.rel(top.path)}) defines no {SETTER}")
            errors.append(
                f"{who} in sglang {src.version}: "
                f"SGLang cannot turn on EAGLE3 aux-hidden-state capture for this architecture, so no "
                f"draft ids can be served")
            return ModelWiring(src.version, arch, src.rel(top.path), top.name, chain, [], None, None, errors)
        errors.append(
            f"{top.name} defines no {SETTER} in sglang {src.version}: SGLang cannot enable EAGLE3 "
            f"aux capture for it (the wrapped self.{attr} is {inner.name}; shown below)")
        cls = inner
        chain.append(f"{attr}:{inner.name}")
    owner, why = _follow_setters(src, cls, setters, chain, notes)
    capture = None
    if owner is None:
        errors.append(f"could not tell which model class receives layers_to_capture in sglang "
                      f"{src.version}: {why}")
    else:
        capture, why = _find_capture(src, top, owner)
        if capture is None:
            errors.append(why)
    return ModelWiring(src.version, arch, src.rel(top.path), top.name, chain, setters, capture,
                       owner.name if owner else None, errors, notes)


_DRAFT_HEAD = re.compile(r"Eagle|NextN|MTP|Mtp")


def _find_capture(src: SglangSource, top: ClassRef, owner: ClassRef) -> tuple[CaptureSite | None, str]:
    """The capture site in ``owner``'s forward, following ``super().forward(...)`` hand-offs
    (TeleFLM's forward only scales the embedding, then runs LlamaModel's loop)."""
    fwd = ss.find_method(src, owner, "forward")
    if fwd is None:
        return None, f"{owner.name} has no forward method in sglang {src.version}"
    cls, fn = fwd
    first = cls
    files = [top.path, owner.path] + [b.path for b in ss.linear_bases(src, owner)]
    for _ in range(4):
        site = analyse_forward(src, cls, fn, layer_files=files)
        if site is not None:
            return site, ""
        if not _calls_super_forward(fn):
            break
        base = next((m for b in ss.base_classes(src, cls) if (m := ss.find_method(src, b, "forward"))), None)
        if base is None:
            break
        cls, fn = base
    why = (f"{first.name}.forward ({src.rel(first.path)}) never captures: no loop over the layers tests "
           f"`i in self.layers_to_capture` or a per-layer capture flag, so the ids the setter records "
           f"are never turned into aux hidden states")
    if _DRAFT_HEAD.search(top.name) or re.search(r"_(eagle3?|nextn|mtp)$", top.path.stem):
        why += (f"; {top.name} is a speculative-decoding draft/MTP head that inherits the setter from "
                f"its target class: give the target model's architecture instead")
    return None, why


def _calls_super_forward(fn: ast.FunctionDef) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "forward"
               and isinstance(n.func.value, ast.Call) and isinstance(n.func.value.func, ast.Name)
               and n.func.value.func.id == "super" for n in ast.walk(fn))


def _follow_setters(src: SglangSource, cls: ClassRef, setters: list[SetterSite], chain: list[str],
                    notes: list[str]) -> tuple[ClassRef | None, str]:
    """Walk setter -> inner setter until one assigns ``layers_to_capture``; return its owner.

    A setter that both calls an inner setter and assigns the list as a fallback (Qwen3-VL:
    ``if hasattr(self.model, ...)``) is followed into the inner setter when that exists,
    because that is the branch that runs.
    """
    for _ in range(5):
        found = ss.find_method(src, cls, SETTER)
        if found is None:
            return None, f"{cls.name} has no {SETTER} to receive the ids"
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
        inner = ss.child_class(src, cls, delegate) if delegate is not None else None
        if inner is not None and (target is None or ss.find_method(src, inner, SETTER) is not None):
            chain.append(f"{delegate}:{inner.name}")
            cls = inner
            continue
        if target == "self":
            return cls, ""
        if target is not None:
            child = ss.child_class(src, cls, target)
            if child is None:
                return None, (f"{owner_cls.name}.{SETTER} ({site.file}:{site.line}) assigns "
                              f"self.{target}.layers_to_capture, but the class of self.{target} could "
                              f"not be read from {cls.name}.__init__")
            return child, ""
        if delegate is not None:
            return None, (f"{owner_cls.name}.{SETTER} ({site.file}:{site.line}) hands the ids to "
                          f"self.{delegate}, whose class could not be read from {cls.name}.__init__")
        return None, (f"{owner_cls.name}.{SETTER} ({site.file}:{site.line}) neither assigns "
                      f"layers_to_capture nor hands the ids to an inner model")
    return None, f"{SETTER} hands the ids on more than 5 times"


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


def _flag_test(node: ast.AST) -> str | None:
    """The attribute name in ``getattr(layer, "_is_layer_to_capture", False)``, else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str) and "capture" in node.args[1].value):
        return node.args[1].value
    return None


def analyse_forward(src: SglangSource, cls: ClassRef, fn: ast.FunctionDef,
                    layer_files: Sequence[Path] = ()) -> CaptureSite | None:
    """Classify the capture in the forward loop and find what boundary 0 depends on.

    ``layer_files`` are where to look for the decoder layer class when the loop hands the
    collector to the layer (the architecture's own file first: Qwen3-MoE runs Qwen2-MoE's
    loop over its own Qwen3MoeDecoderLayer).
    """
    parsed = ss.parse_file(cls.path)
    parents = _parents(fn)
    loop, test, flag = _capture_loop(fn)
    if loop is None:
        return None
    rel = src.rel(cls.path)
    loop_var = _loop_var(loop)
    stmt = _enclosing_statement(test, parents)
    site = CaptureSite(cls.name, rel, str(cls.path), test.lineno, stmt.end_lineno or stmt.lineno,
                       parsed.segment(stmt), "unknown", loop.lineno, parsed.line(loop.lineno).strip(),
                       _range_args(loop), flag=flag)
    parent = parents.get(test)
    if isinstance(parent, ast.If) and parent.test is test or isinstance(parent, ast.BoolOp):
        if_node = parent if isinstance(parent, ast.If) else _enclosing(parent, parents, ast.If)
        adds, guarded = [], []
        _scan_capture_body(if_node.body, loop_var, adds, guarded)
        split = _split_residual(loop)
        if adds:
            site.style = "inline-add"
            site.unguarded_add = SourceLine(rel, adds[0].lineno, parsed.line(adds[0].lineno).strip())
        elif not guarded and split is not None and not any(_mentions(v, "residual")
                                                           for v in _appended(if_node.body)):
            site.style = "inline-hidden-only"
            site.split_residual = SourceLine(rel, split.lineno, parsed.line(split.lineno).strip())
        else:
            site.style = "inline-guarded"
    elif isinstance(parent, ast.IfExp):
        holder = parents.get(parent)
        # `kw=collector if test else None` in the call, or first bound to a name the call passes
        # (qwen3_vl.py 0.5.23: `capture_output = (... if layer_idx in ... else None)`)
        kw = holder.arg if isinstance(holder, ast.keyword) else _keyword_passing(loop, holder)
        if kw:
            _analyse_delegated(src, site, kw, layer_files)
        else:
            site.notes.append(f"the loop picks a collector with `{ast.unparse(parent)}` but hands it on in "
                              f"a way the workbook does not follow; boundary 0 is not verified")
    _find_residual_none(fn, parents, parsed, rel, site)
    for n in ast.walk(fn):
        if _is_capture_test(n) and not _inside(n, loop, parents):
            site.post_loop.append(SourceLine(rel, n.lineno, parsed.line(n.lineno).strip()))
            site.post_loop_exprs.append(ast.unparse(n.left))
    _loop_notes(fn, loop, site, parsed, parents)
    return site


def _loop_var(loop: ast.For) -> str | None:
    """``i`` in ``for i in range(...)`` and in ``for i, layer in enumerate(self.layers)``."""
    if isinstance(loop.target, ast.Name):
        return loop.target.id
    if isinstance(loop.target, ast.Tuple) and loop.target.elts and isinstance(loop.target.elts[0], ast.Name):
        return loop.target.elts[0].id
    return None


def _capture_loop(fn: ast.FunctionDef) -> tuple[ast.For | None, ast.AST | None, str | None]:
    """The layer loop and the test that picks the layers to capture.

    The index test (``i in self.layers_to_capture``) wins over a per-layer flag when a loop
    has both (bailing_moe passes both keywords; only the index one is ever set there).
    """
    flagged = None
    for node in ast.walk(fn):
        if isinstance(node, ast.For):
            var = _loop_var(node)
            for inner in ast.walk(node):
                if _is_capture_test(inner) and isinstance(inner.left, ast.Name) and inner.left.id == var:
                    return node, inner, None
                if flagged is None and isinstance(inner, ast.IfExp) and _flag_test(inner.test):
                    flagged = (node, inner.test, _flag_test(inner.test))
    return flagged if flagged is not None else (None, None, None)


def _keyword_passing(loop: ast.For, holder: ast.AST | None) -> str | None:
    """The keyword under which the loop passes the name ``holder`` assigns, if any."""
    if not (isinstance(holder, ast.Assign) and len(holder.targets) == 1 and isinstance(holder.targets[0], ast.Name)):
        return None
    name = holder.targets[0].id
    return next((k.arg for k in ast.walk(loop) if isinstance(k, ast.keyword) and k.arg
                 and isinstance(k.value, ast.Name) and k.value.id == name), None)


def _split_residual(loop: ast.For) -> ast.Assign | None:
    """``hidden_states, residual = layer(...)`` in the loop: the layers hand the residual back
    apart from hidden_states, so hidden_states alone is not the residual stream."""
    for node in ast.walk(loop):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            for t in node.targets:
                if isinstance(t, ast.Tuple) and any(isinstance(e, ast.Name) and e.id == "residual"
                                                    for e in t.elts):
                    return node
    return None


def _appended(stmts: list[ast.stmt]) -> list[ast.expr]:
    return [n.args[0] for st in stmts for n in ast.walk(st)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "append"
            and n.args]


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


def _analyse_delegated(src: SglangSource, site: CaptureSite, kw: str, layer_files: Sequence[Path]) -> None:
    """The loop hands a collector to the layer (``kw=collector if <test> else None``): follow it
    into the decoder layer and the code that appends to it, and find what that code does
    when there is no residual yet (before layer 0)."""
    site.style = "delegated"
    which = (f"layers the setter flagged `{site.flag}`" if site.flag
             else "the indices in layers_to_capture")
    hand = _layer_hand_off(src, kw, layer_files)
    if hand is not None:
        layer_name, line, callee, kwarg = hand
        site.layer_call = line
        site.handler, what = _callee_handlers(src, callee, kwarg)
        how = f"{layer_name}.forward hands it to `{callee}` ({line.file}:{line.line}), which {what}"
    else:
        site.handler = _boundary_handlers(src)
        how = "the layer's boundary code captures the residual stream itself"
    site.notes.append(f"the loop passes the collector to the layer as `{kw}=` for {which}; {how}; no "
                      f"`hidden_states + residual` is evaluated in {site.file}")
    if not site.handler:
        site.notes.append("could not find where the layer code handles the missing residual "
                          "before the first layer; boundary 0 is not verified")
        site.style = "unknown"


def _layer_hand_off(src: SglangSource, kw: str, files: Sequence[Path]
                    ) -> tuple[str, SourceLine, str, str] | None:
    """(layer class, call line, callee, keyword): where a decoder layer's forward, taking
    ``kw``, passes it on (``self.layer_communicator.prepare_attn_and_capture_last_layer_outputs(
    ..., captured_last_layer_outputs=...)`` in 0.5.9, ``self.attn_boundary.prepare(...,
    capture_gathered=...)`` in 0.5.23)."""
    seen = set()
    for path in files:
        if path in seen or not Path(path).is_file():
            continue
        seen.add(path)
        parsed = ss.parse_file(path)
        for klass in parsed.tree.body:
            if not isinstance(klass, ast.ClassDef):
                continue
            fwd = next((n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == "forward"), None)
            if fwd is None or kw not in [a.arg for a in fwd.args.args + fwd.args.kwonlyargs]:
                continue
            for call in ast.walk(fwd):
                if not isinstance(call, ast.Call):
                    continue
                for k in call.keywords:
                    if k.arg and isinstance(k.value, ast.Name) and k.value.id == kw:
                        f = call.func
                        callee = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "?")
                        line = SourceLine(src.rel(path), k.value.lineno, parsed.line(k.value.lineno).strip())
                        return klass.name, line, callee, k.arg
    return None


def _callee_handlers(src: SglangSource, callee: str, kwarg: str) -> tuple[list[SourceLine], str]:
    """Lines that show what ``callee`` captures and how it treats a missing residual."""
    layers = src.package_dir / "srt" / "layers"
    if kwarg.startswith("capture") and (layers / "layer_boundary").is_dir():
        return _boundary_handlers(src), ("captures the residual stream entering the layer; the "
                                         "layer_boundary code starts the residual from the embedding "
                                         "before layer 0")
    for path in sorted(layers.rglob("*.py")) if layers.is_dir() else []:
        if f"def {callee}(" not in ss._safe_read(path):
            continue
        parsed = ss.parse_file(path)
        for klass in ast.walk(parsed.tree):
            if not isinstance(klass, ast.ClassDef):
                continue
            methods = {n.name: n for n in klass.body if isinstance(n, ast.FunctionDef)}
            fn = methods.get(callee)
            if fn is None:
                continue
            return _append_after_residual(src, path, parsed, methods, fn, kwarg)
    return [], f"is not defined under {src.rel(layers)}"


def _append_after_residual(src, path, parsed, methods, fn, kwarg) -> tuple[list[SourceLine], str]:
    """Confirm the 0.5.9 LayerCommunicator shape: ``self.prepare_attn(...)`` first (which does
    ``residual = hidden_states`` when residual is None, else the fused ``hidden_states +
    residual``), then ``<collector>.append(<value built from residual>)``."""
    rel = src.rel(path)
    appends = [n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr == "append" and isinstance(n.func.value, ast.Name)
               and n.func.value.id == kwarg and n.args]
    if not appends:
        return [], f"does not append to `{kwarg}` ({rel}:{fn.lineno})"
    append = appends[0]
    value = append.args[0]
    sources = [value] + [a.value for a in ast.walk(fn) if isinstance(a, ast.Assign) and isinstance(value, ast.Name)
                         and any(isinstance(t, ast.Name) and t.id == value.id for t in a.targets)]
    if not any(_mentions(v, "residual") for v in sources):
        return [], f"appends `{ast.unparse(value)}`, which is not built from the residual ({rel}:{append.lineno})"
    before = [n.func.attr for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and isinstance(n.func.value, ast.Name) and n.func.value.id == "self" and n.lineno < append.lineno]
    for name in before:
        starts = [n for n in ast.walk(methods[name]) if isinstance(n, ast.If) and _is_residual_none(n.test)
                  and any(isinstance(b, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "residual"
                                                            for t in b.targets)
                          and isinstance(b.value, ast.Name) and b.value.id == "hidden_states"
                          for b in n.body)] if name in methods else []
        if starts:
            lines = [SourceLine(rel, append.lineno, parsed.line(append.lineno).strip())]
            lines += [SourceLine(rel, n.lineno, parsed.line(n.lineno).strip()) for n in starts]
            return lines, (f"appends `{ast.unparse(value)}` built from `residual` after `self.{name}(...)` "
                           f"({rel}:{append.lineno}): hidden_states + residual, the stream entering the "
                           f"layer; `{name}` sets residual = hidden_states when it is None, so index 0 "
                           f"captures the embedding output")
    return [], f"appends before any step that starts the residual ({rel}:{append.lineno})"


def _is_residual_none(test: ast.expr) -> bool:
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "residual"
            and len(test.ops) == 1 and isinstance(test.ops[0], ast.Is)
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value is None)


def _loop_notes(fn: ast.FunctionDef, loop: ast.For, site: CaptureSite, parsed: ParsedFile,
                parents: dict) -> None:
    text = parsed.segment(fn)
    if site.loop_range and site.loop_range != ("self.start_layer", "self.end_layer") and "can_run_tbo" in text:
        site.notes.append(f"the capture loop runs over {site.loop_range}; with two-batch overlap "
                          f"(forward_batch.can_run_tbo) it stops at first_k_dense_replace and later "
                          f"layers run without capture")
    branch = _enclosing(parents.get(loop), parents, ast.If)
    if branch is not None and "can_run_tbo" in ast.unparse(branch.test) and _inside(loop, branch, parents) \
            and any(_inside(loop, st, parents) for st in branch.orelse):
        site.notes.append(f"the capture loop is the else-branch of `if {ast.unparse(branch.test)}`: with "
                          f"two-batch overlap the layers run without the collector and nothing is captured")
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
    if site.style not in ("inline-add", "inline-guarded", "inline-hidden-only"):
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
            found = ss.find_method(ctx.src, cls, name)
            if found is not None:
                return types.MethodType(_compile_method(ctx, found[0], found[1]), self)
            inner = ss.child_class(ctx.src, cls, name)
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
    flagged: dict[str, set[int]] = {}
    for layers in ctx.layer_lists:
        for layer in layers:
            for k, v in vars(layer).items():
                if k != "layer_id" and v is True:
                    flagged.setdefault(k, set()).add(layer.layer_id)
    return SetterRun(ltc, owner, executed, sorted(set(ctx.log)), error,
                     {k: sorted(v) for k, v in flagged.items()})


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
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WiringError(f"cannot read draft config {path}: {exc}") from None
    if not isinstance(cfg, dict):
        raise WiringError(f"draft config {path} holds a {type(cfg).__name__}, expected a JSON object")
    archs = [str(a) for a in cfg.get("architectures") or []]
    if archs and not cfg.get("speculators_model_type") and "eagle_config" not in cfg and not any(
            "eagle" in a.lower() or "speculator" in a.lower() for a in archs):
        raise WiringError(f"draft {draft} is a {', '.join(archs)} model, not an EAGLE-3 draft: are --target "
                          f"and --draft swapped?")
    return cfg


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
    warnings.extend(_sglang_format_warnings(cfg, src))
    return DraftIds(ids, origin, warnings, lines, use_aux)


def _sglang_format_warnings(cfg: dict, src: SglangSource | None) -> list[str]:
    """Draft-side mismatches that no error reveals: a speculators checkpoint SGLang cannot name,
    and a forward flag SGLang's llama_eagle3 does not implement."""
    out = []
    archs = [str(a) for a in cfg.get("architectures") or []]
    if cfg.get("speculators_model_type") or any("Speculator" in a for a in archs):
        known = None
        if src is not None and (src.root / "sglang" / "srt").is_dir():
            known = any("Eagle3Speculator" in f.read_text(errors="ignore")
                        for f in (src.root / "sglang" / "srt" / "models").glob("*eagle*.py"))
        if not known:
            out.append(f"speculators-format draft ({', '.join(archs) or cfg.get('speculators_model_type')}): "
                       + ("this SGLang version registers no such architecture; " if known is False else "")
                       + "to serve it, the config needs architectures LlamaForCausalLMEagle3 with the ids in "
                       "eagle_config, and the weights layers.0.* renamed midlayer.* (SGLang's llama_eagle3 "
                       "load_weights skips names it does not know, without an error)")
    layer = cfg.get("transformer_layer_config") if isinstance(cfg.get("transformer_layer_config"), dict) else {}
    if cfg.get("norm_before_residual") or layer.get("norm_before_residual"):
        out.append("the draft was trained with norm_before_residual=true; SGLang's llama_eagle3 always keeps the "
                   "raw hidden input as the residual, so it runs a different forward than training did")
    return out


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
    warnings = chosen.warnings + ["vLLM rule from docs/conventions.md (vLLM 0.33: id = boundary, "
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
    engine = f"sglang=={src.version}"
    if not wiring.setters or wiring.owner is None:
        # nothing to run: the one error from the inspector says why, and a stub run would
        # only add a 'could not run' echo of it
        return WiringResult(engine, src.version, arch, num_layers, (), [], chosen.ids, chosen.source,
                            errors, warnings, [l.to_dict() for l in _dedupe(lines)])
    run = run_setter(src, arch, num_layers, chosen.ids, target_config)
    lines.extend(run.executed)
    lines.extend(wiring.source_lines())
    if run.touched:
        warnings.append("the stub supplied placeholders for: " + ", ".join(run.touched))
    if wiring.capture is not None and wiring.capture.style == "unknown":
        warnings.append(f"the capture at {wiring.capture.file}:{wiring.capture.line} is not a style the "
                        f"workbook recognises; the served layout assumes index v captures boundary v")
    ltc = run.layers_to_capture or []
    if run.error:
        errors.append(_setter_failure(run, ltc, chosen.ids, num_layers, src))
        captured = set()  # SGLang would stop while loading the model: nothing is served
    else:
        captured, capture_errors = _captured(ltc, chosen.ids, wiring, num_layers, src, run.flagged)
        errors.extend(capture_errors)
    if not chosen.use_aux:
        errors.append("SGLang will not capture aux hidden states for this draft (use_aux_hidden_state false)")
    return WiringResult(engine, src.version, arch, num_layers, tuple(sorted(captured)),
                        ltc, chosen.ids, chosen.source, errors, warnings, [l.to_dict() for l in _dedupe(lines)])


def _setter_failure(run: SetterRun, ltc: list[int], ids: list[int] | None, num_layers: int,
                    src: SglangSource) -> str:
    """One error for a setter that raised, naming the index that made it raise when it is the
    Qwen-MoE ``setattr(self.layers[k], ...)`` meeting a k with no layer."""
    base = f"running sglang {src.version}'s {SETTER} failed: {run.error}"
    bad = [(k, v) for k, v in enumerate(ltc) if not -num_layers <= v < num_layers]
    if run.error.startswith("IndexError") and bad:
        k, v = bad[0]
        src_id = f" (from id {ids[k]})" if ids is not None and k < len(ids) else ""
        return (f"{base}: capture index {v}{src_id} has no layer self.layers[{v}] (the model has layers "
                f"0..{num_layers - 1}), so SGLang raises while loading the model and serves nothing")
    return base


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
              src: SglangSource, flagged: dict[str, list[int]] | None = None) -> tuple[set[int], list[str]]:
    """Which capture indices happen, and why the others do not."""
    errors: list[str] = []
    capture = wiring.capture
    if capture is None:
        return set(), errors
    inside, after = _visited(capture, num_layers)
    L = num_layers
    where = f"{capture.file}:{capture.loop_line} `{capture.loop_text}`"
    marked = set((flagged or {}).get(capture.flag, [])) if capture.flag else set()
    captured = set()
    for k, v in enumerate(ltc):
        src_id = f" (from id {ids[k]})" if ids is not None and k < len(ids) else ""
        if v in after:
            captured.add(v)
        elif capture.flag is not None:
            layer = v + L if -L <= v < 0 else v  # the setter indexes self.layers[v]
            if 0 <= layer < L and layer in marked:
                captured.add(layer)
                if v < 0:
                    errors.append(
                        f"capture index {v}{src_id} flags self.layers[{v}], which Python reads as layer "
                        f"{layer}: sglang {src.version} captures boundary {layer} there, not the embedding")
            else:
                errors.append(
                    f"capture index {v}{src_id} is never captured by sglang {src.version}: the loop {where} "
                    f"captures only layers whose `{capture.flag}` the setter set, and it set none for "
                    f"{v} (layers are 0..{L - 1})")
        elif v in inside:
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
    if capture.style == "inline-hidden-only" and captured - {0}:
        split = capture.split_residual
        errors.append(
            f"capture indices {sorted(captured - {0})} are not boundaries in sglang {src.version}: "
            f"{capture.file}:{capture.line} appends `hidden_states` alone, but the loop gets the residual "
            f"back separately ({split.file}:{split.line} `{split.text}`), so each feature is the previous "
            f"layer's output branch without the residual stream (boundary b is hidden_states + residual); "
            f"only index 0, before any residual exists, is the boundary it names")
    if 0 in captured and capture.style == "unknown":
        why = capture.notes[-1] if capture.notes else f"the capture at {capture.file}:{capture.line} is not one the workbook recognises"
        errors.append(f"boundary 0 (embedding output) is not verified for sglang {src.version}: {why}")
    if 0 in captured and capture.boundary0_hazard:
        add, rn, fr = capture.unguarded_add, capture.residual_none, capture.first_rank
        errors.append(
            f"boundary 0 (embedding output) cannot be captured by unpatched sglang {src.version}: on the first "
            f"pipeline rank `residual` is None before layer 0 ({rn.file}:{rn.line}"
            + (f", under `{fr.text}`" if fr else "") + f") and {add.file}:{add.line} evaluates "
            f"`{add.text}` -> TypeError on the first forward ({_patch_advice(src, wiring, capture)})")
    return captured, errors


def _patch_advice(src: SglangSource, wiring: ModelWiring, capture: CaptureSite) -> str:
    """Advice that agrees with what ``patch-sglang apply`` would do for this file."""
    from helpers import patch_sglang

    return patch_sglang.fix_advice(src, wiring.arch, capture.file)


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


def _target_config(folder: str) -> dict:
    path = Path(folder)
    path = path if path.is_file() else path / "config.json"
    if not path.is_file():
        raise WiringError(f"target folder {folder} has no config.json")
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WiringError(f"cannot read the target's {path}: {exc}") from None
    if not isinstance(cfg, dict):
        raise WiringError(f"the target's {path} holds a {type(cfg).__name__}, expected a JSON object")
    archs = [str(a) for a in cfg.get("architectures") or []]
    if cfg.get("speculators_model_type") or any("eagle" in a.lower() or "speculator" in a.lower() for a in archs):
        raise WiringError(f"--target {folder} is an EAGLE-3 draft ({', '.join(archs) or cfg.get('speculators_model_type')}), "
                          f"not a target model: are --target and --draft swapped?")
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "architectures": cfg.get("architectures")}
    return cfg


def _parse_ids(text: str) -> list[int]:
    """Every comma-separated field must be an integer: an empty field is a typo, never 'skip'."""
    if not text.strip():
        raise WiringError("--ids is empty; give integers like -1,2,6, or omit --ids to use the "
                          "engine's default ids")
    parts = [p.strip() for p in text.split(",")]
    if any(not p for p in parts):
        raise WiringError(f"--ids {text!r} has an empty field; expected integers separated by single "
                          f"commas, like -1,2,6")
    out = []
    for p in parts:
        try:
            out.append(int(p))
        except ValueError:
            raise WiringError(f"cannot read ids from {text!r}: {p!r} is not an integer; expected integers "
                              f"like -1,2,6") from None
    return out


def _target_arch_and_layers(args, target_cfg: dict | None) -> tuple[str, int]:
    """--arch/--layers, or the target's config.json; when both are given they must agree,
    since a report about a different depth or class than the target's is silently wrong."""
    cfg_arch = ((target_cfg or {}).get("architectures") or [None])[0]
    cfg_layers = (target_cfg or {}).get("num_hidden_layers")
    if target_cfg is not None:
        where = Path(args.target) if Path(args.target).is_file() else Path(args.target) / "config.json"
        if args.layers is not None and cfg_layers is not None and args.layers != cfg_layers:
            raise WiringError(f"--layers {args.layers} contradicts {where}, which has num_hidden_layers = "
                              f"{cfg_layers}; drop --layers or pass the matching value")
        if args.arch is not None and cfg_arch is not None and args.arch != cfg_arch:
            raise WiringError(f"--arch {args.arch} contradicts {where}, whose architectures are "
                              f"{target_cfg.get('architectures')}; drop --arch or pass the matching name")
    arch = args.arch or cfg_arch
    layers = args.layers if args.layers is not None else cfg_layers
    if not arch or layers is None:
        missing = " and ".join(n for n, v in (("--arch", arch), ("--layers", layers)) if v is None or v == "")
        raise WiringError(f"need --arch and --layers (or --target DIR with a config.json); missing {missing}")
    return arch, layers


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
        args = _parser().parse_args(glue_option_values(argv, "--ids"))
        target_cfg = _target_config(args.target) if args.target is not None else None
        arch, layers = _target_arch_and_layers(args, target_cfg)
        ids = _parse_ids(args.ids) if args.ids is not None else None
        result = resolve(args.engine, arch, layers, ids=ids, draft=args.draft, root=args.sglang_root,
                         target_config=target_cfg)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except (_ArgError, WiringError, ValueError, ss.SglangSourceError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        from .errors import print_json
        print_json(result.to_dict(), indent=2)
    else:
        print(format_report(result))
    return 0 if result.capturable else 1
