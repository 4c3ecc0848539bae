"""Tiny target/draft pairs built once per test session with the real build code.

Plain cached functions rather than fixtures so several test modules share one build.
"""
from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

# WORKBOOK_TEST_PAIRS=DIR keeps (and reuses) the built pairs between runs while developing.
ROOT = Path(os.environ.get("WORKBOOK_TEST_PAIRS") or tempfile.mkdtemp(prefix="eagle3-wb-tests-"))


@functools.lru_cache(maxsize=None)
def tiny_default() -> Path:
    """``build-default --tiny``: DeepSeek-V3 target, SGLang-format draft trained on (0, 3, 7)."""
    from helpers.investigation.embedded_pair import build_default

    out = ROOT / "tiny-kimi"
    if (out / "build.json").is_file():
        return out
    build_default(out, layers=12, training_boundaries=(0, 3, 7), seed=0, tiny=True, log=lambda *_: None)
    return out


@functools.lru_cache(maxsize=None)
def tiny_draft(layout: tuple[int, ...], fmt: str = "sglang") -> Path:
    """Another draft on the same tiny target, trained on ``layout``."""
    from helpers.investigation.embedded_pair import TINY, build_draft

    base = tiny_default()
    out = ROOT / f"draft-{'-'.join(map(str, layout))}-{fmt}"
    if (out / "training.json").is_file():
        return out
    build_draft(out, base / "target", layout, TINY, 0, fmt, log=lambda *_: None)
    return out


@functools.lru_cache(maxsize=None)
def tiny_llama() -> Path:
    """A second family: Llama target with a speculators-format draft, 8 layers."""
    from helpers.investigation.embedded_pair import build_default

    out = ROOT / "tiny-llama"
    if (out / "build.json").is_file():
        return out
    build_default(out, layers=8, training_boundaries=(0, 2, 4), seed=1, tiny=True, arch="llama",
                  fmt="speculators", log=lambda *_: None)
    return out


@functools.lru_cache(maxsize=None)
def tiny_dump(fmt: str, bounds: tuple = (0, 3, 7, 10, 12), records: int = 6) -> Path:
    """``dump`` of the tiny target in a trainer's layout: the trained (0, 3, 7) and served (3, 7, 10)
    inside."""
    from helpers.investigation.dump_writer import write_from_text

    out = ROOT / f"dump-{fmt}-{'-'.join(map(str, bounds))}-{records}"
    if not out.exists():
        write_from_text(tiny_default() / "target", bounds, fmt, out, window=128, records=records)
    return out


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
