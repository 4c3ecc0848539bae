"""What a draft was trained on, and what that rests on: the one chain of evidence every command reads.

In order, the first that speaks settles it:

1. the draft's training record (``training.json``, ``record.read_record``);
   then what the trainer itself recorded of its run (``trainer_output``: SpecForge's ``capture_layers`` in
   ``training_state.pt``, speculators' ``run.yaml`` / ``train_command.txt``), where the user points at the
   training output (``check --training-output``, ``EAGLE3_WORKBOOK_TRAINING_OUTPUT``) or the draft folder
   holds it; it names the trainer's ids, read through that trainer's rule (the one named, else its own);
2. a trainer named by the user (``check --trainer``; at an engine's launch ``EAGLE3_WORKBOOK_TRAINER`` and
   ``EAGLE3_WORKBOOK_TRAIN_IDS``), its rule applied to the ids it ran with;
3. the trainer the config names itself (speculators writes ``speculators_version``), its rule applied to the
   config's ids;
4. a measurement: the draft's own inputs ranked (``diagnose``, notebooks 02 and 03), one layout alone within
   noise of the best (``measured``); several within noise are a candidate set, never a training layout.

The config format's writers (every trainer that writes a config of this shape, and what each would mean by
its ids) never settle it: where they all agree that is the answer's ``prior``, named beside the candidates
and the commands that settle it. ``check``, ``fixes deploy``, the engine guard, ``diagnose`` on every
source and the notebooks ask this chain; none re-derives it.

Torch-free (the record, the trainers' rules, the engine value), so the guard can run it inside an engine's
process at load.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum
from pathlib import Path
from typing import Sequence

from ..boundaries import Layout, WiringError, check_layout, layout_label
from ..errors import BadConfig, InputError
from ..judgement import deploy_command
from ..record import read_record
from ..rules.conventions import Engine, expect_engine, ids_in_config, is_speculators_format
from ..rules.trainers import parse_trainer, rule_for, trainer_layout, training_ids_from_config, writers_of
from .trainer_output import TrainerOutput, read_trainer_output

TRAINER_ENV = "EAGLE3_WORKBOOK_TRAINER"        # NAME==VERSION of the trainer that made the draft
TRAIN_IDS_ENV = "EAGLE3_WORKBOOK_TRAIN_IDS"    # the ids it ran with, comma separated (else the config's)
# the trainer's output: its checkpoint, its run files (trainer_output)
TRAINING_OUTPUT_ENV = "EAGLE3_WORKBOOK_TRAINING_OUTPUT"

# --------------------------------------------------------------------------------------
# Who wrote the config: its format's writers, and what each reads its ids as


def writer_candidates(cfg: dict, engine: Engine, arch: str, num_layers: int, served: Sequence[int] | None,
                      cannot_capture: Sequence[str] = ()) -> list[dict]:
    """No record and no trainer: the config's format still narrows who wrote it, and each writer gives
    its ids a known meaning, so list the layout each would mean and whether ``served`` is it. A release
    that cannot enable the capture (``cannot_capture``) serves no layout, so none agrees. Each entry:
    ``{trainer, training_layout, served_agrees, note}``."""
    eng = expect_engine(engine)
    n = num_layers
    ids, where = ids_in_config(cfg)
    model_type = cfg.get("model_type")
    out = []
    for spec in writers_of(cfg, eng.rules.capture_release(eng)):
        rule = rule_for(*parse_trainer(spec))
        train = (training_ids_from_config(spec, ids, model_type)
                 if ids is not None and rule.writes_ids == where and rule.meaning != "fixed" else None)
        try:
            res = trainer_layout(spec, n, train, arch=arch, read_source=False, model_type=model_type)
        except (WiringError, InputError) as exc:
            out.append({"trainer": spec, "training_layout": None, "served_agrees": None,
                        "note": str(exc).split("\n")[0][:200]})
            continue
        layout = list(res.training_layout) if res.training_layout else None
        agrees = None if layout is None or served is None else (
            not cannot_capture and tuple(layout) == tuple(served))
        said = "its default ids" if train is None and rule.meaning != "fixed" else (
            "fixed boundaries" if rule.meaning == "fixed" else f"ids {train} ({rule.meaning} numbering)")
        gone = [f"{eng} captures nothing for {arch} (engine-cannot-capture)"] if cannot_capture else []
        out.append({"trainer": spec, "training_layout": layout, "served_agrees": agrees,
                    "note": "; ".join([said] + res.errors + gone)})
    return out


def candidate_table(candidates: Sequence[dict], engine: Engine, num_layers: int) -> list[str]:
    """The writers as ``check`` prints them: trainer, the training layout its ids mean, served or not."""
    def label(layout) -> str:
        return f"{tuple(layout)} {layout_label(layout, num_layers)}" if layout else "nothing"

    lines = ["  who could have written this config (its format), and what its ids would mean:",
             f"    {'trainer':<26} {'training layout':<34} {'served by ' + str(engine):<24}"]
    for c in candidates:
        layout = label(c["training_layout"]) if c["training_layout"] else "(none)"
        agrees = {True: "agrees", False: "MISMATCH", None: "-"}[c["served_agrees"]]
        lines.append(f"    {c['trainer']:<26} {layout:<34} {agrees:<24}")
    return lines


@dataclass(frozen=True)
class Settled:
    """The training layout and how it was settled: ``known`` by rule, else None here (the caller infers
    it from the ranking). ``candidates``: the config format's writers, when they were read; ``note``:
    why they did not settle it, for the verdict."""

    layout: Layout | None
    source: str = ""
    known: bool = False
    candidates: tuple[dict, ...] = ()
    note: str = ""


def read_format(cfg: dict | None, engine: Engine, arch: str | None, num_layers: int | None, served=None,
                cannot_capture: Sequence[str] = ()) -> list[dict]:
    """``writer_candidates`` where everything it needs is at hand (else none); a config no writer's
    rule can read gives none either: a verdict then infers the layout, as it always did."""
    if cfg is None or engine is None or not arch or num_layers is None:
        return []
    try:
        return writer_candidates(cfg, engine, arch, num_layers, served, cannot_capture)
    except (WiringError, InputError):
        return []


def agreed_layout(candidates: Sequence[dict]) -> Layout | None:
    """The one training layout every writer reads the ids as (None: none, or they differ)."""
    layouts = {tuple(c["training_layout"]) if c["training_layout"] else None for c in candidates}
    return next(iter(layouts)) if len(layouts) == 1 and None not in layouts else None


def by_format(candidates: Sequence[dict], *, width: int | None = None, ranked: Sequence = (),
              confident_set: Sequence = ()) -> Settled:
    """Every writer of the config's format reading its ids as one layout that fits the fc (``width``
    slots) is a prior. Before any ranking (``ranked`` empty) it settles the layout to score. After one it
    settles only what the ranking confirms: the agreed layout alone in the ``confident_set``. One the
    ranking separates from the best (the ids were edited after training), one it leaves among others
    within noise, or one it never scored settles nothing, and the note says which: a prior the data
    cannot confirm is not a verdict (the original case's bug is exactly ids written in the other
    convention). Not settled: a note that lists the writers."""
    if not candidates:
        return Settled(None)
    names = ", ".join(c["trainer"] for c in candidates)
    agreed = agreed_layout(candidates)
    reads = f"every writer of its config format ({names}) reads its ids as {agreed}"
    ranked = {tuple(x) for x in ranked}
    within = {tuple(x) for x in confident_set}
    if agreed is None:
        note = "the writers of its config format disagree: " + ", ".join(
            f"{c['trainer']} {tuple(c['training_layout']) if c['training_layout'] else '(none)'}"
            for c in candidates)
    elif width is not None and len(agreed) != width:
        note = f"{reads}, which does not fit the draft's {width} fc slots"
    elif not ranked:
        return Settled(agreed, f"by format: {reads}", True, tuple(candidates))
    elif agreed not in ranked:
        note = f"{reads}, a prior the data cannot test: that layout is not among those scored"
    elif agreed not in within:
        note = f"{reads}, but the ranking separates that layout from the best: the ids are not the training's"
    elif within != {agreed}:
        others = len(within) - 1
        note = (f"{reads}, a prior the ranking cannot confirm: {others} other layout{'s' * (others != 1)} "
                f"score{'s' * (others == 1)} within noise of it")
    else:
        return Settled(agreed, f"by format, confirmed by the ranking (the only layout within noise of the "
                               f"best): {reads}", True, tuple(candidates))
    return Settled(None, "", False, tuple(candidates), note)


# --------------------------------------------------------------------------------------
# The chain


class Basis(StrEnum):
    """What a training layout rests on; values are the spellings JSON carries."""

    RECORD = "record"            # training.json beside the draft
    TRAINER_OUTPUT = "trainer-output"   # what the trainer recorded of its run (its checkpoint, its run files)
    TRAINER = "trainer"          # a trainer named by the user, its rule on the ids it ran with
    CONFIG = "config"            # the trainer the config names itself, its rule on the config's ids
    MEASURED = "measured"        # the draft's own inputs ranked: one layout alone within noise of the best
    FORMAT = "format"            # every writer of its format reads its ids alike: a prior, never settled
    NONE = "none"                # nothing settles it


# settled by a statement about this draft, or a measurement of it; FORMAT and NONE settle nothing
PROVEN = (Basis.RECORD, Basis.TRAINER_OUTPUT, Basis.TRAINER, Basis.CONFIG, Basis.MEASURED)
# stated when the draft was trained (what ``strict`` asks for), not a rule read on ids edited since
STATED = (Basis.RECORD, Basis.TRAINER_OUTPUT, Basis.TRAINER)
# what ``fixes deploy`` re-derives from the draft folder alone (other bases travel in its --layout)
IN_FOLDER = (Basis.RECORD, Basis.CONFIG)

SETTLE = ("write the training record (python -m helpers fixes record --draft {draft} --layout B1,B2,B3, "
          "or --trainer NAME==VERSION --train-ids ...), or measure it (python -m helpers diagnose --draft "
          "{draft} --target TARGET, or --data DUMP)")


@dataclass(frozen=True)
class Evidence:
    """The answer to "what was this draft trained on": a settled ``layout`` and what it rests on
    (``basis``, ``source`` its sentence), or, unsettled (``layout`` None), the ``candidates`` and what would
    settle them (``settle``). ``prior``: the layout every writer of the config's format means, never a
    settled layout. ``conflict``: a second statement that disagrees with the one used (a record against
    the trainer named). ``warnings``: what the trainer's rule said on the way."""

    layout: Layout | None
    basis: Basis
    source: str
    candidates: tuple[dict, ...] = ()
    note: str = ""
    prior: Layout | None = None
    conflict: str = ""
    warnings: tuple[str, ...] = ()
    alternatives: tuple[Layout, ...] = ()     # a measurement's candidates within noise of each other

    @property
    def settled(self) -> bool:
        return self.layout is not None

    @property
    def proven(self) -> bool:
        """Settled by a statement about this draft (record, trainer) or a measurement, not by a prior."""
        return self.layout is not None and self.basis in PROVEN

    @property
    def stated(self) -> bool:
        """Settled by what was stated when the draft was trained (record, trainer output, trainer named)."""
        return self.layout is not None and self.basis in STATED

    def settle(self, draft) -> str:
        """What settles an unsettled layout, as commands that run on ``draft``."""
        return SETTLE.format(draft=draft)

    def to_dict(self) -> dict:
        return {"training_layout": None if self.layout is None else list(self.layout),
                "basis": str(self.basis), "source": self.source,
                "prior": None if self.prior is None else list(self.prior),
                "alternatives": [list(a) for a in self.alternatives],
                "note": self.note, "conflict": self.conflict or None}


def _trainer_evidence(spec: str, train_ids: Sequence[int] | None, cfg: dict, n: int, arch: str | None,
                      basis: Basis, said: str, *, read_source: bool = False,
                      slots: int | None = None) -> Evidence:
    """A trainer's rule on explicit ids, else on the ids it wrote into the config where it writes them,
    else on its own defaults (``read_source``: the trainer's wheel read for its rule; inside an engine
    nothing is fetched). ``slots``: the draft's fc width, where known: ids given as the captured list with
    the verifier's state last (one more than the slots) train the fc on all but the last."""
    name, version = parse_trainer(spec)
    rule = rule_for(name, version)
    ids, where = ids_in_config(cfg)
    model_type = cfg.get("model_type")
    explicit = train_ids is not None
    if train_ids is None and ids is not None and rule.writes_ids == where and rule.meaning != "fixed":
        train_ids = training_ids_from_config(spec, ids, model_type)
    res = trainer_layout(spec, n, train_ids, arch=arch, read_source=read_source, model_type=model_type)
    label = f"{name}{'==' + version if version else ''}"
    on = f"ids {res.ids}" if train_ids is not None else f"its default ids {res.ids}"
    if res.training_layout is None:
        return Evidence(None, Basis.NONE, f"{label} ({said})", note="; ".join(res.errors) or
                        f"{label}'s rule gives no boundary layout", warnings=tuple(res.warnings))
    layout = tuple(res.training_layout)
    if explicit and slots is not None and len(layout) == slots + 1:
        layout = layout[:slots]    # the captured list given, the verifier's state last
    return Evidence(layout, basis, f"{label} {said}, its rule on {on} ({res.read_from})",
                    note="; ".join(res.errors), warnings=tuple(res.warnings))


def output_evidence(out: TrainerOutput, cfg: dict, n: int, arch: str | None, trainer: str | None = None,
                    train_ids: Sequence[int] | None = None, *, read_source: bool = False) -> Evidence:
    """The ids the trainer recorded, through its rule (``trainer``, when the user names it, else the one the
    output names); a note where the exported config's ids would mean another layout to that trainer (SpecForge
    exports the draft config it started from, unchanged) or the ids named at launch differ."""
    spec = trainer or out.trainer
    try:
        ev = _trainer_evidence(spec, list(out.ids), cfg, n, arch, Basis.TRAINER_OUTPUT,
                               f"recorded by the trainer in {out.source}", read_source=read_source)
    except (WiringError, InputError) as exc:
        return Evidence(None, Basis.NONE, "",
                        note=f"{out.source}: ids {list(out.ids)} under {spec}'s rule: {exc}")
    notes = [out.note] if out.note and not trainer else []
    if train_ids is not None and list(train_ids) != list(out.ids):
        notes.append(f"the ids named ({list(train_ids)}) are not the ones the trainer recorded "
                     f"({list(out.ids)}); the recorded ones are used")
    try:
        exported = _trainer_evidence(spec, None, cfg, n, arch, Basis.CONFIG, "the exported config's ids")
    except (WiringError, InputError):
        exported = None
    ids, _ = ids_in_config(cfg)
    conflict = ""
    if exported is not None and ids is not None and exported.layout not in (None, ev.layout):
        conflict = (f"the exported config's ids {ids} mean {exported.layout} to {spec}, not what it "
                    f"captured ({ev.layout}): the config was written without the run's ids "
                    f"(SpecForge's exporter copies the draft config it started from)")
        notes.append(conflict)
    return Evidence(ev.layout, ev.basis if ev.layout is not None else Basis.NONE, ev.source,
                    note="; ".join(n_ for n_ in [ev.note, *notes] if n_), conflict=conflict,
                    warnings=ev.warnings)


def _recorded(draft: Path, num_layers: int) -> Evidence | None:
    """The training record's layout, checked against the target's depth (a record that does not fit is bad
    input, never judged around)."""
    record = read_record(draft) if draft.is_dir() else None
    if record is None or record.layout is None:
        return None
    try:
        layout = check_layout(record.layout, num_layers)
    except (WiringError, TypeError, ValueError) as exc:
        raise BadConfig(f"{draft / 'training.json'}: training_boundaries {list(record.layout)} do not fit a "
                        f"{num_layers}-layer target: {exc}") from None
    return Evidence(layout, Basis.RECORD, "the training record (training.json)")


def training_evidence(draft: str | Path, cfg: dict, *, engine: Engine, arch: str | None, num_layers: int,
                      trainer: str | None = None, train_ids: Sequence[int] | None = None,
                      served: Sequence[int] | None = None,
                      training_output: str | Path | None = None, read_source: bool = False,
                      slots: int | None = None) -> Evidence:
    """The one answer to "what was this draft trained on", for one draft folder and its parsed config: the
    chain in the module's docstring, the first that speaks settling it. The format's writers never settle
    it: where they agree, that is the ``prior`` of an unsettled answer. A measurement is added by the
    caller that ranks the draft's inputs (``measured``). A record that cannot be read raises
    (``BadConfig``): a guard in ``refuse`` must not judge around it."""
    draft = Path(draft)
    recorded = _recorded(draft, num_layers)
    if recorded is not None:
        if trainer is None:
            return recorded
        try:
            named = _trainer_evidence(trainer, train_ids, cfg, num_layers, arch, Basis.TRAINER, "named",
                                      read_source=read_source, slots=slots)
        except (WiringError, InputError):
            return recorded
        if named.layout is not None and named.layout != recorded.layout:
            return replace(recorded, conflict=f"training.json says {recorded.layout}, the {named.source} "
                                              f"gives {named.layout}")
        return recorded
    out = read_trainer_output(training_output) if training_output is not None else (
        read_trainer_output(draft) if draft.is_dir() else None)
    if out is not None:
        ev = output_evidence(out, cfg, num_layers, arch, trainer, train_ids, read_source=read_source)
        if ev.layout is not None or trainer is None:
            return ev
    if trainer:
        return _trainer_evidence(trainer, train_ids, cfg, num_layers, arch, Basis.TRAINER, "named",
                                 read_source=read_source, slots=slots)
    made_by = cfg.get("speculators_version") if is_speculators_format(cfg) else None
    try:
        writers = writers_of(cfg, engine.rules.capture_release(engine))
    except InputError as exc:
        return Evidence(None, Basis.NONE, "", note=str(exc))
    if made_by and len(writers) == 1 and writers[0].startswith("speculators=="):
        try:
            return _trainer_evidence(writers[0], None, cfg, num_layers, arch, Basis.CONFIG,
                                     f"named by the config (speculators_version {made_by})",
                                     read_source=read_source)
        except (WiringError, InputError) as exc:
            return Evidence(None, Basis.NONE, "", note=str(exc))
    candidates = tuple(read_format(cfg, engine, arch, num_layers, served))
    prior = agreed_layout(candidates)
    if prior is not None:
        names = ", ".join(c["trainer"] for c in candidates)
        return Evidence(None, Basis.FORMAT, "", candidates,
                        f"every writer of its config format ({names}) reads its ids as {prior}: a prior "
                        f"about the format, not a statement about this draft", prior=prior)
    settled = by_format(candidates)
    return Evidence(None, Basis.NONE, "", candidates,
                    settled.note or "no training record, no trainer named, and no trainer writes a config "
                                    "of this format")


def measured(ev: Evidence, confident_set: Sequence[Sequence[int]], *, confident: bool,
             what: str = "the layout ranking") -> Evidence:
    """An unsettled answer completed by a ranking of the draft's own inputs: one layout alone within noise
    of the best settles it (``MEASURED``); several leave it unsettled, those the candidates. A settled
    answer is returned as it is (a ranking that disagrees with it is the caller's note)."""
    if ev.settled:
        return ev
    within = tuple(tuple(int(b) for b in c) for c in confident_set)
    if confident and len(within) == 1:
        agrees = ("; every writer of its config format reads its ids as that layout" if ev.prior == within[0]
                  else "")
        return replace(ev, layout=within[0], basis=Basis.MEASURED,
                       source=f"measured by {what} (the only layout within noise of the best{agrees})")
    return replace(ev, alternatives=within,
                   note="; ".join(x for x in (ev.note, f"{what} leaves {len(within)} layouts within noise of "
                                                       f"each other: a candidate set, not a training layout")
                                  if x))


def deploy_line(ev: Evidence, draft, target, engine) -> str:
    """The ``fixes deploy`` command that serves ``ev``'s layout, as it runs: a layout ``deploy`` cannot
    re-derive from the draft folder alone (a trainer named, a measurement) travels as ``--layout``."""
    command = deploy_command(draft, target, engine)
    if ev.layout is not None and ev.basis not in IN_FOLDER:
        command += f" --layout {','.join(map(str, ev.layout))}"
    return command
