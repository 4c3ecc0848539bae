"""Notebook 02's step, whichever pipeline feeds it: the draft scored outside the engine, fed the wiring it was
trained on and the one the engine serves, either from the target's own capture on held-out text or, at a large
target's scale, from the trainer's hidden-state dump (``data``: nothing of the target runs).

``isolate`` runs one pipeline or the other and returns the same record (``Isolated``); ``story.isolated``
words its finding; ``Isolated.verdict`` and ``Isolated.step`` give the wiring verdict and the report record
notebook 03 reads. Lines that say what is running are printed as they happen (``say``)."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import pandas as pd

from ..boundaries import CapturePlan, parse_layout


@dataclass
class Isolated:
    iso: pd.DataFrame                  # one row per wiring: full_acc_k, cond_acc_k, sim_accept_length
    served: CapturePlan
    trained: CapturePlan
    served_problems: list[str]
    tokens: int
    data: str | None = None            # the dump's path, when the rows come from it
    dump: object | None = field(default=None, repr=False)    # its DumpDiagnosis
    caps: object | None = field(default=None, repr=False)    # the target's capture, otherwise

    @property
    def source(self) -> str:
        return "dump" if self.data else "target capture"

    def row(self, prefix: str):
        rows = self.iso[self.iso.wiring.str.startswith(prefix)]
        return None if rows.empty else rows.iloc[0]

    def verdict(self, pair, rules, steps: int, rounds_per_s=None):
        """Does the served wiring equal the trained one, and what the difference costs (accepted tokens per
        verify step; tok/s where notebook 01's bench gives the rounds per second)."""
        from ..investigation.diagnosis import pair_verdict

        if self.dump is not None:
            return dataclasses.replace(self.dump.wiring, rounds_per_s=rounds_per_s)
        return pair_verdict(pair, self.caps, rules, self.served, self.served_problems, steps,
                            trained=self.trained, rounds_per_s=rounds_per_s)

    def step(self, wiring):
        """The report record notebook 03 reads."""
        from .reports import IsolateStep, PlanRef, frame_records

        dump_report = None
        if self.dump is not None:
            dump_report = {k: v for k, v in self.dump.to_dict().items() if k != "ranking"}
            dump_report["ranking"] = self.dump.to_dict(top=10)["ranking"]
        return IsolateStep(trained=PlanRef(list(self.trained.layout), self.trained.source),
                           served=PlanRef(list(self.served.layout), self.served.source,
                                          list(self.served_problems)),
                           rows=frame_records(self.iso), tokens=self.tokens, source=self.source,
                           dump=dump_report, wiring=wiring.to_dict())


def isolate(nb, rules, steps: int, *, data=None, training_layout: str | None = None, eval_windows: int = 12,
            say: Callable[[str], None] = print) -> Isolated:
    """The draft of ``nb`` (``setup_notebook``'s result) fed its trained and its served wiring."""
    stated = parse_layout(training_layout) if training_layout else None
    if data:
        return _from_dump(nb, rules, steps, data, stated or nb.recorded_layout, say)
    return _from_target(nb, rules, steps, stated, eval_windows, say)


def _from_dump(nb, rules, steps, data, recorded, say) -> Isolated:
    from ..investigation.dump_diagnose import diagnose_dump
    from ..investigation.dumps import open_dump

    dump = open_dump(data)
    say(f"scoring every choice of {nb.draft.cfg.num_aux} of the dump's {dump.num_slots} slots, streaming "
        f"{len(dump.files)} records of {data} ({dump.format})...")
    dd = diagnose_dump(nb.draft, dump, heads=nb.heads, target=nb.small_target, engine=rules,
                       draft_config=nb.draft_config, arch=nb.arch, num_layers=nb.num_layers, steps=steps,
                       recorded=recorded)
    for s in dd.slots:
        say(f"slot {s.slot}: boundary {s.boundary if s.boundary is not None else '?'}  [{s.how}]")
    for n in dd.notes:
        say(f"note: {n}")
    served = CapturePlan(tuple(dd.served_layout or ()), nb.num_layers, dd.served_source or str(rules))
    tl = dd.trained_layout or recorded or ()
    trained = CapturePlan(tuple(tl), nb.num_layers,
                          "the trainer's slot choice in the dump" if dd.trained_layout else "record")
    say(f"isolated test from the dump: {dd.records} records, {dd.tokens} scored tokens; labels: {dd.labels}")
    say(dd.verdict)
    return Isolated(dd.comparison(), served, trained, list(dd.served_errors), dd.tokens, str(data), dump=dd)


def _from_target(nb, rules, steps, stated, eval_windows, say) -> Isolated:
    from ..investigation.layout_search import compare_layouts
    from ..investigation.pair import eval_captures, plan_problems, trained_plan
    from ..model.draft import run_as

    pair = nb.pair
    caps = eval_captures(pair, max_windows=eval_windows, progress=True)
    served = pair.served(rules)
    trained = CapturePlan(stated, nb.num_layers, "stated") if stated else trained_plan(pair, caps)
    say(f"evaluating on {caps.tokens} held-out tokens; served {served.label}, trained {trained.label} "
        f"({trained.source})")
    for w in served.warnings:
        say(f"warning: {w}")
    problems = plan_problems(pair, served)
    iso = compare_layouts(pair.draft, caps, {f"trained {trained.label}": trained.layout}, steps,
                          no_features_row=True)
    if problems:
        say("the served wiring cannot feed this draft at all: " + "; ".join(problems))
    else:
        with run_as(pair.draft, rules) as engine_notes:   # served: the engine's wiring and its forward
            served_row = compare_layouts(pair.draft, caps, {f"served {served.label}": served.layout}, steps)
        for n in engine_notes:
            say(f"note: {n}")
        iso = pd.concat([iso.iloc[:1], served_row, iso.iloc[1:]], ignore_index=True)
    return Isolated(iso, served, trained, problems, caps.tokens, caps=caps)


def with_training_log(result: Isolated, val: dict, recorded_layout, steps: int) -> Isolated:
    """The training log's own validation figures as the first row, where the record has them."""
    if val.get("full_acc") and val.get("cond_acc") and recorded_layout:
        row = {"wiring": "training log (validation)", "layout": tuple(recorded_layout),
               **{f"full_acc_{j}": val["full_acc"][j] for j in range(steps)},
               **{f"cond_acc_{j}": val["cond_acc"][j] for j in range(steps)}}
        result.iso = pd.concat([pd.DataFrame([row]), result.iso], ignore_index=True)
    return result
