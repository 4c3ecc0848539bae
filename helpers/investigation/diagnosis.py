"""One diagnosis of a pair where its target runs: every boundary captured once on held-out text, every
candidate layout scored and ranked, the best compared with the layout the engine serves, and the verdict.
``python -m helpers diagnose`` (``commands.diagnose``) parses its options, calls ``diagnose`` and prints."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from ..boundaries import ExitCode, layout_label
from ..errors import check_finite
from ..judgement import MIN_BLOCKS
from ..model.draft import forward_verdict, run_as
from ..rules.conventions import Engine
from .evaluate import RANKED_BY, EvalText, evaluate_layout, paired_test
from .evidence import IN_FOLDER, Basis, Evidence, training_evidence
from .layout_search import SearchResult, search
from .pair import more_captures, plan_problems
from .verdict import Acceptance, Settled, WiringVerdict, by_format, judge, read_format


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
    ranked_by: str = RANKED_BY
    wiring: WiringVerdict | None = None     # does served equal trained, and what the difference costs
    best_accept: float | None = None        # accepted tokens per verify step: the ranking's measure
    served_accept: float | None = None      # the same, under the engine's forward
    assumed_engine: str | None = None       # the release assumed when no --engine was given (said first)
    text: EvalText | None = None            # the text evaluated, and how much of it
    growth: str = ""                        # why more of it was evaluated, or why no more could be

    @property
    def training_layout(self) -> tuple[int, ...] | None:
        """What the draft was trained on, as the one chain settled it (``evidence.training_evidence``, then
        the ranking where it leaves one layout alone within noise); None while the ranking leaves several:
        those are ``candidates``, never a training layout."""
        if self.wiring is not None:
            return self.wiring.training_layout
        return tuple(self.recorded_layout) if self.recorded_layout else None

    @property
    def confident_set(self) -> list[tuple[int, ...]]:
        """Layouts within noise of the best by the ranking's own paired test."""
        return self.search.confident_set

    @property
    def mismatch(self) -> bool | None:
        """The served layout differs from the training layout: by rule when a record names it, from
        the confidence set when it is inferred (None: served is in the set, but so are others)."""
        return self.wiring.mismatch if self.wiring else bool(self.served_errors) or None

    @property
    def record_disagrees(self) -> bool:
        """The settled layout (a record, a trainer's rule) is significantly worse than the best: a stale
        record, ids edited after training, or too little text."""
        w = self.wiring
        known = (tuple(w.trained) if w is not None and w.trained_known and w.trained else
                 tuple(self.recorded_layout) if self.recorded_layout else None)
        return known is not None and known not in self.confident_set

    @property
    def verdict(self) -> str:
        return self.wiring.line if self.wiring else "no verdict"

    @property
    def exit_code(self) -> int:
        """``boundaries.ExitCode``, from the wiring verdict (3 when there is none)."""
        return self.wiring.exit_code if self.wiring is not None else ExitCode.UNDECIDED

    def to_dict(self) -> dict:
        return {
            "assumed_engine": self.assumed_engine,
            "best_layout": list(self.best_layout),
            "best_label": layout_label(self.best_layout, self.num_layers),
            "best_accept_length": self.best_accept,
            "best_acc": self.best_acc, "best_ce": self.best_ce, "best_full_acc": self.best_full_acc,
            "served_layout": list(self.served_layout),
            "served_label": layout_label(self.served_layout, self.num_layers),
            "served_accept_length": self.served_accept,
            "served_acc": self.served_acc, "served_ce": self.served_ce,
            "served_full_acc": self.served_full_acc,
            "served_source": self.served_source, "served_notes": self.served_notes,
            "served_errors": self.served_errors,
            "recorded_layout": list(self.recorded_layout) if self.recorded_layout else None,
            # ``trained_layout`` is the old name of ``training_layout``, kept as an alias for one release
            "trained_layout": None if self.training_layout is None else list(self.training_layout),
            "aliases": {"trained_layout": "training_layout (the old name, kept for one release)"},
            "record_disagrees": self.record_disagrees,
            **(self.wiring.to_dict() if self.wiring else {"mismatch": self.mismatch, "cost": None,
                                                          "significant": None, "verdict": self.verdict}),
            "confident_set": [list(l) for l in self.confident_set], "ranked_by": self.ranked_by,
            "steps": self.steps, "margin": self.search.margin, "margin_ce": self.search.margin_ce,
            "margin_acc": self.search.margin_acc, "z": self.search.z, "blocks": self.search.blocks,
            "confident": self.search.confident, "search_seconds": self.search.seconds,
            "search_mode": self.search.mode, "evaluations": self.search.evaluations,
            "ranking": self.search.to_dict(top=10)["ranking"],
            "text": None if self.text is None else self.text.to_dict() | {"growth": self.growth},
        }

    @property
    def settled(self) -> bool:
        """More text would not change what a user acts on: the verdict is decided, its cost measured on
        enough blocks, and an inferred training layout is the ranking's confident answer."""
        w = self.wiring
        if w is None or w.errors:
            return True
        if w.mismatch is None or (w.cost is not None and not w.cost.enough):
            return False
        return w.trained_known or self.search.confident


def diagnose(pair, caps, engine: Engine, steps: int = 3, progress: bool = True,
             rounds_per_s: float | None = None) -> Diagnosis:
    """``rounds_per_s``: a bench's verify steps per second (tok/s over accept length), to give the cost
    in tok/s too."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    served = pair.served(engine)  # first: a bad engine string should not wait for the search
    errors = plan_problems(pair, served)
    # the layout the chain settles (or, unsettled, every writer of the config's format reads its ids as) is
    # scored too, to be confirmed
    ev = chain(pair, engine, served)
    by_format = ev.layout or format_settled(pair, engine, served).layout
    named = [tuple(l) for l in (None if errors else served.layout, by_format)
             if l and len(l) == pair.draft.cfg.num_aux and all(b in caps.states for b in l)]
    # named layouts get the final measure too
    res = search(pair.draft, caps, progress=progress, include=named, steps=steps)
    rows = {tuple(r["layout"]): r for r in res.ranking.to_dict("records")}
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
    wiring = pair_verdict(pair, caps, engine, served, errors, steps, search=res, rounds_per_s=rounds_per_s,
                          served_score=srv, scores=[best])
    return _diagnosis(res, best, srv, served, notes, pair, steps, errors, rows, wiring)


def diagnose_text(pair, caps, engine: Engine, steps: int = 3, *, budget: int, progress: bool = True,
                  rounds_per_s: float | None = None) -> Diagnosis:
    """``diagnose``, evaluating more windows of the same text (doubling, up to ``budget`` windows or as
    many as the text holds) while the diagnosis is not ``settled``; it says which text, how much, and
    why it stopped."""
    start = caps.text.windows if caps.text else None
    d = diagnose(pair, caps, engine, steps, progress, rounds_per_s)
    while caps.text is not None and not d.settled:
        n = min(2 * caps.text.windows, budget, caps.text.available)
        if n <= caps.text.windows:
            break
        caps = more_captures(pair, caps, n, progress)
        d = diagnose(pair, caps, engine, steps, progress, rounds_per_s)
    d.text = caps.text
    t = caps.text
    if t is None or start is None:
        return d
    if not d.settled:
        d.growth = (f"still not settled at {t.windows} windows: the text holds no more; evaluate on more of "
                    f"your own text (--text)" if t.windows >= t.available else
                    f"still not settled at {t.windows} windows: the budget (--max-windows {budget}) is spent")
    elif t.windows > start:
        d.growth = f"grown from {start} windows until settled"
    return d


def _diagnosis(res, best, srv, served, notes, pair, steps, errors, rows, wiring) -> Diagnosis:
    served_row = rows.get(tuple(served.layout))
    served_ce = None if srv is None else round(float(served_row["ce"]) if served_row else srv.ce, 4)
    return Diagnosis(res.best, best.acc0, round(float(rows[tuple(res.best)]["ce"]), 4), served.layout,
                     srv and srv.acc0, served_ce, served.source, notes, pair.recorded_layout, res,
                     pair.num_layers, steps, best.full_acc, srv and srv.full_acc, errors,
                     ranked_by=f"{RANKED_BY}, {steps} draft steps; ce (mean over the steps) and step-0 "
                               f"accuracy beside it",
                     wiring=wiring, best_accept=round(best.sim_accept_length, 4),
                     served_accept=None if srv is None else round(srv.sim_accept_length, 4))


# --------------------------------------------------------------------------------------
# The verdict measured on a target's captures


def bench_rounds_per_s(bench) -> float | None:
    """A bench's verify steps per second (tok/s over accept length): the cost in tok/s. ``bench``: notebook
    01's report (its ``served`` row), or None."""
    served = getattr(bench, "served", None) if bench is not None else None
    return served["spec_tok_s"] / served["tau"] if served and served.get("tau") else None


def pair_verdict(pair, caps, engine: Engine, served, errors: Sequence[str], steps: int, *, search=None,
                 trained=None, rounds_per_s: float | None = None, served_score=None,
                 scores: Sequence = ()) -> WiringVerdict:
    """The verdict from a target's captures (``diagnose``, notebooks 02 and 03). The training layout:
    ``trained`` (a plan whose source says how it was settled: 'training record' and 'stated' are known,
    anything else is a guess) or else the pair's record, or else every writer of the config's format
    (confirmed by the ``search``), or else the search's best. The cost: trained minus served on ``caps``,
    the served layout run as ``engine`` runs it. ``served_score`` (under the engine's forward) and
    ``scores`` (under the draft's own) are reused when they were scored with ``steps`` already."""
    if trained is not None:
        layout = tuple(trained.layout) or None
        known = trained.source in ("training record", "stated")
        settled = Settled(layout, trained.source, known)
        confident = [layout] if known and layout else []
        in_folder = trained.source == "training record"
    else:
        if search is None:
            raise ValueError("pair_verdict needs the search's ranking or a trained plan")
        confident = search.confident_set
        settled, in_folder = _settle(pair, engine, served, search)
    cost = None
    if not errors and settled.layout:
        if served_score is None:
            with run_as(pair.draft, engine):
                served_score = evaluate_layout(pair.draft, caps, served.layout, steps)
        ref = next((s for s in scores if tuple(s.layout) == tuple(settled.layout) and s.steps == steps), None)
        ref = ref or evaluate_layout(pair.draft, caps, settled.layout, steps)
        cost = paired_test(ref.blocks(), served_score.blocks())
    return judge(tuple(served.layout) or None, settled.layout, known=settled.known, source=settled.source,
                 in_folder=settled.known and in_folder,
                 confident_set=confident, cost=cost, errors=errors, engine=engine, arch=pair.arch,
                 num_layers=pair.num_layers, rounds_per_s=rounds_per_s,
                 forward=forward_verdict(pair.draft, engine) if not errors else None, settled=settled,
                 at_served=Acceptance.of(served_score) if cost else None,
                 at_trained=Acceptance.of(ref) if cost else None,
                 paths=(str(pair.draft_dir), str(pair.target_dir)))


def format_settled(pair, engine: Engine, served, search=None) -> Settled:
    """The pair's config format read for its training layout against the ``served`` plan: before any
    ranking (``search`` None) the layout to score, after it confirmed or refused."""
    candidates = read_format(pair.draft_config, engine, pair.arch, pair.num_layers, tuple(served.layout),
                             served.errors)
    ranked = list(search.ranking["layout"]) if search is not None else ()
    return by_format(candidates, width=pair.draft.cfg.num_aux, ranked=ranked,
                     confident_set=search.confident_set if search is not None else ())


def chain(pair, engine: Engine, served) -> Evidence:
    """The pair's draft asked the one chain (``evidence.training_evidence``): what ``check``, ``fixes deploy``
    and the guard settle, this settles too."""
    return training_evidence(pair.draft_dir, pair.draft_config, engine=engine, arch=pair.arch,
                             num_layers=pair.num_layers, served=tuple(served.layout))


def _settle(pair, engine, served, search) -> tuple[Settled, bool]:
    """(the training layout as the chain settles it, else as the ranking confirms the format's prior, else
    the ranking's best (settled only where it is alone within noise); whether ``fixes deploy`` reads it
    from the draft folder)."""
    ev = chain(pair, engine, served)
    contradicted = _contradicted(ev, search)
    if ev.settled and not contradicted:
        return Settled(ev.layout, ev.source, True), ev.basis in IN_FOLDER
    fmt = format_settled(pair, engine, served, search)
    if fmt.known and not contradicted:
        return fmt, False
    said = ev.note if ev.basis is not Basis.FORMAT else ""
    note = "; ".join(dict.fromkeys(x for x in (contradicted, said, fmt.note) if x))   # each said once
    return Settled(tuple(search.best), "inferred by the layout search", False, fmt.candidates, note), False


def _contradicted(ev: Evidence, search) -> str:
    """A layout read by a rule on the config's ids (the trainer the config names) that the ranking separates
    from the best: the ids were edited after training (the original case's bug is exactly that), so the
    measurement decides. What was stated at training (a record, the trainer's output, a trainer named) is
    never overruled: a disagreement there is a note (``record_disagrees``)."""
    if ev.basis is not Basis.CONFIG or search is None or search.blocks < MIN_BLOCKS:
        return ""
    ranked = {tuple(x) for x in search.ranking["layout"]}
    if tuple(ev.layout) not in ranked or tuple(ev.layout) in {tuple(x) for x in search.confident_set}:
        return ""
    return (f"{ev.source} gives {ev.layout}, but the ranking separates that layout from the best: the "
            f"config's ids are not the training's")
