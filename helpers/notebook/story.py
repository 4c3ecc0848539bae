"""The sentences a notebook says of its figures, built here from the typed results so a cell shows a step
and its result: the symptom (notebook 01), the engine's accommodations said once per engine."""
from __future__ import annotations

from ..investigation.verdict import material
from ..live.timing import speed_phrase
from .kernels import finding as kernels_finding
from .kernels import summary_rows as kernel_rows


def _phrase(timing) -> str:
    return "not timed" if timing is None else speed_phrase(timing)


def symptom(layout_label: str, served, live_row=None, kernels_run=None) -> str:
    """Notebook 01's finding: the deployed wiring on llama.cpp's kernels at a real target's cost where the
    chapter ran (``kernels``), then its accept length and speed on the real engine where one ran (its own
    counters), else on the reference engine."""
    first = kernels_finding(kernels_run) + " " if kernels_run is not None and kernels_run.rows else ""
    if live_row is not None:
        return (f"{first}Deployed as served, {layout_label}, on {live_row.backend}, the draft is accepted "
                f"for {live_row.accept_length:.2f} tokens per verify step; speculation against none: "
                f"{_phrase(live_row.timing)}.")
    return (f"{first}Deployed as served, {layout_label}, on the reference engine, the draft is accepted for "
            f"{served.tau:.2f} tokens per verify step; speculation against none: "
            f"{_phrase(served.timing)}.")


def figure_title(head: str, steps: int, kernels_run=None) -> str:
    """A figure's title naming the draft steps each engine ran: llama.cpp's chapter runs its own."""
    if kernels_run is not None and kernels_run.rows:
        return f"{head} ({kernels_run.rows[0].steps} draft steps on llama.cpp, {steps} on the others)"
    return f"{head}, {steps} draft steps"


def verdict(wiring, from_dump: bool) -> str:
    """Notebook 02's verdict, after its finding: served against trained (by rule where the training layout
    is known or a dump's format names it; notebook 03 decides an inferred one), what the draft accepts each
    way, and whether the wiring is why acceptance is low."""
    if wiring.trained_known or from_dump:
        parts = [f"**Verdict.** {wiring.line}"]
    else:
        parts = [f"**Cost.** {wiring.cost_text() or 'not measured'}. The training layout is inferred here, "
                 "so whether the served one equals it is decided in notebook 03, from the search's "
                 "confidence set."]
    if wiring.accept_figures:
        parts.append(f"**Accept length.** {wiring.accept_figures}.")
    if wiring.symptom:
        parts.append(f"**What it means.** {wiring.symptom[0].upper()}{wiring.symptom[1:]}.")
    return "\n\n".join(parts)


def fixes_once(rows) -> list[str]:
    """What the workbook changed inside an engine, one line per change and engine however many wirings it
    was applied to (``LiveRow.fixes``), the wirings named."""
    seen: dict[tuple, list[str]] = {}
    for r in rows:
        for f in r.fixes:
            seen.setdefault((r.backend, f["fix"], f["state"], f["why"]), []).append(r.wiring)
    return [f"{backend} {fix}: {state} ({why}) [{', '.join(w)}]"
            for (backend, fix, state, why), w in seen.items()]


def summary_rows(served, live_row, kernels_run=None, wiring: str = "deployed") -> list[dict]:
    """Notebook 01's rows in ``Summary.table``'s shape, for ``plots.summary_figure``: llama.cpp's kernels
    first where that chapter ran, then the real engine's, then the reference engine's."""
    rows = kernel_rows(kernels_run)
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
               f"length goes from {t_row.sim_accept_length:.2f} to {s_row.sim_accept_length:.2f}. "
               + ("The draft is fine; its input is wrong." if material(
                  t_row.sim_accept_length - s_row.sim_accept_length, t_row.sim_accept_length) else
                  "The served input costs the draft little: its acceptance is its own."))
        if z_row is not None:
            msg += (f" With every feature zeroed it still gets {z_row.full_acc_0:.1%} (simulated accept "
                    f"length {z_row.sim_accept_length:.2f}) from token embeddings alone: the served wiring "
                    + ("carries nothing more it can use." if s_row.full_acc_0 <= z_row.full_acc_0 + 0.02 else
                       "still carries part of the signal, which is why it degrades rather than collapses."))
    if result.dump is not None and result.dump.labels.startswith("the dump's next tokens"):
        msg += (" These scores are against the dump's own next tokens, not the target's distribution that "
                "training used, so every row sits below training's figure: compare the rows with each other.")
    return msg


# The seed's published figures: accept length ~1.6 at 56.8 tok/s against a 90 tok/s baseline.
SEED = {"tau": 1.6, "spec_tok_s": 56.8, "baseline_tok_s": 90.0}
SEED_BREAK_EVEN = SEED["tau"] * SEED["baseline_tok_s"] / SEED["spec_tok_s"]


def baseline(served, draft_steps: int) -> str:
    """Notebook 01's reading of the reference engine's benchmark: acceptance, speed with its interval, the
    round's cost in decode steps beside the seed's, and what that means here."""
    verdict = ("Timing here cannot say whether it is slower; the accept length is the symptom to chase."
               if served.timing_verdict == "unusable" else "The slowdown reproduces here too."
               if served.speedup_interval[1] < 1 else
               "On this machine the same collapse shows as a speedup lost rather than a slowdown; the "
               "accept length is the symptom to chase.")
    same = "identical to" if served.lossless else "DIFFERENT from"
    return (f"With the deployed wiring the draft's proposals are accepted at **{served.accept_rate:.0%}** "
            f"per position, an accept length of **{served.tau:.2f}** tokens per verify step (the ceiling "
            f"is {draft_steps + 1}). Speculation runs at **{served.spec_tok_s:.1f} tok/s** against "
            f"**{served.baseline_tok_s:.1f} tok/s** without it (reference engine); paired by prompt, "
            f"speculative over baseline is **{speed_phrase(served.timing)}**, and it lost to the baseline "
            f"on **{served.slower_prompts} of {len(served.per_prompt)}** prompts. The output is {same} "
            f"the baseline's, so the engine itself is sound: the draft is guessing badly.\n\n"
            f"Here one speculation round costs **{served.break_even_tau:.2f}** decode steps, so "
            f"speculation pays from that accept length up. The seed's figures put its round at "
            f"{SEED_BREAK_EVEN:.2f} decode steps (a verify over k+1 tokens of a large MoE reads many more "
            f"experts than a one-token decode): an accept length of {served.tau:.2f} there would run at "
            f"{served.tau / SEED_BREAK_EVEN:.2f}x. {verdict} Next: test the draft alone.")


def on_the_engine(live_row, served, rules, layout_label: str) -> str:
    """Notebook 01's reading of the same wiring on the real engine, beside the reference engine's
    prediction."""
    gap = ("the prediction holds" if abs(live_row.tau_gap) <= 0.15
           else f"they differ by {live_row.tau_gap:+.2f}")
    same = "identical to" if live_row.lossless else "DIFFERENT from"
    per = ", ".join(f"{x:.0%}" for x in live_row.accepted_per_position)
    return (f"**On the real engine ({live_row.backend}, {live_row.rules}, this host):** speculation runs "
            f"at **{live_row.spec_tok_s:.1f} tok/s** against **{live_row.baseline_tok_s:.1f} tok/s** "
            f"without it; paired by prompt, **{speed_phrase(live_row.timing)}**, at an accept length of "
            f"**{live_row.accept_length:.2f}** by the engine's own counters (per draft position {per}). "
            f"The reference engine fed the layout {rules} is predicted to serve, {layout_label}, measured "
            f"{served.tau:.2f}: {gap}. The engine's speculative output is {same} its own baseline's.")


def rebenchmark_notes(results: dict, live_rows: list, reused: bool, step01) -> list[str]:
    """What notebook 06's table cannot say: which ratios lie beyond 1, why a timing is noisy, the
    break-even, whether notebook 01's deployed measurement was reused or agrees, and what is
    deterministic."""
    from ..live.timing import agreement, table_notes

    notes = [] if "deployed" in results else ["The deployed wiring cannot be served at all (see above)."]
    notes += table_notes([(r.wiring, r.backend, r.timing) for r in live_rows]
                         + [(n, "the reference engine", r.timing) for n, r in results.items()])
    first = next(iter(results.values()), None)
    if first and first.timing_verdict != "unusable":
        notes.append(f"Break-even accept length on this machine: {first.break_even_tau:.2f}.")
    if "deployed" in results:
        dep = results["deployed"]
        notes.append(f"Deployed wiring slower than the baseline on {dep.slower_prompts} of "
                     f"{len(dep.per_prompt)} prompts.")
        if reused:      # one run, one story: notebook 01 measured the same wiring earlier in this run
            notes.append("The deployed rows are notebook 01's measurement (same pair, prompts, settings and "
                         "engine), not measured twice; each row's ratio is paired within its own benchmark.")
        elif step01 and step01.served:
            notes.append(agreement(step01.served, dep.to_dict(),
                                   "Deployed wiring, notebook 01 vs here (reference engine)") + ".")
        live01 = next((r for r in live_rows if r.wiring == "deployed"), None)
        if not reused and step01 and step01.live and live01:
            notes.append(agreement(step01.live, live01.to_dict(),
                                   f"Deployed wiring, notebook 01 vs here ({live01.backend})") + ".")
    notes.append("Accept lengths, per-position acceptance and losslessness are deterministic; each speedup "
                 "is a ratio on this machine, paired and interleaved against its own baseline, with its 95% "
                 "interval.")
    return notes
