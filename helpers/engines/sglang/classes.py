"""Navigating SGLang's model classes with ``ast``: entry classes, bases, wrapped models."""
from __future__ import annotations

import ast
import difflib
import functools
import re
from dataclasses import dataclass
from pathlib import Path

from .source import SglangSource, UnknownArchitectureError, safe_read

_ENTRY_RE = re.compile(r"^EntryClass\s*=\s*(\[[^\]]*\]|\w+)", re.M)
# --------------------------------------------------------------------------------------
# Parsing files and classes.


@dataclass(frozen=True)
class ParsedFile:
    path: Path
    text: str
    tree: ast.Module

    @functools.cached_property
    def _raw_lines(self) -> list[str]:
        # the split `ast` itself uses for offsets (\r\n, \r, \n only), kept once per file:
        # ast.get_source_segment re-splits the whole file on every call, which dominated
        # the inspector's time on 3000-line model files
        return re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", self.text)

    @functools.cached_property
    def _lines(self) -> list[str]:
        return self.text.splitlines()

    def segment(self, node: ast.AST) -> str:
        """``ast.get_source_segment(text, node, padded=True)``, without re-splitting the file."""
        pos = [getattr(node, a, None) for a in ("lineno", "end_lineno", "col_offset", "end_col_offset")]
        if None in pos:
            return ""
        first, last, col, end_col = pos[0] - 1, pos[1] - 1, pos[2], pos[3]
        lines = self._raw_lines
        if first == last:
            return lines[first].encode()[col:end_col].decode()
        head = lines[first].encode()
        padding = "".join(c if c in " \t\f" else " " for c in head[:col].decode())
        body = [padding + head[col:].decode(), *lines[first + 1:last],
                lines[last].encode()[:end_col].decode()]
        return "".join(body)

    def line(self, lineno: int) -> str:
        lines = self._lines
        return lines[lineno - 1] if 0 < lineno <= len(lines) else ""


@functools.lru_cache(maxsize=64)
def _parse_cached(path: str, mtime_ns: int, size: int) -> ParsedFile:
    text = Path(path).read_text(encoding="utf-8-sig")  # a few sglang files start with a BOM
    return ParsedFile(Path(path), text, ast.parse(text, filename=path))


def parse_file(path: Path | str) -> ParsedFile:
    """Parsed once per content version: a patched file is re-read, not served stale."""
    st = Path(path).stat()
    return _parse_cached(str(path), st.st_mtime_ns, st.st_size)


def entry_class_names(parsed: ParsedFile) -> list[str]:
    """Names in a module's ``EntryClass = X`` or ``EntryClass = [X, Y]`` (last one wins)."""
    names: list[str] = []
    for node in parsed.tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else [])
        if any(isinstance(t, ast.Name) and t.id == "EntryClass" for t in targets):
            value = node.value
            elts = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            names = [e.id for e in elts if isinstance(e, ast.Name)]
    return names


def entry_class_index(source: SglangSource) -> dict[str, Path]:
    """Every architecture name of the version -> the model file that registers it.

    Only the ``EntryClass = ...`` statement of each file is parsed, not the whole file: a
    version has hundreds of model files and the index is consulted for every suggestion.
    """
    index: dict[str, Path] = {}
    for path in sorted(source.models_dir.glob("*.py")):
        for name in _entry_names_in_text(safe_read(path)):
            index.setdefault(name, path)
    return index


def _entry_names_in_text(text: str) -> list[str]:
    names: list[str] = []
    for m in _ENTRY_RE.finditer(text):  # the last assignment wins, as in the module itself
        try:
            node = ast.parse(m.group(0)).body[0]
        except SyntaxError:
            continue
        value = node.value
        elts = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
        names = [e.id for e in elts if isinstance(e, ast.Name)]
    return names


def find_model_file(source: SglangSource, arch: str) -> Path:
    """The models/*.py whose EntryClass declares ``arch``; only files naming it are parsed."""
    for path in sorted(source.models_dir.glob("*.py")):
        text = safe_read(path)
        if not any(re.search(rf"\b{re.escape(arch)}\b", m.group(1)) for m in _ENTRY_RE.finditer(text)):
            continue  # cheap text test first: parse only files whose EntryClass names the arch
        if arch in entry_class_names(parse_file(path)):
            return path
    close = suggest_architectures(source, arch)
    hint = (f"; did you mean {', '.join(close)}?" if close else
            "; the name must be an HF `architectures` entry such as LlamaForCausalLM")
    raise UnknownArchitectureError(
        f"sglang {source.version} has no model class registered for architecture '{arch}'{hint}")


def suggest_architectures(source: SglangSource, name: str, n: int = 6) -> list[str]:
    """Registered names a person most likely meant by ``name``.

    People type the family (``llama``, ``deepseek_v3``) or get the case wrong, and difflib
    alone finds nothing for a short name against ``LlamaForCausalLM``; so a match ignoring case
    comes first, then names that contain the typed text (ignoring case and ``_``/``-``), then
    difflib's near misses.
    """
    names = list(entry_class_index(source))
    squash = lambda t: re.sub(r"[-_\s]", "", t).lower()  # noqa: E731
    key = squash(name)
    if not key:
        return []
    by_lower = {}
    for nm in names:
        by_lower.setdefault(nm.lower(), nm)
    contains = sorted((nm for nm in names if key in squash(nm)),
                      key=lambda nm: (not squash(nm).startswith(key), "ForCausalLM" not in nm, len(nm), nm))
    near = [by_lower[m] for m in difflib.get_close_matches(name.lower(), list(by_lower), n=n, cutoff=0.6)]
    exact = [nm for nm in names if squash(nm) == key]
    out: list[str] = []
    for nm in exact + contains + near:
        if nm not in out:
            out.append(nm)
    return out[:n]


@dataclass(frozen=True)
class ClassRef:
    """A class definition found in a version's source."""

    name: str
    path: Path
    node: ast.ClassDef

    @property
    def line(self) -> int:
        return self.node.lineno


def _module_file(source: SglangSource, module: str) -> Path | None:
    if not module.startswith("sglang"):
        return None
    base = source.root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _relative_module(path: Path, source: SglangSource, level: int, module: str | None) -> str:
    parts = source.rel(path)[:-3].split("/")[:-level]
    return ".".join(parts + ([module] if module else []))


def find_class(source: SglangSource, name: str, path: Path, _depth: int = 0) -> ClassRef | None:
    """Class ``name`` as visible from ``path``: defined there or imported from another file."""
    if _depth > 6 or not path.is_file():
        return None
    parsed = parse_file(path)
    for node in parsed.tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return ClassRef(name, path, node)
    for node in ast.walk(parsed.tree):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) != name:
                    continue
                module = (_relative_module(path, source, node.level, node.module)
                          if node.level else node.module or "")
                other = _module_file(source, module)
                if other is not None:
                    found = find_class(source, alias.name, other, _depth + 1)
                    if found is not None:
                        return found
    return None


def class_for_arch(source: SglangSource, arch: str) -> ClassRef:
    path = find_model_file(source, arch)
    ref = find_class(source, arch, path)
    if ref is None:
        raise UnknownArchitectureError(f"{source.rel(path)} lists {arch} in EntryClass but its "
                                       f"class definition could not be found")
    return ref


def base_classes(source: SglangSource, cls: ClassRef) -> list[ClassRef]:
    out = []
    for base in cls.node.bases:
        if isinstance(base, ast.Name):
            ref = find_class(source, base.id, cls.path)
            if ref is not None:
                out.append(ref)
    return out


def find_method(source: SglangSource, cls: ClassRef, method: str,
                _seen: frozenset = frozenset()) -> tuple[ClassRef, ast.FunctionDef] | None:
    """A method as Python would find it: the class itself, then its bases in order."""
    if (cls.path, cls.name) in _seen:
        return None
    for node in cls.node.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == method:
            return cls, node
    for base in base_classes(source, cls):
        found = find_method(source, base, method, _seen | {(cls.path, cls.name)})
        if found is not None:
            return found
    return None


def _self_attr_assignments(fn: ast.FunctionDef, attr: str) -> list[ast.expr]:
    values = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if (isinstance(t, ast.Attribute) and t.attr == attr and isinstance(t.value, ast.Name)
                        and t.value.id == "self"):
                    values.append(node.value)
    return values


def child_class(source: SglangSource, cls: ClassRef, attr: str) -> ClassRef | None:
    """The class of ``self.<attr>`` as built in ``__init__`` (``X(...)`` or ``self._init_x(...)``)."""
    for owner in linear_bases(source, cls):  # an __init__ may leave it to super().__init__
        init = next((n for n in owner.node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
                    None)
        if init is None:
            continue
        for value in _self_attr_assignments(init, attr):
            ref = _class_of_call(source, cls, owner, value)
            if ref is not None:
                return ref
    return None


def linear_bases(source: SglangSource, cls: ClassRef) -> list[ClassRef]:
    """The class and its resolvable bases, depth first (close enough to the MRO here)."""
    out, stack, seen = [], [cls], set()
    while stack:
        c = stack.pop(0)
        if (c.path, c.name) in seen:
            continue
        seen.add((c.path, c.name))
        out.append(c)
        stack[:0] = base_classes(source, c)
    return out


def _class_of_call(source: SglangSource, cls: ClassRef, owner: ClassRef, value: ast.expr) -> ClassRef | None:
    """Class names resolve in the file that wrote the call (``owner``); ``self.f()`` dispatches
    on the instance's class (``cls``), so a subclass's ``_init_model`` override wins.

    Newer model files also build the inner model from a name that is not a class: a
    constructor argument (``language_model_cls=Qwen3LLMModel``, passed up by subclasses),
    a class attribute (``self.body_cls(...)``) or a module attribute (``qwen3_5.X(...)``).
    Each is followed the way Python would bind it on an instance of ``cls``.
    """
    if not isinstance(value, ast.Call):
        return None
    func = value.func
    if isinstance(func, ast.Name):
        return find_class(source, func.id, owner.path) or _class_from_init_default(source, cls, func.id)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "self":
        factory = find_method(source, cls, func.attr)  # e.g. LlamaForCausalLM._init_model
        if factory is not None:
            fowner, ffn = factory
            for node in ast.walk(ffn):
                if isinstance(node, ast.Return) and node.value is not None:
                    ref = _class_of_call(source, cls, fowner, node.value)
                    if ref is not None:
                        return ref
            return None
        return _class_from_class_attr(source, cls, func.attr)
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return _class_in_module(source, owner.path, func.value.id, func.attr)
    return None


def _class_named_by(source: SglangSource, path: Path, expr: ast.expr | None) -> ClassRef | None:
    """The class a bare name or ``module.Name`` expression refers to, as seen from ``path``."""
    if isinstance(expr, ast.Name):
        return find_class(source, expr.id, path)
    if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
        return _class_in_module(source, path, expr.value.id, expr.attr)
    return None


def _class_from_init_default(source: SglangSource, cls: ClassRef, param: str) -> ClassRef | None:
    """``X(...)`` where X is an ``__init__`` parameter: the most derived class's default wins,
    because subclasses declare their own default and hand it to ``super().__init__``."""
    for c in linear_bases(source, cls):
        init = next((n for n in c.node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        if init is None:
            continue
        a = init.args
        positional = a.posonlyargs + a.args
        pairs = list(zip(positional[len(positional) - len(a.defaults):], a.defaults))
        pairs += [(k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
        for arg, default in pairs:
            if arg.arg == param:
                ref = _class_named_by(source, c.path, default)
                if ref is not None:
                    return ref
    return None


def _class_from_class_attr(source: SglangSource, cls: ClassRef, attr: str) -> ClassRef | None:
    """``self.body_cls(...)`` with ``body_cls = SomeModel`` in the class body (subclass first)."""
    for c in linear_bases(source, cls):
        for node in c.node.body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == attr
                                                    for t in node.targets):
                ref = _class_named_by(source, c.path, node.value)
                if ref is not None:
                    return ref
    return None


def _class_in_module(source: SglangSource, path: Path, alias: str, name: str) -> ClassRef | None:
    """``alias.name`` where ``alias`` is a module imported into ``path``."""
    if not path.is_file():
        return None
    for node in ast.walk(parse_file(path).tree):
        module = None
        if isinstance(node, ast.ImportFrom):
            for a in node.names:
                if (a.asname or a.name) == alias:
                    base = (_relative_module(path, source, node.level, node.module) if node.level
                            else node.module or "")
                    module = f"{base}.{a.name}" if base else a.name
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.asname == alias or (a.asname is None and a.name == alias):
                    module = a.name
        if module:
            other = _module_file(source, module)
            if other is not None:
                found = find_class(source, name, other)
                if found is not None:
                    return found
    return None


def wrapped_attr(source: SglangSource, cls: ClassRef) -> str | None:
    """``language_model`` or ``model`` when ``cls`` hands its work to such an inner model."""
    for attr in ("language_model", "model"):
        for method in ("set_eagle3_layers_to_capture", "forward"):
            found = find_method(source, cls, method)
            if found is None:
                continue
            if any(_mentions_self_attr(n, attr) for n in ast.walk(found[1])):
                if child_class(source, cls, attr) is not None:
                    return attr
    return None


def _mentions_self_attr(node: ast.AST, attr: str) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == attr and isinstance(node.value, ast.Name)
            and node.value.id == "self")
