"""One verdict on a draft's wiring: the ways out of a mismatch, and the judgement.

Two questions kept apart. Does the served layout equal the trained one? That is decided by rule when
the training layout is known (a record, a statement, a dump format's slot choice, or every trainer that
writes the draft config's format reading its ids alike), else from the ranking's confidence set. What
does the difference cost? That is measured: trained minus served in accepted tokens per verify step.

- ``ways_out``: every way out of a mismatch, as data (fix C: reorder the fc; fix A: write ids; the
  boundary-0 patch, then fix A; fix B: retrain). ``check`` lists them all (``WaysOut.listed``), a
  verdict names the shortest (``WaysOut.shortest``).
- ``writer_candidates`` / ``by_format``: who could have written a config of this format and what its
  ids would mean to each; where they all agree (and the ranking does not contradict it), that settles
  the training layout "by format".
- ``judge``: the :class:`WiringVerdict` from the served plan, the settled training layout, the ranking's
  confidence set and the cost; ``pair_verdict`` measures that cost on a target's captures first
(``diagnose``, notebooks 02 and 03); ``diagnose --data`` measures it from a dump and calls ``judge``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Sequence

from ..boundaries import Layout, ProblemKind, WiringError
from ..judgement import Judgement, PairedTest, Verdict, compare, deploy_command
from ..rules.conventions import IDS_KEY, Engine, expect_engine
from ..rules.wiring import ids_for_layout, resolve
from .evidence import (  # noqa: F401
    SETTLE,
    Settled,
    agreed_layout,
    by_format,
    candidate_table,
    read_format,
    writer_candidates,
)

# --------------------------------------------------------------------------------------
# The ways out of a mismatch


class WayKind(StrEnum):
    """A way out of a mismatch; values are the spellings JSON carries."""

    REORDER_FC = "reorder-fc"          # fix C: permute the fc columns into the engine's ascending order
    WRITE_IDS = "write-ids"            # fix A: ids that make the engine serve the trained layout
    PATCH_THEN_IDS = "patch-then-ids"  # the boundary-0 patch, then fix A's ids
    RETRAIN = "retrain"                # fix B: retrain the draft on the served layout


# where fix A writes the ids (``engine.rules.fix_ids_at``), then how ``check`` and a verdict name it
SPECULATIVE_CONFIG = "speculative-config"
GGUF_CONVERSION = "gguf-conversion"     # llama.cpp: the ids are fixed in the GGUF when the draft is converted
_RECONVERT = (f"the draft config's top-level {IDS_KEY}, then the draft converted again "
              f"(convert_hf_to_gguf.py --target-model-dir TARGET)")
_LISTED_WHERE = {"eagle_config": f"eagle_config.{IDS_KEY}", "top-level": f"top-level {IDS_KEY}",
                 SPECULATIVE_CONFIG: "eagle3_layers_to_capture of the speculative config (the launch options "
                                     "YAML, trtllm-serve --extra_llm_api_options FILE)",
                 GGUF_CONVERSION: _RECONVERT}
_SHORT_WHERE = {"eagle_config": "eagle_config", "top-level": "the top-level key",
                SPECULATIVE_CONFIG: "eagle3_layers_to_capture of the speculative config",
                GGUF_CONVERSION: _RECONVERT}


@dataclass(frozen=True)
class WayOut:
    """One way out: its ``kind``, the sentence ``check`` lists, and what to do as data."""

    kind: WayKind
    message: str
    ids: tuple[int, ...] | None = None    # the ids to write (fix A, also after the patch)
    where: str | None = None              # where the engine reads them: a key of _LISTED_WHERE
    command: str | None = None            # a command to run first (the patch, from the resolver's problem)
    layout: Layout | None = None          # the layout the fc then takes, or is retrained on


@dataclass(frozen=True)
class WaysOut:
    """Every way to serve ``trained`` on ``engine`` instead of ``served``, in the order ``check`` lists
    them."""

    engine: str
    trained: Layout
    served: Layout
    ways: tuple[WayOut, ...]

    def of(self, kind: WayKind) -> WayOut | None:
        return next((w for w in self.ways if w.kind == kind), None)

    def kinds(self) -> list[WayKind]:
        return [w.kind for w in self.ways]

    @property
    def listed(self) -> str:
        """Every way out, as ``check`` prints its fix: retraining last, after an 'or'."""
        return "; ".join(("or " if w.kind == WayKind.RETRAIN and i else "") + w.message
                         for i, w in enumerate(self.ways))

    @property
    def shortest(self) -> str:
        """The shortest way to serve the trained layout, or retraining, as a verdict names it."""
        retrain = f"retrain the draft on {self.served}"
        patch, ids = self.of(WayKind.PATCH_THEN_IDS), self.of(WayKind.WRITE_IDS)
        if patch is not None:
            return (f"patch SGLang (`{patch.command}`), then ids {list(patch.ids)} in "
                    f"{_SHORT_WHERE[patch.where]}, or {retrain}")
        if ids is None:
            return (f"no ids make {self.engine} serve {self.trained}: `python -m helpers check` lists the "
                    f"ways out, or {retrain}")
        head = ("permute the fc columns (helpers.investigation.fixes.reorder_fc), then write "
                if self.of(WayKind.REORDER_FC) else "")
        return f"{head}ids {list(ids.ids)} in {_SHORT_WHERE[ids.where]}, or {retrain}"

    def to_list(self) -> list[dict]:
        return [{"kind": str(w.kind), "message": w.message, "ids": list(w.ids) if w.ids is not None else None,
                 "where": w.where, "command": w.command,
                 "layout": list(w.layout) if w.layout is not None else None} for w in self.ways]


def ways_out(trained: Sequence[int], served: Sequence[int], engine: Engine, arch: str, num_layers: int, *,
             root=None) -> WaysOut:
    """The ways out of serving ``served`` to a draft trained on ``trained``: the fc reordered when the
    training order is not ascending (engines concatenate in ascending order), ids that make ``engine``
    serve the trained set, else (SGLang) the boundary-0 patch that lets such ids through, and retraining.
    ``root``: an SGLang tree to resolve with (a patched copy)."""
    eng = expect_engine(engine)
    trained, served = tuple(trained), tuple(served)
    ascending = tuple(sorted(trained))
    where = eng.rules.fix_ids_at
    ways = []
    if ascending != trained:
        ways.append(WayOut(WayKind.REORDER_FC,
                           f"the draft was trained on {trained}, not in ascending order, and engines "
                           f"concatenate in ascending order: permute the fc columns "
                           f"(helpers.investigation.fixes.reorder_fc) and write the ids",
                           layout=ascending))
    try:
        ids = ids_for_layout(trained, arch, num_layers, eng, root=root)
    except (WiringError, ValueError):
        ids = None
    if ids is not None:
        ways.append(WayOut(WayKind.WRITE_IDS,
                           f"write ids {ids} in {_LISTED_WHERE[where]} (no engine change)",
                           tuple(ids), where, layout=ascending))
    elif eng.rules.patchable:
        patched = _patch_then_ids(eng, arch, num_layers, ascending, where, root)
        if patched is not None:
            ways.append(patched)
    ways.append(WayOut(WayKind.RETRAIN, f"retrain the draft on the served layout {served}",
                       layout=served))
    return WaysOut(str(eng), trained, served, tuple(ways))


def _patch_then_ids(eng, arch: str, num_layers: int, ascending: Layout, where: str, root) -> WayOut | None:
    """Ids whose only obstacle is a boundary-0 capture meeting ``residual = None``, which the workbook's
    patch removes: the patch's command is the resolver's problem's fix, never cut out of its text."""
    for candidate in ([b - 1 for b in ascending], list(ascending)):
        try:
            r = resolve(eng, arch, num_layers, ids=candidate, root=root)
        except (WiringError, ValueError):
            continue
        blocking = [p for p in r.problems if p.blocking]
        patch = [p.fix for p in r.problems if p.kind == ProblemKind.BOUNDARY0_RESIDUAL_NONE and p.fix]
        if r.served_layout == ascending and patch and len(patch) == len(blocking):
            return WayOut(WayKind.PATCH_THEN_IDS,
                          f"patch the engine (`{patch[0]}`), then write ids {candidate} in "
                          f"{_LISTED_WHERE[where]}", tuple(candidate), where, patch[0], ascending)
    return None


def layout_fix(trained, served, engine: Engine | None, arch: str | None, num_layers: int | None, *,
               root=None) -> str | None:
    """The shortest way to serve ``trained`` (``WaysOut.shortest``); None when something it needs is
    missing. ``check`` lists every way out with its conditions."""
    ways = _ways(trained, served, engine, arch, num_layers, root)
    return None if ways is None else ways.shortest


@dataclass(frozen=True)
class Fix:
    """A verdict's fix as data: the sentence, the ids that serve the trained layout (None: no ids alone
    do) and the command that writes a deployable copy with them (None: no paths, or no ids)."""

    text: str | None = None
    ids: tuple[int, ...] | None = None
    command: str | None = None


def verdict_fix(trained, served, engine: Engine | None, arch: str | None, num_layers: int | None, *,
                paths: tuple[str, str] | None = None, with_layout: bool = False) -> Fix:
    """The shortest way out as a :class:`Fix`. ``paths`` (the draft's and the target's folders): where ids
    alone serve the trained layout, the fix is the ``fixes deploy`` command, the hand edit beside it;
    ``with_layout``: the command carries the layout (``fixes deploy`` cannot re-derive it from the folder)."""
    ways = _ways(trained, served, engine, arch, num_layers, None)
    if ways is None:
        return Fix()
    ids = ways.of(WayKind.WRITE_IDS)
    if ids is None or paths is None:
        return Fix(ways.shortest, ids.ids if ids else None)
    command = deploy_command(*paths, ways.engine) + (
        f" --layout {','.join(map(str, trained))}" if with_layout else "")
    hand = ("permute the fc columns, then " if ways.of(WayKind.REORDER_FC) else "") + (
        f"ids {list(ids.ids)} in {_SHORT_WHERE[ids.where]}")
    return Fix(f"`{command}` (by hand: {hand}), or retrain the draft on {ways.served}", ids.ids, command)


def _ways(trained, served, engine, arch, num_layers, root) -> WaysOut | None:
    if trained is None or served is None or not arch or num_layers is None or engine is None:
        return None
    return ways_out(trained, served, engine, arch, num_layers, root=root)


# --------------------------------------------------------------------------------------
# The verdict

# A gain under this fraction of the accept length wired as trained changes throughput by less than any
# benchmark of a few prompts resolves: a fix that buys it does not explain (or cure) low acceptance.
MATERIAL = 0.02


def material(gain: float, accept_length: float) -> bool:
    """A gain in accepted tokens per step worth a fix: at least ``MATERIAL`` of the accept length."""
    return gain >= MATERIAL * accept_length


class Cost(StrEnum):
    """Does a measured difference matter: the one rule every command, the metrics and the notebooks say."""

    MATTERS = "matters"          # the paired test separates them and the interval's low end is material
    NEGLIGIBLE = "negligible"    # measured on enough text, not MATTERS: a fix does not recover acceptance
    UNSIZED = "unsized"          # too few blocks of tokens to size it


def cost_of(c: PairedTest, accept_length: float | None) -> Cost:
    """``c`` (trained minus served) against the accept length the draft reaches wired right: it matters
    only when the test separates them and even the interval's low end is ``MATERIAL``; where the accept
    length is not known, when the test separates them."""
    if not c.enough:
        return Cost.UNSIZED
    low = c.difference - c.half_width
    matters = c.significant and low > 0 and (accept_length is None or material(low, accept_length))
    return Cost.MATTERS if matters else Cost.NEGLIGIBLE


COST_WORDS = {Cost.MATTERS: "it matters: the paired test separates them{by}",
              Cost.NEGLIGIBLE: "negligible: not separated, or under {pct} of the accept length wired right",
              Cost.UNSIZED: "too few blocks of tokens to size it"}


@dataclass(frozen=True)
class Acceptance:
    """What a draft accepts at one layout on the evaluated text: tokens per verify step (one more than
    the accepted draft tokens) and, per draft position i, the share of steps whose tokens 0..i were all
    accepted."""

    accept_length: float
    per_step: tuple[float, ...]

    @classmethod
    def of(cls, score) -> Acceptance:
        """From a ``LayoutScore`` (a target's captures) or a dump's summary row (a dict)."""
        if isinstance(score, dict):
            return cls(float(score["sim_accept_length"]), tuple(float(x) for x in score["full_acc"]))
        return cls(float(score.sim_accept_length), tuple(float(x) for x in score.full_acc))

    @property
    def steps(self) -> int:
        return len(self.per_step)

    def text(self) -> str:
        return (f"{self.accept_length:.2f} of at most {self.steps + 1} (per draft position "
                f"{', '.join(f'{x:.2f}' for x in self.per_step)})")

    def to_dict(self) -> dict:
        return {"accept_length": round(self.accept_length, 4),
                "per_step": [round(x, 4) for x in self.per_step], "at_most": self.steps + 1}


@dataclass
class WiringVerdict:
    """Does the served wiring equal the trained one, and what does the difference cost?

    The first is decided by rule when the training layout is known (a record, a trainer's rule,
    a dump format's slot choice, every writer of the config's format): layouts that differ are a
    mismatch whatever they score, because a neighbour that is nearly interchangeable on one weak target
    costs far more on a deeper or stronger one. Only when the training layout is inferred does the
    ranking's confidence set decide it. The second is measured: trained minus served in accepted tokens
    per verify step, with its interval and whether the paired test separates them."""

    served: tuple[int, ...] | None
    trained: tuple[int, ...] | None
    trained_known: bool                  # by rule; False: inferred from the ranking
    trained_source: str
    confident_set: list[tuple[int, ...]]
    cost: PairedTest | None              # trained - served (positive: served accepts fewer tokens)
    fix: str | None = None
    errors: list[str] = field(default_factory=list)
    cost_note: str = ""                  # why there is no cost, when there is none
    rounds_per_s: float | None = None    # a bench's verify steps per second: the cost in tok/s
    # forward flags the draft was trained with that the engine never runs, with their fix: the layout can
    # agree and the engine still run another forward (draft.ignored_flags)
    forward: list[str] = field(default_factory=list)
    forward_fix: str | None = None
    # the config format's writers, when no record named the layout, and why they did not settle it
    candidates: list[dict] = field(default_factory=list)
    format_note: str = ""
    # what the draft accepts as served and as trained (its ceiling wired right), on the same text
    at_served: Acceptance | None = None
    at_trained: Acceptance | None = None
    fix_ids: tuple[int, ...] | None = None     # the fix's ids and command, as data (``Fix``)
    fix_command: str | None = None
    engine: str = ""                           # whose rules served it

    @property
    def forward_mismatch(self) -> bool:
        return bool(self.forward)

    @property
    def mismatch(self) -> bool | None:
        """The served layout differs from the training layout; None when that cannot be decided."""
        if self.errors:
            return True
        if self.served is None or self.trained is None:
            return None
        if self.trained_known:
            return tuple(self.served) != tuple(self.trained)
        cs = [tuple(c) for c in self.confident_set]
        if tuple(self.served) not in cs:
            return True
        return False if cs == [tuple(self.served)] else None

    @property
    def significant(self) -> bool | None:
        return None if self.cost is None else self.cost.significant

    @property
    def cost_class(self) -> Cost | None:
        """Does the difference matter (``cost_of``); None when unmeasured."""
        if self.cost is None:
            return None
        return cost_of(self.cost, self.at_trained.accept_length if self.at_trained else None)

    @property
    def settled(self) -> bool:
        """The training layout is settled: by rule, or by a ranking that leaves it alone within noise."""
        return self.trained is not None and (
            self.trained_known or [tuple(c) for c in self.confident_set] == [tuple(self.trained)])

    @property
    def training_layout(self) -> tuple[int, ...] | None:
        """What the draft was trained on, where settled; an unsettled ranking's best is never it."""
        return tuple(self.trained) if self.settled else None

    @property
    def candidates_set(self) -> list[tuple[int, ...]]:
        """Unsettled: the layouts within noise of each other, any of them possibly the trained one."""
        return [] if self.settled else [tuple(c) for c in self.confident_set]

    @property
    def judgement(self) -> Judgement:
        """The verdict's kind: BLOCKED (the engine cannot feed the draft), MISWIRED or ORDER (served is not
        trained), IGNORED_FLAG (the layouts agree, the engine runs another forward), UNKNOWN (undecided),
        MATCH."""
        if self.errors:
            return Judgement.BLOCKED
        m = self.mismatch
        if m:
            kind = compare(self.served, self.trained)
            return kind if kind is not Judgement.MATCH else Judgement.MISWIRED
        if self.forward:
            return Judgement.IGNORED_FLAG
        return Judgement.UNKNOWN if m is None or self.served is None else Judgement.MATCH

    @property
    def costless(self) -> bool:
        """A mismatch whose measured cost does not matter (``cost_of``), the forward the draft's own."""
        return (self.judgement in (Judgement.MISWIRED, Judgement.ORDER) and not self.forward
                and self.cost_class is Cost.NEGLIGIBLE)

    @property
    def judged(self) -> Verdict:
        """This verdict as every judge says one (``judgement.Verdict``)."""
        return Verdict(self.judgement, "diagnose", self.engine, self.served, self.training_layout,
                       self.trained_source, self.line, self.fix if self.mismatch else self.forward_fix,
                       self.fix_command if self.mismatch else None, self.costless)

    @property
    def exit_code(self) -> int:
        """The one convention (``boundaries.ExitCode``, by ``judged``): 0 served = trained, or a difference
        measured on enough text to cost nothing measurable; 1 a problem found; 3 cannot decide. (2, bad
        input, is the edge's.)"""
        return self.judged.exit_code

    def cost_text(self) -> str:
        c = self.cost
        if c is None:
            return self.cost_note
        verb = "costs" if c.difference >= 0 else "gains"
        by = f", by at least {MATERIAL:.0%} of the accept length wired right" if self.at_trained else ""
        sig = COST_WORDS[self.cost_class].format(pct=f"{MATERIAL:.0%}", by=by)
        if self.cost_class is Cost.UNSIZED:
            sig = f"{c.blocks} blocks of tokens: {sig}"
        text = (f"on this text it {verb} {abs(c.difference):.2f} ± {c.half_width:.2f} accepted tokens per "
                f"step ({sig})")
        if self.rounds_per_s:
            text += (f", about {abs(c.difference) * self.rounds_per_s:.1f} ± "
                     f"{c.half_width * self.rounds_per_s:.1f} tok/s at the bench's {self.rounds_per_s:.1f} "
                     f"verify steps per second")
        return text

    @property
    def accept_figures(self) -> str | None:
        """The accept length as served, wired as trained (the gain a fix buys, with its interval), and what
        the draft reaches at most wired right; None when either side was not measured."""
        s, t, c = self.at_served, self.at_trained, self.cost
        if s is None or t is None or c is None:
            return None
        trained = "at the training layout" if self.trained_known else "at the best-scoring layout"
        return (f"{s.accept_length:.2f} as served, {t.accept_length:.2f} {trained} ({_signed(c)} tokens per "
                f"step); the draft wired right reaches {t.text()}")

    @property
    def figures(self) -> str | None:
        """``accept_figures`` as a command's line."""
        body = self.accept_figures
        return None if body is None else f"accept length {body}"

    @property
    def symptom(self) -> str | None:
        """One sentence: is the wiring why acceptance is what it is? From the measured gain, its interval
        and its size against the accept length wired as trained (``MATERIAL``); None when unmeasured."""
        if self.errors:
            return ("the engine cannot feed this draft as configured: nothing is accepted until the wiring "
                    "is fixed")
        t, c = self.at_trained, self.cost
        if t is None or c is None:
            return None
        what = "the engine's forward" if self.forward and self.mismatch is False else "the wiring"
        size = f"{c.difference:.2f} [{c.difference - c.half_width:.2f}, {c.difference + c.half_width:.2f}]"
        tops = f"the draft itself tops out at {t.accept_length:.2f} here"
        m = self.mismatch
        if m is False and not self.forward:
            return f"the wiring is right, so acceptance is the draft's own: {tops}"
        kind = self.cost_class
        if kind is Cost.UNSIZED:
            return (f"{what} costs {size} accepted tokens per step on {c.blocks} blocks of tokens, too few "
                    f"to size it: evaluate on more of your own text (--text, --windows)")
        if m is None:         # undecided: the best-scoring layout stands in for the training one
            if not material(c.difference + c.half_width, t.accept_length):
                return (f"the served layout scores within {size} of the best-scoring one: whichever the "
                        f"training layout is, rewiring will not recover acceptance; {tops}")
            return (f"{what} may cost up to {c.difference + c.half_width:.2f} accepted tokens per step "
                    f"against the best-scoring layout: settle which layout the draft was trained on")
        if kind is Cost.MATTERS:
            return (f"{what} costs {size} accepted tokens per step: fix it, and the draft reaches "
                    f"{t.accept_length:.2f}")
        if c.significant and c.difference < 0:
            return (f"the served layout accepts {-c.difference:.2f} [{-c.difference - c.half_width:.2f}, "
                    f"{-c.difference + c.half_width:.2f}] more tokens per step than the training layout on "
                    f"this text: the wiring does not explain low acceptance; {tops}")
        return f"{what} costs {size}: fixing it will not recover acceptance; {tops}"

    @property
    def head(self) -> list[str]:
        """The verdict's first lines, as every command prints them: the judgement, what the draft accepts
        each way, and the one sentence on the user's symptom."""
        return [x for x in (self.line, self.figures, self.symptom) if x]

    def at_most(self) -> str:
        """What serving costs against the best-scoring layout, read as its interval's upper end: what an
        undecided verdict can promise."""
        c = self.cost
        worst = max(c.difference + c.half_width, 0.0)
        return (f"against the best-scoring {tuple(self.trained)} its accept length is at most {worst:.2f} "
                f"lower ({self.cost_text()})")

    @property
    def line(self) -> str:
        if self.errors:
            return "MISMATCH: the engine cannot feed this draft: " + "; ".join(self.errors)
        m, srv, trn = self.mismatch, self.served, self.trained
        if srv is None:
            return ("no verdict: the served layout was not resolved or is not known in these states; "
                    + (f"the draft was trained on {tuple(trn)} ({self.trained_source})" if trn else
                       "neither is the training layout"))
        cost = self.cost_text()
        tail = "; ".join(p for p in (cost, f"fix: {self.fix}" if self.fix and m else "") if p)
        mismatch = "MISMATCH, NEGLIGIBLE COST" if self.costless else "MISMATCH"
        if self.trained_known:
            if m:
                return (f"{mismatch}: served {tuple(srv)} ≠ trained {tuple(trn)} ({self.trained_source}); "
                        f"{tail}")
            if self.forward:
                fix = f"; fix: {self.forward_fix}" if self.forward_fix else ""
                return (f"FORWARD MISMATCH: served {tuple(srv)} = trained {tuple(trn)} "
                        f"({self.trained_source}), but the engine runs another forward "
                        f"({'; '.join(self.forward)})"
                        + (f"; under that forward, {cost}" if cost else "") + fix)
            same = f"OK: served {tuple(srv)} = trained {tuple(trn)} ({self.trained_source})"
            return same + (f"; under the engine's forward {cost}" if self.cost and self.cost.difference
                           else "")
        others = [c for c in self.confident_set if tuple(c) != tuple(srv)]
        how = "measured by the ranking" if self.settled else "inferred"
        inferred = f"the training layout is {how} (no record or rule names it)" + (
            f"; {self.format_note}" if self.format_note else "")
        if m and self.settled:
            return (f"{mismatch}: served {tuple(srv)} ≠ {tuple(trn)}, the only layout within noise of the "
                    f"best ({inferred}); {tail}")
        if m:
            return (f"{mismatch}: served {tuple(srv)} is outside the confidence set "
                    f"({_short(self.confident_set)}; {inferred}); {tail}")
        if m is None:
            return (f"UNDECIDED: served {tuple(srv)} is in the confidence set, but so are others "
                    f"({_short(others)}); {inferred}" + (f"; {self.at_most()}" if self.cost else "")
                    + "; settle it: write the training record (`python -m helpers fixes record --draft DRAFT "
                      "--layout B1,B2,B3`), name the trainer (`check --trainer NAME==VERSION`), or re-run "
                      "`diagnose` on more text (--windows, --text)")
        return f"OK: served {tuple(srv)} is the only layout in the confidence set ({inferred})"

    def to_dict(self) -> dict:
        cost = self.cost.to_dict() if self.cost else None
        if cost and self.rounds_per_s:
            cost["tok_s"] = {"difference": round(self.cost.difference * self.rounds_per_s, 2),
                             "half_width": round(self.cost.half_width * self.rounds_per_s, 2),
                             "rounds_per_s": round(self.rounds_per_s, 3)}
        return {"mismatch": self.mismatch, "forward_mismatch": self.forward_mismatch, "forward": self.forward,
                "cost": cost, "significant": self.significant,
                "cost_class": None if self.cost_class is None else str(self.cost_class),
                "judgement": str(self.judgement),
                "training_layout": None if self.training_layout is None else list(self.training_layout),
                "candidate_layouts": [list(c) for c in self.candidates_set],
                "trained_known": self.trained_known, "trained_source": self.trained_source,
                "fix": self.fix if self.mismatch else self.forward_fix, "verdict": self.line,
                "candidates": self.candidates, "exit_code": self.exit_code,
                "accept_length": {"served": self.at_served.to_dict() if self.at_served else None,
                                  "trained": self.at_trained.to_dict() if self.at_trained else None},
                "symptom": self.symptom,
                "fix_ids": list(self.fix_ids) if self.mismatch and self.fix_ids is not None else None,
                "fix_command": self.fix_command if self.mismatch else None}


def _signed(c: PairedTest) -> str:
    """A gain with its interval: ``+1.41 [1.30, 1.52]``."""
    return f"{c.difference:+.2f} [{c.difference - c.half_width:.2f}, {c.difference + c.half_width:.2f}]"


def _short(layouts, n: int = 4) -> str:
    ls = [tuple(x) for x in layouts]
    return ", ".join(map(str, ls[:n])) + (f" and {len(ls) - n} more" if len(ls) > n else "")


def judge(served, trained, *, known: bool, source: str, confident_set=(), cost: PairedTest | None = None,
          errors: Sequence[str] = (), engine: Engine | None = None, arch: str | None = None,
          num_layers: int | None = None, cost_note: str = "", rounds_per_s: float | None = None,
          forward: tuple[list[str], str | None] | None = None, settled: Settled | None = None,
          at_served: Acceptance | None = None, at_trained: Acceptance | None = None,
          paths: tuple[str, str] | None = None, in_folder: bool = True) -> WiringVerdict:
    """The verdict on what each side settled: ``served`` (None: not resolved) against ``trained``, known by
    rule or inferred (then ``confident_set`` decides), with the cost measured elsewhere; the fix is the
    shortest way out (``ways_out``). ``forward``: the served layout was scored under the engine's forward,
    and these are the flags it never runs, with their fix (``model.draft.forward_verdict``). ``settled``:
    the format's writers, listed when they did not settle the layout. ``at_served`` / ``at_trained``: what
    the draft accepts at each, on the text the cost was measured on. ``paths``: the draft's and the
    target's folders, for the fix's command (only when the training layout is settled: a ranking that
    leaves several within noise is a candidate set, never a fix's target); ``in_folder`` False: the
    settled layout is not what ``fixes deploy`` reads from the draft folder, so the command carries it."""
    served = tuple(served) if served is not None else None
    trained = tuple(trained) if trained is not None else None
    within = [tuple(c) for c in confident_set]
    alone = trained is not None and (known or within == [trained])
    fix = (verdict_fix(trained, served, engine, arch, num_layers, paths=paths, with_layout=not in_folder)
           if alone else Fix(f"settle which of {_short(within)} the draft was trained on, then fix the "
                               f"wiring to it: {SETTLE.format(draft=paths[0] if paths else 'DRAFT')}"
                               if served is not None and trained is not None else None))
    v = WiringVerdict(served, trained, known, source, [tuple(c) for c in confident_set], cost, fix.text,
                      list(errors), cost_note, rounds_per_s, at_served=at_served, at_trained=at_trained,
                      fix_ids=fix.ids, fix_command=fix.command, engine="" if engine is None else str(engine))
    if forward is not None:
        v.forward, v.forward_fix = list(forward[0]), forward[1]
    if settled is not None:
        v.candidates, v.format_note = list(settled.candidates), "" if settled.known else settled.note
    return v
