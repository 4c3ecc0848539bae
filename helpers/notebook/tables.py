"""Tables as a reader sees them: column names in words with their units, no row index.

The records keep their keys (``summary.json``'s ``tau``, ``spec_tok_s`` ...), since tools read those;
what a notebook displays goes through ``words``, so one column has one name in every report (the
names ``reports.TABLE_HEAD`` gives the index page and summary.md).
"""
from __future__ import annotations

import pandas as pd

WORDS = {
    "wiring": "wiring", "engine": "engine", "backend": "engine", "layout": "layout",
    "served_layout": "served layout", "rules": "rules",
    "baseline_tok_s": "baseline tok/s", "spec_tok_s": "EAGLE-3 tok/s",
    "speedup": "speedup (x)", "speedup_interval": "speedup [95%]", "timing": "timing",
    "tau": "accept length", "accept_length": "accept length",
    "accept_rate": "accepted per drafted token", "per_position": "per position",
    "accepted_per_position": "accepted per position", "speedup_per_tau": "speedup per accepted token",
    "lossless": "lossless", "decode_ms": "decode (ms)", "verify_ms": "verify of k+1 (ms)",
    "draft_step_ms": "draft step (ms)", "draft_cost_ratio": "draft step / decode",
    "predicted_speedup": "predicted speedup (x)", "measured_speedup": "measured speedup (x)",
    "break_even_tau": "break-even accept length", "slower_prompts": "prompts slower than no speculation",
    "prompts": "prompts", "tau_gap": "accept length minus reference", "ref_tau": "reference accept length",
    "ref_speedup": "reference speedup (x)", "drafts": "drafts", "position": "draft position",
    "verify_decodes": "verify of k+1 (decode steps)",
}


def word(column: str) -> str:
    return WORDS.get(column, column.replace("_", " "))


def words(rows, columns: list[str] | None = None):
    """``rows`` (a DataFrame or a list of dicts) as a table to display: the named columns (all by default)
    under their words, floats to three places, lists as text, no index."""
    frame = rows if isinstance(rows, pd.DataFrame) else pd.DataFrame(list(rows))
    if columns is not None:
        frame = frame[[c for c in columns if c in frame.columns]]
    frame = frame.apply(lambda col: col.map(_cell) if col.dtype == object else col)
    frame = frame.rename(columns=word)
    return frame.style.hide(axis="index").format(precision=2)


def _cell(x):
    """A list in a cell: floats as an interval or a profile, ``[0.97, 2.17]``; ids as a layout,
    ``(3, 7, 10)``."""
    if isinstance(x, (list, tuple)):
        if any(isinstance(v, float) for v in x):
            return "[" + ", ".join(f"{v:.2f}" for v in x) + "]"
        return "(" + ", ".join(str(v) for v in x) + ")"
    return x
