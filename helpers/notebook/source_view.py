"""Engine source shown the way a person reads it: real line numbers, the key lines marked."""
from __future__ import annotations

import html
from pathlib import Path


def excerpt(path, first: int, last: int, marks: dict[int, str] | None = None) -> str:
    """Lines ``first..last`` (1-based, inclusive) with numbers; ``marks`` puts a note beside a line."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    first, last = max(first, 1), min(last, len(lines))
    marks = marks or {}
    width = len(str(last))
    out = []
    for n in range(first, last + 1):
        flag = ">>" if n in marks else "  "
        note = f"    # <-- {marks[n]}" if n in marks else ""
        out.append(f"{flag} {n:>{width}} | {lines[n - 1]}{note}")
    return "\n".join(out)


def as_html(text: str, title: str = "") -> str:
    head = f"<b>{html.escape(title)}</b>" if title else ""
    return f"{head}<pre style='font-size:12px;line-height:1.3'>{html.escape(text)}</pre>"
