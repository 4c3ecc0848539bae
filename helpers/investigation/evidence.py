"""What a draft was trained on, and what that rests on: the one chain of evidence ``check``, the verdicts
and the engine guard read.

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
4. the config format's writers: every trainer that writes a config of this shape, and what each would
   mean by its ids (``writer_candidates``). Where they all agree that is a prior, not a measurement: a
   verdict resting on it says so, and names the command that measures the served layout.

Torch-free (the record, the trainers' rules, the engine value), so the guard can run it inside an engine's
process at load.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Sequence

from ..boundaries import Layout, WiringError, layout_label
from ..errors import InputError
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
    FORMAT = "format"            # every writer of the config's format reads its ids alike: a prior
    NONE = "none"                # nothing settles it


PROVEN = (Basis.RECORD, Basis.TRAINER_OUTPUT, Basis.TRAINER, Basis.CONFIG)


@dataclass(frozen=True)
class Evidence:
    """The training layout (None: not settled) and what it rests on, as data; ``source`` is the sentence."""

    layout: Layout | None
    basis: Basis
    source: str
    candidates: tuple[dict, ...] = ()
    note: str = ""

    @property
    def proven(self) -> bool:
        """Settled by a statement about this draft (record, trainer), not by a prior about its format."""
        return self.layout is not None and self.basis in PROVEN


def _trainer_evidence(spec: str, train_ids: Sequence[int] | None, cfg: dict, n: int, arch: str | None,
                      basis: Basis, said: str) -> Evidence:
    """A trainer's rule on explicit ids, else on the ids it wrote into the config where it writes them,
    else on its own defaults (``read_source=False``: inside an engine nothing is fetched)."""
    name, version = parse_trainer(spec)
    rule = rule_for(name, version)
    ids, where = ids_in_config(cfg)
    model_type = cfg.get("model_type")
    if train_ids is None and ids is not None and rule.writes_ids == where and rule.meaning != "fixed":
        train_ids = training_ids_from_config(spec, ids, model_type)
    res = trainer_layout(spec, n, train_ids, arch=arch, read_source=False, model_type=model_type)
    label = f"{name}{'==' + version if version else ''}"
    on = f"ids {res.ids}" if train_ids is not None else f"its default ids {res.ids}"
    if res.training_layout is None:
        return Evidence(None, Basis.NONE, f"{label} ({said})", note="; ".join(res.errors) or
                        f"{label}'s rule gives no boundary layout")
    return Evidence(tuple(res.training_layout), basis, f"{label} {said}, its rule on {on}")


def output_evidence(out: TrainerOutput, cfg: dict, n: int, arch: str | None, trainer: str | None = None,
                    train_ids: Sequence[int] | None = None) -> Evidence:
    """The ids the trainer recorded, through its rule (``trainer``, when the user names it, else the one the
    output names); a note where the exported config's ids would mean another layout to that trainer (SpecForge
    exports the draft config it started from, unchanged) or the ids named at launch differ."""
    spec = trainer or out.trainer
    try:
        ev = _trainer_evidence(spec, list(out.ids), cfg, n, arch, Basis.TRAINER_OUTPUT,
                               f"recorded by the trainer in {out.source}")
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
    if exported is not None and ids is not None and exported.layout not in (None, ev.layout):
        notes.append(f"the exported config's ids {ids} mean {exported.layout} to {spec}, not what it "
                     f"captured ({ev.layout}): the config was written without the run's ids "
                     f"(SpecForge's exporter copies the draft config it started from)")
    return Evidence(ev.layout, ev.basis if ev.layout is not None else Basis.NONE, ev.source,
                    note="; ".join(n_ for n_ in [ev.note, *notes] if n_))


def training_evidence(draft: str | Path, cfg: dict, *, engine: Engine, arch: str | None, num_layers: int,
                      trainer: str | None = None, train_ids: Sequence[int] | None = None,
                      served: Sequence[int] | None = None,
                      training_output: str | Path | None = None) -> Evidence:
    """The chain above for one draft folder and its parsed config. A record that cannot be read raises
    (``BadConfig``): a guard in ``refuse`` must not judge around it."""
    record = read_record(Path(draft)) if Path(draft).is_dir() else None
    if record is not None and record.layout is not None:
        return Evidence(tuple(record.layout), Basis.RECORD, "the training record (training.json)")
    out = read_trainer_output(training_output) if training_output is not None else (
        read_trainer_output(draft) if Path(draft).is_dir() else None)
    if out is not None:
        return output_evidence(out, cfg, num_layers, arch, trainer, train_ids)
    if trainer:
        return _trainer_evidence(trainer, train_ids, cfg, num_layers, arch, Basis.TRAINER, "named at launch")
    eng = engine
    made_by = cfg.get("speculators_version") if is_speculators_format(cfg) else None
    try:
        writers = writers_of(cfg, eng.rules.capture_release(eng))
    except InputError as exc:
        return Evidence(None, Basis.NONE, "", note=str(exc))
    if made_by and len(writers) == 1 and writers[0].startswith("speculators=="):
        try:
            return _trainer_evidence(writers[0], None, cfg, num_layers, arch, Basis.CONFIG,
                                     f"named by the config (speculators_version {made_by})")
        except (WiringError, InputError) as exc:
            return Evidence(None, Basis.NONE, "", note=str(exc))
    candidates = read_format(cfg, eng, arch, num_layers, served)
    settled = by_format(candidates)
    if settled.layout is not None:
        return Evidence(tuple(settled.layout), Basis.FORMAT, settled.source, tuple(candidates))
    return Evidence(None, Basis.NONE, "", tuple(candidates),
                    settled.note or "no training record, no trainer named, and no trainer writes a config "
                                    "of this format")
