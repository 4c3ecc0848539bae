"""The sentences a notebook says of its figures, built here from the typed results so a cell shows a step
and its result: the symptom (notebook 01), the engine's accommodations said once per engine."""
from __future__ import annotations

from ..live.timing import speed_phrase


def _phrase(timing) -> str:
    return "not timed" if timing is None else speed_phrase(timing)


def symptom(layout_label: str, served, live_row=None) -> str:
    """Notebook 01's finding in one sentence: the deployed wiring's accept length and speed, on the real
    engine where one ran (its own counters), else on the reference engine."""
    if live_row is not None:
        return (f"Deployed as served, {layout_label}, on {live_row.backend}, the draft is accepted for "
                f"{live_row.accept_length:.2f} tokens per verify step; speculation against none: "
                f"{_phrase(live_row.timing)}.")
    return (f"Deployed as served, {layout_label}, on the reference engine, the draft is accepted for "
            f"{served.tau:.2f} tokens per verify step; speculation against none: "
            f"{_phrase(served.timing)}.")


def fixes_once(rows) -> list[str]:
    """What the workbook changed inside an engine, one line per change and engine however many wirings it
    was applied to (``LiveRow.fixes``), the wirings named."""
    seen: dict[tuple, list[str]] = {}
    for r in rows:
        for f in r.fixes:
            seen.setdefault((r.backend, f["fix"], f["state"], f["why"]), []).append(r.wiring)
    return [f"{backend} {fix}: {state} ({why}) [{', '.join(w)}]"
            for (backend, fix, state, why), w in seen.items()]


def summary_rows(served, live_row, wiring: str = "deployed") -> list[dict]:
    """Notebook 01's rows in ``Summary.table``'s shape, for ``plots.summary_figure``."""
    rows = []
    if live_row is not None:
        rows.append({"wiring": wiring, "engine": live_row.backend, "layout": live_row.served_layout,
                     "accept_length": live_row.accept_length, "per_position": live_row.accepted_per_position,
                     "speedup": live_row.speedup, "speedup_interval": live_row.speedup_interval,
                     "timing": live_row.timing_verdict})
    if served is not None:
        rows.append({"wiring": wiring, "engine": "reference", "layout": list(served.layout),
                     "accept_length": served.tau, "per_position": served.position_acceptance,
                     "speedup": served.speedup, "speedup_interval": served.speedup_interval,
                     "timing": served.timing_verdict})
    return rows
