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


def isolated(result, val: dict) -> str:
    """Notebook 02's finding from its rows (``isolate.Isolated``): the draft fed its trained wiring against
    the served one, step-0 accuracy and the simulated accept length, and what the token embeddings alone
    reach."""
    t_row, s_row, z_row, b_row = (result.row(p) for p in ("trained", "served", "no features", "best in dump"))
    note = (f" (from the dump `{result.data}`, {result.tokens} tokens, no target forward)" if result.data
            else "")
    fed = "Fed the layout it was trained on, the draft gets **{:.1%}** of step-0 tokens right"
    if t_row is None:
        msg = (f"The trained layout is not in this dump's slots; the best choice in it gets "
               f"**{b_row.full_acc_0:.1%}** of step-0 tokens right{note}." if b_row is not None
               else "No trained layout could be scored.")
    elif result.served_problems:
        msg = (fed.format(t_row.full_acc_0) + f"{note}. The engine cannot feed it at all "
               f"({'; '.join(result.served_problems)}): a deployment failure, not a silent accuracy loss.")
    elif s_row is None:
        msg = (fed.format(t_row.full_acc_0) + f"{note}. The served layout {tuple(result.served.layout)} is "
               "not all in the dump, so its accuracy cannot be measured from it: dump those boundaries too, "
               "or run the target (leave DATA unset).")
    else:
        msg = (fed.format(t_row.full_acc_0)
               + (f" (training reported {val['full_acc'][0]:.1%}); " if val.get("full_acc") else "; ")
               + f"fed the layout the engine serves, **{s_row.full_acc_0:.1%}**{note}. The simulated accept "
               f"length falls from {t_row.sim_accept_length:.2f} to {s_row.sim_accept_length:.2f}. The draft "
               "is fine; its input is wrong.")
        if z_row is not None:
            msg += (f" With every feature zeroed it still gets {z_row.full_acc_0:.1%} (simulated accept "
                    f"length {z_row.sim_accept_length:.2f}) from token embeddings alone: the served wiring "
                    + ("carries nothing more it can use." if s_row.full_acc_0 <= z_row.full_acc_0 + 0.02 else
                       "still carries part of the signal, which is why it degrades rather than collapses."))
    if result.dump is not None and result.dump.labels.startswith("the dump's next tokens"):
        msg += (" These scores are against the dump's own next tokens, not the target's distribution that "
                "training used, so every row sits below training's figure: compare the rows with each other.")
    return msg
