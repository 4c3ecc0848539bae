"""LMDeploy's facts, read from a release's own files (its wheel, by ranges, through ``rules.wheels``).

What decides what LMDeploy's PyTorch engine feeds an EAGLE-3 draft is the model-config builders under
``lmdeploy/pytorch/configurations/``: each has a ``condition`` (which target config it builds) and a
``build`` that, on the ``eagle3`` path, assigns ``hf_config.aux_hidden_state_layers`` from the target's
depth alone. This module finds, per builder, the condition's expression, that assignment (its line and
expression, evaluated here on the depth asked about), an ``assert`` that refuses every speculative method
but one, a guard that raises on the depth, and a call that hands the build to another builder. It also
finds where the engine config takes ids for other methods only (``pytorch/config.py``), the TurboMind
warning, and the Kimi draft's fallback ids. Nothing is imported from the release: only its syntax trees
are read, and the expressions evaluated have no builtins but ``getattr``.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from ...rules import wheels

PACKAGE = "lmdeploy"
CONFIGS = "lmdeploy/pytorch/configurations/"
ENGINE_CONFIG = "lmdeploy/pytorch/config.py"
ASYNC_ENGINE = "lmdeploy/serve/core/async_engine.py"
KIMI_DRAFT = "lmdeploy/pytorch/models/kimi_k25_eagle3.py"
CLI_UTILS = "lmdeploy/cli/utils.py"
# beside the capture's files: what decides acceptance above temperature 0 (rules.acceptance.read_lmdeploy)
SPEC_DECODE = "lmdeploy/pytorch/spec_decode/"
MESSAGES = "lmdeploy/messages.py"
KEPT = (CONFIGS, ENGINE_CONFIG, ASYNC_ENGINE, KIMI_DRAFT, CLI_UTILS, SPEC_DECODE, MESSAGES)


class LmdeploySourceError(RuntimeError):
    """The release's files could not be read, or do not hold what the rule is read from."""


@dataclass(frozen=True)
class Line:
    file: str
    line: int
    text: str

    def cite(self) -> str:
        return f"{self.file}:{self.line}"

    def as_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "text": self.text}


@dataclass
class Builder:
    """One config builder class of the release, as its source says."""

    name: str
    file: str
    condition: Line | None = None
    cond_expr: ast.expr | None = None
    sets_aux: Line | None = None  # hf_config.aux_hidden_state_layers = <expr> on the eagle3 path
    aux_expr: ast.expr | None = None
    rejects: Line | None = None  # assert spec_method == '<one method>' (eagle3 refused)
    guards: list[tuple[Line, ast.expr]] = field(default_factory=list)  # if <depth test>: raise
    delegates: str | None = None  # the builder whose build it calls


@dataclass
class LmdeployRelease:
    version: str
    builders: list[Builder]
    ids_only_for: Line | None = None  # pytorch/config.py: target_layer_ids set for this method only
    turbomind: Line | None = None  # the warning TurboMind gives a speculative config
    cli_backend: Line | None = None  # the CLI's default --backend
    kimi_draft_ids: Line | None = None  # the Kimi draft's fallback ids, read only to size its fc


def _keep(name: str) -> bool:
    return name.endswith(".py") and name.startswith(KEPT)


def fetch(version: str) -> Path:
    """The folder holding the release's kept files (read by ranges once; no whole-wheel download: the
    caller has a recorded rule to fall back on)."""
    return wheels.fetch(PACKAGE, version, _keep, whole=False)


def _line(rel: str, lines: list[str], node: ast.AST) -> Line:
    return Line(rel, node.lineno, lines[node.lineno - 1].strip())


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == name), None)


def _refuses_eagle3(test: ast.expr) -> bool:
    """``spec_method == 'x'`` or ``spec_method in [...]``, a list without 'eagle3': an assert that fails
    for an EAGLE-3 draft."""
    if not (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "spec_method"
        and len(test.ops) == 1
        and isinstance(test.ops[0], (ast.Eq, ast.In))
    ):
        return False
    try:
        allowed = ast.literal_eval(test.comparators[0])
    except ValueError:
        return False
    return "eagle3" not in ([allowed] if isinstance(allowed, str) else list(allowed))


def _read_build(b: Builder, build: ast.FunctionDef, rel: str, lines: list[str]) -> None:
    for node in ast.walk(build):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Attribute) and t.attr == "aux_hidden_state_layers" for t in node.targets
        ):
            b.sets_aux, b.aux_expr = Line(rel, node.lineno, ast.unparse(node)), node.value
        elif isinstance(node, ast.Assert) and _refuses_eagle3(node.test):
            b.rejects = _line(rel, lines, node)
        elif (
            isinstance(node, ast.If)
            and len(node.body) == 1
            and isinstance(node.body[0], ast.Raise)
            and "num_layers" in ast.unparse(node.test)
        ):
            b.guards.append((_line(rel, lines, node), node.test))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "build"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id.endswith("ConfigBuilder")
            and node.func.value.id != "DefaultModelConfigBuilder"
        ):
            b.delegates = node.func.value.id


def read_builders(root: Path) -> list[Builder]:
    """Every config builder, in the order the release imports them (its package walks its modules by
    name) and so asks their conditions."""
    out = []
    for path in sorted((root / CONFIGS).glob("*.py")):
        rel = f"{CONFIGS}{path.name}"
        text = path.read_text(encoding="utf-8", errors="replace")
        lines = text.splitlines()
        for cls in (n for n in ast.parse(text).body if isinstance(n, ast.ClassDef)):
            b = Builder(cls.name, rel)
            cond = _method(cls, "condition")
            body = [
                s
                for s in (cond.body if cond else [])
                if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
            ]
            if len(body) == 1 and isinstance(body[0], ast.Return) and body[0].value is not None:
                b.condition, b.cond_expr = _line(rel, lines, body[0]), body[0].value
            build = _method(cls, "build")
            if build is not None:
                _read_build(b, build, rel, lines)
            out.append(b)
    return out


# what a condition or a capture formula is made of; anything else (a call but getattr, a lambda, a
# comprehension, a dunder name or attribute) is not evaluated
_PLAIN = (ast.Expression, ast.Name, ast.Load, ast.Attribute, ast.Constant, ast.Compare, ast.BoolOp, ast.BinOp,
          ast.UnaryOp, ast.List, ast.Tuple, ast.Subscript, ast.IfExp, ast.Call, ast.cmpop, ast.boolop,
          ast.operator, ast.unaryop, ast.Slice)


def _plain(expr: ast.expr) -> bool:
    for node in ast.walk(expr):
        if not isinstance(node, _PLAIN):
            return False
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id == "getattr"):
            return False
        name = (node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name)
                else node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else "")
        if name.startswith("_"):
            return False
    return True


def evaluate(expr: ast.expr, **names):
    """One expression from the release, evaluated on ``names`` with ``getattr`` as its only builtin, and
    only when it is plain (``_PLAIN``: names, attributes, constants, arithmetic, comparisons, getattr)."""
    if not _plain(expr):
        raise LmdeploySourceError(f"an expression in the release is not a plain one "
                                  f"({ast.unparse(expr)[:80]}); it is not evaluated here")
    code = compile(ast.Expression(expr), "<lmdeploy>", "eval")
    return eval(code, {"__builtins__": {"getattr": getattr}}, dict(names))  # noqa: S307


def matches(b: Builder, arch: str, model_type: str | None) -> bool:
    """Whether the builder's own condition accepts a target config with this class and model type."""
    if b.cond_expr is None or b.name == "DefaultModelConfigBuilder":  # the fallback, asked last
        return False
    cfg = SimpleNamespace(architectures=[arch], model_type=model_type)
    try:
        return bool(evaluate(b.cond_expr, hf_config=cfg))
    except Exception:  # a condition that needs keys this probe lacks accepts nothing here
        return False


def _find(root: Path, rel: str, wanted) -> Line | None:
    path = root / rel
    if not path.is_file():
        return None
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, text in enumerate(lines, 1):
        if wanted(text):
            return Line(rel, i, text.strip())
    return None


def read_release(version: str, root: Path | None = None) -> LmdeployRelease:
    """The facts of ``lmdeploy==version`` from its own files (fetched when ``root`` is not given)."""
    root = Path(root) if root is not None else fetch(version)
    builders = read_builders(root)
    if not any(b.sets_aux for b in builders):
        raise LmdeploySourceError(
            f"lmdeploy {version}: no config builder under {CONFIGS} assigns "
            f"aux_hidden_state_layers (no EAGLE-3 capture in this release)"
        )
    return LmdeployRelease(
        version,
        builders,
        ids_only_for=_find(
            root,
            ENGINE_CONFIG,
            lambda t: t.strip().startswith("if method ==") and "target_layer_ids" not in t,
        ),
        turbomind=_find(root, ASYNC_ENGINE, lambda t: "not supported by turbomind" in t),
        cli_backend=_find(root, CLI_UTILS, lambda t: "default='turbomind'" in t),
        kimi_draft_ids=_find(root, KIMI_DRAFT, lambda t: t.strip().startswith("return (")),
    )
