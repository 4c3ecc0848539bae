"""Reading a model class's forward loop to learn where and how it captures aux hidden states."""
from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Sequence

from . import classes
from .classes import ClassRef, ParsedFile
from .sites import SETTER, CaptureSite, CaptureStyle, ModelWiring, SetterSite, SourceLine, dedupe
from .source import SglangSource, get_source, safe_read

# --------------------------------------------------------------------------------------
# The inspector.


def inspect_model(arch: str, version: str | None = None, *, source: SglangSource | None = None,
                  root: str | Path | None = None) -> ModelWiring:
    """Locate the setter chain and the forward-loop capture site for ``arch``.

    Every way this can fail becomes one error that names the reason, because each failure
    means the same thing to the user (this engine version will not serve the draft's ids
    for this architecture) and a pile of follow-on errors would hide which one it is.
    """
    src = source or get_source(version, root=root)
    top = classes.class_for_arch(src, arch)
    chain, setters, errors, notes = [top.name], [], [], []
    cls = top
    found = classes.find_method(src, cls, SETTER)
    if found is None:
        attr = classes.wrapped_attr(src, cls)
        inner = classes.child_class(src, cls, attr) if attr else None
        if inner is None or classes.find_method(src, inner, SETTER) is None:
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
    fwd = classes.find_method(src, owner, "forward")
    if fwd is None:
        return None, f"{owner.name} has no forward method in sglang {src.version}"
    cls, fn = fwd
    first = cls
    files = [top.path, owner.path] + [b.path for b in classes.linear_bases(src, owner)]
    for _ in range(4):
        site = analyse_forward(src, cls, fn, layer_files=files)
        if site is not None:
            return site, ""
        if not _calls_super_forward(fn):
            break
        base = next((m for b in classes.base_classes(src, cls)
                     if (m := classes.find_method(src, b, "forward"))), None)
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
        found = classes.find_method(src, cls, SETTER)
        if found is None:
            return None, f"{cls.name} has no {SETTER} to receive the ids"
        owner_cls, fn = found
        parsed = classes.parse_file(owner_cls.path)
        delegate = _delegated_attr(fn)
        site = SetterSite(owner_cls.name, src.rel(owner_cls.path), str(owner_cls.path), fn.lineno,
                          fn.end_lineno or fn.lineno, parsed.segment(fn), delegate, _last_rank_only(fn))
        setters.append(site)
        if site.last_rank_only:
            notes.append(f"{owner_cls.name}.{SETTER} returns early unless pp_group.is_last_rank: with "
                         f"pipeline parallelism only the last stage gets layers_to_capture")
        target = _capture_target(fn)
        inner = classes.child_class(src, cls, delegate) if delegate is not None else None
        if inner is not None and (target is None or classes.find_method(src, inner, SETTER) is not None):
            chain.append(f"{delegate}:{inner.name}")
            cls = inner
            continue
        if target == "self":
            return cls, ""
        if target is not None:
            child = classes.child_class(src, cls, target)
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
    parsed = classes.parse_file(cls.path)
    parents = _parents(fn)
    loop, test, flag = _capture_loop(fn)
    if loop is None:
        return None
    rel = src.rel(cls.path)
    loop_var = _loop_var(loop)
    stmt = _enclosing_statement(test, parents)
    site = CaptureSite(cls.name, rel, str(cls.path), test.lineno, stmt.end_lineno or stmt.lineno,
                       parsed.segment(stmt), CaptureStyle.UNKNOWN, loop.lineno,
                       parsed.line(loop.lineno).strip(), _range_args(loop), flag=flag,
                       index_offset=(index_offset(test.left, loop_var) or 0) if flag is None else 0)
    parent = parents.get(test)
    if isinstance(parent, ast.If) and parent.test is test or isinstance(parent, ast.BoolOp):
        if_node = parent if isinstance(parent, ast.If) else _enclosing(parent, parents, ast.If)
        adds, guarded = [], []
        _scan_capture_body(if_node.body, loop_var, adds, guarded)
        split = _split_residual(loop)
        if adds:
            site.style = CaptureStyle.INLINE_ADD
            site.unguarded_add = SourceLine(rel, adds[0].lineno, parsed.line(adds[0].lineno).strip())
        elif not guarded and split is not None and not any(_mentions(v, "residual")
                                                           for v in _appended(if_node.body)):
            site.style = CaptureStyle.INLINE_HIDDEN_ONLY
            site.split_residual = SourceLine(rel, split.lineno, parsed.line(split.lineno).strip())
        else:
            site.style = CaptureStyle.INLINE_GUARDED
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
                if _is_capture_test(inner) and index_offset(inner.left, var) is not None:
                    return node, inner, None
                if flagged is None and isinstance(inner, ast.IfExp) and _flag_test(inner.test):
                    flagged = (node, inner.test, _flag_test(inner.test))
    return flagged if flagged is not None else (None, None, None)


def index_offset(expr: ast.expr, var: str | None) -> int | None:
    """0 for ``i in self.layers_to_capture``; k for ``i + k in ...``: gpt_oss 0.5.17-0.5.20 captures
    after layer i under index i + 1, which is boundary i + 1 (the stream entering layer i + 1)."""
    if isinstance(expr, ast.Name) and expr.id == var:
        return 0
    if (isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Add) and isinstance(expr.left, ast.Name)
            and expr.left.id == var and isinstance(expr.right, ast.Constant)
            and isinstance(expr.right.value, int)):
        return expr.right.value
    return None


def _keyword_passing(loop: ast.For, holder: ast.AST | None) -> str | None:
    """The keyword under which the loop passes the name ``holder`` assigns, if any."""
    if not (isinstance(holder, ast.Assign) and len(holder.targets) == 1
            and isinstance(holder.targets[0], ast.Name)):
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
    if (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
            and len(it.args) == 2):
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
        text = safe_read(path)
        if "residual is None" not in text:
            continue
        parsed = classes.parse_file(path)
        for node in ast.walk(parsed.tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            argnames = [a.arg for a in node.args.args + node.args.kwonlyargs]
            if not any(a.startswith("capture") or a == "enters_stack" for a in argnames):
                continue
            for n in ast.walk(node):
                if isinstance(n, ast.Compare) and "residual is None" in ast.unparse(n):
                    out.append(SourceLine(src.rel(path), n.lineno, parsed.line(n.lineno).strip()))
    return sorted(dedupe(out), key=lambda ln: (ln.file, ln.line))


def _analyse_delegated(src: SglangSource, site: CaptureSite, kw: str, layer_files: Sequence[Path]) -> None:
    """The loop hands a collector to the layer (``kw=collector if <test> else None``): follow it
    into the decoder layer and the code that appends to it, and find what that code does
    when there is no residual yet (before layer 0)."""
    site.style = CaptureStyle.DELEGATED
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
        site.style = CaptureStyle.UNKNOWN


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
        parsed = classes.parse_file(path)
        for klass in parsed.tree.body:
            if not isinstance(klass, ast.ClassDef):
                continue
            fwd = next((n for n in klass.body if isinstance(n, ast.FunctionDef) and n.name == "forward"),
                       None)
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
        if f"def {callee}(" not in safe_read(path):
            continue
        parsed = classes.parse_file(path)
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
    sources = [value] + [a.value for a in ast.walk(fn)
                         if isinstance(a, ast.Assign) and isinstance(value, ast.Name)
                         and any(isinstance(t, ast.Name) and t.id == value.id for t in a.targets)]
    if not any(_mentions(v, "residual") for v in sources):
        return [], (f"appends `{ast.unparse(value)}`, which is not built from the residual "
                    f"({rel}:{append.lineno})")
    before = [n.func.attr for n in ast.walk(fn)
              if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
              and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"
              and n.lineno < append.lineno]
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
    if (site.loop_range and site.loop_range != ("self.start_layer", "self.end_layer")
            and "can_run_tbo" in text):
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



