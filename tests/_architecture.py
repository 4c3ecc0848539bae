"""The import floors of ``helpers/``, computed from the code: what docs/architecture.md draws.

A module's floor is 0 when it imports no other helper at module level, else one more than the highest
floor it imports, so every module-level import points down by construction, and a cycle is an error.
Imports inside a function (lazy: a heavy library, or a command reaching a live engine only when asked)
are listed separately, with whether they point up.

    .venv/bin/python tests/_architecture.py          # print the table docs/architecture.md holds
    .venv/bin/python tests/_architecture.py --write  # rewrite that table in the doc
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HELPERS = REPO / "helpers"
DOC = REPO / "docs" / "architecture.md"
BEGIN, END = "<!-- modules:begin (tests/_architecture.py --write) -->", "<!-- modules:end -->"
SKIP_PARTS = {"site"}          # engines/sglang/cpu/site: runs inside SGLang's processes, not a helper module


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(HELPERS.rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        if SKIP_PARTS & set(rel.parts):
            continue
        name = ".".join(rel.parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _resolve(module: str, is_pkg: bool, node: ast.ImportFrom, known: set[str]) -> list[str]:
    if node.level == 0:
        base = node.module or ""
        if not base.startswith("helpers"):
            return []
    else:
        parts = module.split(".")
        if not is_pkg:
            parts = parts[:-1]
        parts = parts[: len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    found = []
    for alias in node.names:
        sub = f"{base}.{alias.name}"
        found.append(sub if sub in known else base)
    return [f for f in found if f in known]


def imports(known: dict[str, Path]) -> dict[str, tuple[set[str], set[str]]]:
    """module -> (module-level helper imports, imports inside functions)."""
    out = {}
    for name, path in known.items():
        tree = ast.parse(path.read_text())
        top, lazy = set(), set()
        is_pkg = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                targets = _resolve(name, is_pkg, node, set(known))
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name in known]
            else:
                continue
            funcs = (ast.FunctionDef, ast.AsyncFunctionDef)
            inner = any(isinstance(p, funcs) for p in _ancestors(tree, node))
            # as Python runs it: importing a.b.c first runs the packages a and a.b (their __init__)
            targets = [x for t in targets for x in (*_packages(t, known), t)]
            (lazy if inner else top).update(t for t in targets if t != name)
        out[name] = (top, lazy - top)
    return out


def _packages(module: str, known) -> list[str]:
    """The packages Python runs before ``module``: each enclosing package with an ``__init__`` of its own."""
    parts = module.split(".")
    return [p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p in known]


def _ancestors(tree: ast.AST, target: ast.AST) -> list[ast.AST]:
    if not hasattr(tree, "_parents"):
        parents = {}
        for node in ast.walk(tree):
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        tree._parents = parents            # type: ignore[attr-defined]
    out, node = [], target
    while node in tree._parents:           # type: ignore[attr-defined]
        node = tree._parents[node]         # type: ignore[attr-defined]
        out.append(node)
    return out


def floors(graph: dict[str, tuple[set[str], set[str]]]) -> dict[str, int]:
    done: dict[str, int] = {}

    def visit(m: str, stack: tuple[str, ...]) -> int:
        if m in done:
            return done[m]
        if m in stack:
            raise ValueError(f"import cycle: {' -> '.join(stack[stack.index(m):] + (m,))}")
        below = [visit(d, stack + (m,)) for d in graph[m][0]]
        done[m] = 1 + max(below) if below else 0
        return done[m]

    for m in graph:
        visit(m, ())
    return done


def cycles(graph: dict[str, tuple[set[str], set[str]]]) -> list[list[str]]:
    """Groups of modules that reach each other, imports inside functions counted (Tarjan's strongly
    connected components); each group sorted, the list sorted."""
    edges = {m: top | lazy for m, (top, lazy) in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return sorted(found)


def purpose(path: Path) -> str:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    first = doc.strip().split("\n\n")[0].replace("\n", " ")
    return first.split(". ")[0].rstrip(".")[:150]


def table() -> str:
    known = modules()
    graph = imports(known)
    level = floors(graph)
    rows = ["| floor | module | what it is for (its docstring's first sentence) |", "|---:|---|---|"]
    for m in sorted(known, key=lambda m: (-level[m], m)):
        rows.append(f"| {level[m]} | `{m.removeprefix('helpers.')}` | {purpose(known[m]) or '-'} |")
    up = sorted((m, d) for m in graph for d in graph[m][1] if level[d] > level[m])
    rows.append("")
    edges = sum(len(t) for t, _ in graph.values())
    rows.append(f"{len(known)} modules; {edges} module-level imports between them, all downward; {len(up)} "
                f"lazy imports (inside a function) reach a higher floor:")
    rows.append("")
    short = [(m.removeprefix("helpers."), d.removeprefix("helpers.")) for m, d in up]
    rows += [f"- `{m}` -> `{d}`" for m, d in short] or ["- none"]
    size = sizes(known)
    rows += ["", f"Size: {size['lines']:,} lines in {len(known)} modules, the largest `{size['largest']}` "
                 f"({size['largest_lines']} lines); {size['public_classes']} public classes; "
                 f"{len(size['long_functions'])} functions over {LONG_FUNCTION} lines; "
                 f"{size['many_parameters']} functions with {MANY_PARAMETERS} or more parameters."]
    return "\n".join(rows)


LONG_FUNCTION = 80       # lines: a function longer than this does more than one job
MANY_PARAMETERS = 8      # a function that takes this many wants a typed value instead
LARGEST_MODULE = 600     # lines


def sizes(known: dict | None = None) -> dict:
    """The package's size, as the table's last line states it: lines, the largest module, public classes,
    functions over ``LONG_FUNCTION`` lines and functions taking ``MANY_PARAMETERS`` or more parameters
    (``self``/``cls`` not counted)."""
    known = known or modules()
    out = {"lines": 0, "largest": "", "largest_lines": 0, "public_classes": 0, "long_functions": [],
           "many_parameters": 0}
    for m, path in known.items():
        text = path.read_text()
        n = text.count("\n")
        out["lines"] += n
        if n > out["largest_lines"]:
            out["largest"], out["largest_lines"] = m.removeprefix("helpers."), n
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                out["public_classes"] += 1
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > LONG_FUNCTION:
                    out["long_functions"].append(f"{m}.{node.name}")
                a = node.args
                names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
                count = len(names) - (names[:1] in (["self"], ["cls"])) + bool(a.vararg) + bool(a.kwarg)
                out["many_parameters"] += count >= MANY_PARAMETERS
    return out


def doc_table() -> str | None:
    text = DOC.read_text()
    if BEGIN not in text or END not in text:
        return None
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def write() -> None:
    text = DOC.read_text()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    DOC.write_text(f"{head}{BEGIN}\n{table()}\n{END}{tail}")


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        write()
    else:
        print(table())
