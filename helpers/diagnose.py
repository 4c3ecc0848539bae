"""``python -m helpers diagnose``: which layout was this draft trained on, and what is it served?

Answers without being told the training layout: every boundary is captured once on
held-out text, every candidate layout is scored, and the best is compared with the layout
the engine resolves for the draft's config. A large gap is the wiring bug.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from . import cli
from .boundaries import layout_label
from .draft import run_as
from .dump_cli import run_dump_diagnosis
from .errors import check_finite, fail, print_json, read_text_file
from .evaluate import EvalInputError, evaluate_layout
from .layout_search import SearchResult, search
from .pair import MAX_STEPS, eval_captures, load_pair, plan_problems


@dataclass
class Diagnosis:
    best_layout: tuple[int, ...]
    best_acc: float
    best_ce: float
    served_layout: tuple[int, ...]
    served_acc: float | None        # None: the engine cannot fill the draft's fc (see served_errors)
    served_ce: float | None
    served_source: str
    served_notes: list[str]
    recorded_layout: tuple[int, ...] | None
    search: SearchResult
    num_layers: int
    steps: int
    best_full_acc: list[float]
    served_full_acc: list[float] | None
    served_errors: list[str] = field(default_factory=list)
    ranked_by: str = ""

    @property
    def trained_layout(self) -> tuple[int, ...]:
        """The record when there is one (it was written by the training run), else the search's answer."""
        return tuple(self.recorded_layout) if self.recorded_layout else tuple(self.best_layout)

    @property
    def confident_set(self) -> list[tuple[int, ...]]:
        """Layouts within noise of the best by the ranking's own paired test."""
        return self.search.confident_set

    @property
    def mismatch(self) -> bool:
        """Only a served layout significantly worse than the best is a wiring bug: one within noise of
        it is consistent with training, whatever the best's label (neighbouring boundaries of a
        residual stream can be near-interchangeable)."""
        return bool(self.served_errors) or tuple(self.served_layout) not in self.confident_set

    @property
    def record_disagrees(self) -> bool:
        """The record's layout is significantly worse than the best: a stale record, or too little text."""
        return bool(self.recorded_layout) and tuple(self.recorded_layout) not in self.confident_set

    @property
    def verdict(self) -> str:
        if self.served_errors:
            return "the engine cannot feed this draft: " + "; ".join(self.served_errors)
        if self.mismatch:
            return ("MISMATCH: the served wiring scores significantly worse than the layout the draft was "
                    "trained on")
        if len(self.confident_set) > 1:
            return (f"served wiring consistent with training: within noise of the best "
                    f"({len(self.confident_set)} layouts cannot be told apart on this text)")
        return "wiring matches: the served layout is the best"

    def to_dict(self) -> dict:
        return {
            "best_layout": list(self.best_layout),
            "best_label": layout_label(self.best_layout, self.num_layers),
            "best_acc": self.best_acc, "best_ce": self.best_ce, "best_full_acc": self.best_full_acc,
            "served_layout": list(self.served_layout),
            "served_label": layout_label(self.served_layout, self.num_layers),
            "served_acc": self.served_acc, "served_ce": self.served_ce,
            "served_full_acc": self.served_full_acc,
            "served_source": self.served_source, "served_notes": self.served_notes,
            "served_errors": self.served_errors,
            "recorded_layout": list(self.recorded_layout) if self.recorded_layout else None,
            "trained_layout": list(self.trained_layout), "record_disagrees": self.record_disagrees,
            "mismatch": self.mismatch, "verdict": self.verdict,
            "confident_set": [list(l) for l in self.confident_set], "ranked_by": self.ranked_by,
            "margin": self.search.margin_ce, "margin_acc": self.search.margin_acc,
            "z": self.search.z, "confident": self.search.confident, "search_seconds": self.search.seconds,
            "search_mode": self.search.mode, "evaluations": self.search.evaluations,
            "ranking": self.search.to_dict(top=10)["ranking"],
        }


def diagnose(pair, caps, engine: str, steps: int = 3, progress: bool = True) -> Diagnosis:
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    served = pair.served(engine)  # first: a bad engine string should not wait for the search
    errors = plan_problems(pair, served)
    named = [tuple(l) for l in (None if errors else served.layout, pair.recorded_layout)
             if l and len(l) == pair.draft.cfg.num_aux and all(b in caps.states for b in l)]
    # named layouts get the final measure too
    res = search(pair.draft, caps, progress=progress, include=named)
    rank_ce = {tuple(r["layout"]): float(r["ce"]) for r in res.ranking.to_dict("records")}
    best = evaluate_layout(pair.draft, caps, res.best, steps)
    srv = None
    notes = [*served.warnings, *served.notes]
    if not errors:
        with run_as(pair.draft, engine) as engine_notes:  # served: the engine's wiring and its forward
            srv = evaluate_layout(pair.draft, caps, served.layout, steps)
        notes += engine_notes

    check_finite(f"the best layout's score (acc {best.acc0}, ce {best.ce})", best.acc0, best.ce,
                 res.margin_ce)
    if srv is not None:
        check_finite(f"the served layout's score (acc {srv.acc0}, ce {srv.ce})", srv.acc0, srv.ce)
    ranked_by = str(res.ranking.loc[0, "scored_by"]) if "scored_by" in res.ranking else "step-0 ce"
    return Diagnosis(res.best, best.acc0, round(rank_ce[tuple(res.best)], 4), served.layout, srv and srv.acc0,
                     None if srv is None else round(rank_ce.get(tuple(served.layout), srv.ce), 4),
                     served.source, notes, pair.recorded_layout, res, pair.num_layers, steps, best.full_acc,
                     srv and srv.full_acc, errors, ranked_by=f"{ranked_by} (ce columns); accuracy beside it")


def main(argv=None) -> int:
    ap = cli.parser("diagnose", __doc__)
    cli.add_pair_args(ap)
    ap.add_argument("--text", type=Path, default=None,
                    help="held-out text to evaluate on (default: heldout.txt)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--windows", type=int, default=12, help="256-token windows of text to use")
    dump = ap.add_argument_group("from a trainer's hidden-state dump (no target forward; see docs/dumps.md)")
    dump.add_argument("--data", type=Path, default=None,
                      help="dump folder: hs_*.safetensors, data_*.pt + data_config.json, or "
                           "rows_*/data_*.ckpt[.gz]")
    dump.add_argument("--slot-boundaries", default=None,
                      help="each slot's boundary, e.g. 0,3,7,12 ('?' for unknown); default: the dump's "
                           "record or measured")
    dump.add_argument("--max-records", type=int, default=None)
    dump.add_argument("--max-tokens", type=int, default=None)
    dump.add_argument("--run-target", choices=("auto", "yes", "no"), default="auto",
                      help="match slots against the target's own capture (auto: when its weights are "
                           "under 4 GB)")
    a = ap.parse_args(argv)

    if not 1 <= a.steps <= MAX_STEPS:
        ap.error(f"--steps must be from 1 to {MAX_STEPS}, got {a.steps}")
    if a.windows < 2:
        ap.error(f"--windows must be at least 2 (the ranking's confidence needs more than one window), got "
                 f"{a.windows}")
    if a.data is not None:
        return run_dump_diagnosis(a)
    try:
        if a.text is not None and not a.text.is_file():
            raise FileNotFoundError(f"no text file at {a.text}")

        text = read_text_file(a.text, "text file") if a.text else None  # before the models load
        pair = load_pair(a.target, a.draft, a.device)
        caps = eval_captures(pair, text, max_windows=a.windows)
        d = diagnose(pair, caps, a.engine, a.steps, progress=not a.json)
    except (FileNotFoundError, ValueError, EvalInputError) as exc:  # InputError is a ValueError
        return fail(exc)
    if a.json:
        print_json(d.to_dict())
        return 0
    L = d.num_layers
    print(f"trained on (most likely): {layout_label(d.best_layout, L)} = {d.best_layout}   "
          f"step-0 acc {d.best_acc:.3f}   ce {d.best_ce:.3f}")
    print(f"   runner-up {d.search.runner_up}: margin {d.search.margin_ce:.3f} nats/token, z = "
          f"{d.search.z:.1f} "
          f"({'confident' if d.search.confident else 'NOT confident: evaluate on more text'})")
    if len(d.confident_set) > 1:
        print(f"   within noise of the best: {d.confident_set}")
    if d.served_errors:
        print(f"served by {a.engine}: {layout_label(d.served_layout, L) if d.served_layout else 'nothing'} = "
              f"{d.served_layout}   [{d.served_source}]  CANNOT FEED THIS DRAFT")
        for e in d.served_errors:
            print(f"   error: {e}")
    else:
        print(f"served by {a.engine}: {layout_label(d.served_layout, L)} = {d.served_layout}   "
              f"step-0 acc {d.served_acc:.3f}   ce {d.served_ce:.3f}   [{d.served_source}]")
    for n in d.served_notes:
        print(f"   note: {n}")
    if d.recorded_layout:
        print(f"training record says: {d.recorded_layout}"
              + ("  (the search prefers another layout: stale record, or evaluate on more text)"
                 if d.record_disagrees else "  (the search agrees)"))
    print(d.verdict)
    return 0
