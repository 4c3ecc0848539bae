"""Tiny target/draft pairs, built with the real build code, shared by every test module.

Plain cached functions rather than fixtures so several test modules share one build. Each pair comes,
in this order, from ``EAGLE3_WORKBOOK_TEST_PAIRS`` (a developer's own folder, kept between runs), from the
pairs committed under ``tests/pairs/`` (copied into the session's folder, so no test can change them), or from
a build in the session (a few minutes on 2 cores). The committed pairs are used only while the build code
is the code that built them: ``tests/pairs/fingerprint.txt`` holds the hash of every helper module the
build imports (their code, not their comments); any change there and the suite builds its own again and
says so once.

    # after changing the build code: run the suite once with a folder of your own, then commit its pairs
    EAGLE3_WORKBOOK_TEST_PAIRS=/tmp/pairs .venv/bin/python -m pytest -q tests
    .venv/bin/python tests/_pairs.py --commit /tmp/pairs
"""
from __future__ import annotations

import ast
import functools
import hashlib
import os
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

# EAGLE3_WORKBOOK_TEST_PAIRS=DIR keeps (and reuses) the built pairs between runs while developing.
ROOT = Path(os.environ.get("EAGLE3_WORKBOOK_TEST_PAIRS") or tempfile.mkdtemp(prefix="eagle3-wb-tests-"))
COMMITTED = Path(__file__).resolve().parent / "pairs"
# the modules whose code builds the pairs (with every helper module they import, at any depth)
BUILDERS = ("helpers.factory.embedded_pair", "helpers.factory.dump_writer")


@functools.lru_cache(maxsize=None)
def build_fingerprint() -> str:
    """The hash of the build code: every helper module the builders import, transitively, each as its
    syntax tree without docstrings (a comment or a docstring changes no pair)."""
    from _architecture import imports, modules

    known = modules()
    graph = imports(known)
    seen, todo = set(), list(BUILDERS)
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.add(m)
        top, lazy = graph[m]
        todo += sorted(top | lazy)
    h = hashlib.sha256()
    for m in sorted(seen):
        tree = ast.parse(known[m].read_text())
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                    and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                    and isinstance(body[0].value.value, str)):
                node.body = body[1:] or [ast.Pass()]
        h.update(m.encode() + b"\0" + ast.dump(tree).encode() + b"\0")
    return h.hexdigest()


def _stamp(out: Path) -> Path:
    return out.parent / f"{out.name}.fingerprint"


@functools.lru_cache(maxsize=None)
def _committed_current() -> bool:
    stamp = COMMITTED / "fingerprint.txt"
    if not stamp.is_file():
        return False
    if stamp.read_text().strip() == build_fingerprint():
        return True
    warnings.warn(f"the test pairs committed in {COMMITTED} were built by other build code than this: the "
                  f"suite builds its own (a few minutes); refresh them as tests/_pairs.py says", stacklevel=3)
    return False


def ready(out: Path, done: str) -> bool:
    """``out`` holds a finished pair (``done`` inside it), from an earlier build or copied from the
    committed pairs."""
    if (out / done).exists():
        return True
    src = COMMITTED / out.name
    if (src / done).exists() and _committed_current():
        shutil.copytree(src, out, dirs_exist_ok=True)
        built(out)       # stamped like a build of this code, so ``commit`` keeps it beside any new pair
        return True
    return False


def built(out: Path) -> Path:
    _stamp(out).write_text(build_fingerprint() + "\n")
    return out


@functools.lru_cache(maxsize=None)
def tiny_default() -> Path:
    """``build-default --tiny``: DeepSeek-V3 target, SGLang-format draft trained on (0, 3, 7)."""
    from helpers.factory.embedded_pair import build_default

    out = ROOT / "tiny-kimi"
    if ready(out, "build.json"):
        return out
    build_default(out, layers=12, training_boundaries=(0, 3, 7), seed=0, tiny=True, log=lambda *_: None)
    return built(out)


@functools.lru_cache(maxsize=None)
def tiny_draft(layout: tuple[int, ...], fmt: str = "sglang") -> Path:
    """Another draft on the same tiny target, trained on ``layout``."""
    from helpers.factory.embedded_pair import TINY, build_draft

    base = tiny_default()
    out = ROOT / f"draft-{'-'.join(map(str, layout))}-{fmt}"
    if ready(out, "training.json"):
        return out
    build_draft(out, base / "target", layout, TINY, 0, fmt, log=lambda *_: None)
    return built(out)


@functools.lru_cache(maxsize=None)
def tiny_llama() -> Path:
    """A second family: Llama target with a speculators-format draft, 8 layers."""
    from helpers.factory.embedded_pair import build_default

    out = ROOT / "tiny-llama"
    if ready(out, "build.json"):
        return out
    build_default(out, layers=8, training_boundaries=(0, 2, 4), seed=1, tiny=True, arch="llama",
                  fmt="speculators", log=lambda *_: None)
    return built(out)


@functools.lru_cache(maxsize=None)
def tiny_dump(fmt: str, bounds: tuple = (0, 3, 7, 10, 12), records: int = 6) -> Path:
    """``dump`` of the tiny target in a trainer's layout: the trained (0, 3, 7) and served (3, 7, 10)
    inside."""
    from helpers.factory.dump_writer import write_from_text

    out = ROOT / f"dump-{fmt}-{'-'.join(map(str, bounds))}-{records}"
    if ready(out, "."):
        return out
    write_from_text(tiny_default() / "target", bounds, fmt, out, window=128, records=records)
    return built(out)


def assert_in_front(layout, best, confident_set, order=None, within: int = 5) -> None:
    """The trained layout leads wherever this machine's own ranking can tell it from the rest.

    The tiny pairs are trained in the test session, so their last bits (and with them a tie between
    adjacent boundaries of a 12-layer residual stream) differ from one CPU to another. What must hold
    on every machine: the trained layout is in the paired test's confidence set (never separated from
    the best), near the top of the ranking, and first whenever that set holds one layout only."""
    layout = tuple(layout)
    cs = [tuple(c) for c in confident_set]
    assert layout in cs, f"trained {layout} is separated from the best {tuple(best)}; within noise: {cs}"
    if len(cs) == 1:
        assert tuple(best) == layout, f"the ranking separates {tuple(best)} from the trained {layout}"
    if order is not None:
        rank = [tuple(x) for x in order].index(layout)
        assert rank < max(within, len(cs)), f"trained {layout} ranks {rank + 1}; within noise: {cs}"



def commit(folder: Path) -> list[str]:
    """Replace the committed pairs with those ``folder`` holds that this build code built (each stamped
    with its fingerprint when it was built); returns their names."""
    fp = build_fingerprint()
    names = sorted(p.name for p in Path(folder).iterdir()
                   if p.is_dir() and _stamp(p).is_file() and _stamp(p).read_text().strip() == fp)
    if not names:
        raise SystemExit(f"{folder} holds no pair built by this build code (fingerprint {fp[:12]})")
    shutil.rmtree(COMMITTED, ignore_errors=True)
    COMMITTED.mkdir()
    for n in names:
        shutil.copytree(Path(folder) / n, COMMITTED / n)
    (COMMITTED / "fingerprint.txt").write_text(fp + "\n")
    return names


if __name__ == "__main__":
    if sys.argv[1:2] != ["--commit"] or len(sys.argv) != 3:
        raise SystemExit("usage: .venv/bin/python tests/_pairs.py --commit FOLDER "
                         "(EAGLE3_WORKBOOK_TEST_PAIRS)")
    sys.path[:0] = [str(Path(__file__).resolve().parents[1])]
    print("committed:", ", ".join(commit(Path(sys.argv[2]))))
