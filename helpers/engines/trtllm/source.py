"""TensorRT-LLM's rule read from a release's own wheel at run time (``rules.wheels``, by HTTP ranges only:
its wheels are over a gigabyte and live on NVIDIA's index, so no whole download is ever attempted).

The facts ``rule.RECORDED`` caches are looked for in the release's ``_torch/speculative/eagle3.py``: the
default formula (1, N//2-1, N-4), the sort of the given ids, and (two-model) -1 moved to the end. Found,
their lines are cited and the rule stands as read now; missing, the recorded rule disagrees with the
release, and a warning says so. Where the wheel cannot be read (an air-gapped host, an index that carries a
stub) the caller falls back to the recorded rule and says why.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ...boundaries import Problem, ProblemKind, warning
from ...rules import wheels
from .rule import EAGLE3

PACKAGE = "tensorrt-llm"
KEEP = (EAGLE3,)
# (fact, pattern over the file's text); each must be found for the recorded rule to hold
FACTS = (
    ("default", re.compile(r"layers_to_capture\s*=\s*\(\s*1\s*,\s*self\.num_layers\s*//\s*2\s*-\s*1\s*,"
                           r"\s*self\.num_layers\s*-\s*4\s*\)")),
    ("sort", re.compile(r"layers_to_capture\s*=\s*sorted\(\s*list\(\s*self\.layers_to_capture\s*\)\s*\)")),
    ("minus_one_last", re.compile(r"layers_to_capture\[0\]\s*==\s*-1")),
)


@dataclass
class ReadRelease:
    """What one release's eagle3.py says: the cited lines, and a problem saying whether they hold."""

    version: str
    lines: list[dict] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def read_text(version: str, text: str) -> ReadRelease:
    """The recorded facts looked for in ``text`` (one release's eagle3.py)."""
    out = ReadRelease(version)
    missing = []
    for fact, pattern in FACTS:
        hits = [m.start() for m in pattern.finditer(text)]
        if not hits:
            missing.append(fact)
        for pos in hits:
            n = _line_of(text, pos)
            out.lines.append({"file": EAGLE3, "line": n, "text": text.splitlines()[n - 1].strip(),
                              "release": version, "fact": fact})
    if missing:
        out.problems.append(warning(ProblemKind.SOURCE_DISAGREES, (
            f"the recorded rule disagrees with the release: tensorrt-llm {version}'s {EAGLE3} has no "
            f"{', '.join(missing)} as recorded (docs/conventions.md); the recorded rule was applied, but "
            f"this release must be read again")))
    else:
        cited = ", ".join(f"{ln['fact']} at line {ln['line']}" for ln in out.lines)
        out.problems.append(warning(ProblemKind.SOURCE_CHECKED, f"read from tensorrt-llm {version}'s own "
                                    f"{EAGLE3} now: {cited}"))
    return out


def _has_a_wheel(version: str) -> None:
    """Refuse, naming what the index holds, where it lists this release without a wheel (a stub sdist)."""
    listing = wheels.index_listing(PACKAGE)
    if listing is None:
        return
    stem = f"tensorrt_llm-{version}"
    files = [f for f in listing.get("files", []) if isinstance(f, dict)
             and str(f.get("filename", "")).lower().startswith((f"{stem}-", f"{stem}.tar", f"{stem}.zip"))]
    if files and not any(str(f["filename"]).endswith(".whl") for f in files):
        held = ", ".join(f"{f['filename']} ({f.get('size', '?')} bytes)" for f in files)
        raise wheels.PackageSourceError(f"the index lists no wheel of tensorrt-llm {version}, only {held}: a "
                                        f"stub; its real wheels are on NVIDIA's index")


def read_release(version: str, cache=None) -> ReadRelease:
    """The release's eagle3.py, from the cache or by ranges from the index; ``PackageSourceError`` when it
    cannot be had, or the wheel holds no such file (a stub)."""
    if wheels.cached(PACKAGE, version, Path(cache) if cache else wheels.cache_root(PACKAGE)) is None:
        _has_a_wheel(version)
    folder = wheels.fetch(PACKAGE, version, lambda name: name in KEEP, cache=cache, whole=False)
    path = Path(folder) / EAGLE3
    if not path.is_file():
        raise wheels.PackageSourceError(f"tensorrt-llm {version}'s wheel holds no {EAGLE3} (a stub of the "
                                        f"package; the real wheels are on NVIDIA's index)")
    return read_text(version, path.read_text(encoding="utf-8", errors="replace"))
