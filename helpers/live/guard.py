"""The engine guard: before the first token, compare what the engine will feed the draft with what the
draft was trained on, and warn or refuse in one line.

It runs inside the engine's own processes, called by the workbook's vLLM plugin (``vllm/plugin.py``)
and SGLang hooks (``sglang/cpu/hooks.py``) right after the engine's own code has chosen the capture
layers, so it judges the live model object, not a prediction. ``EAGLE3_WORKBOOK_GUARD`` sets the mode:
``off`` (the default when a user's engine loads the workbook), ``warn`` (the workbook's own launches:
the symptom must stay measurable), ``refuse`` or ``strict``. The judgement is data (``GuardVerdict``: a
kind, the two layouts, the fix, what the trained layout rests on); the one-line sentence is rendered where
it is logged or raised. The trained layout comes from the one chain of evidence ``check`` reads
(``investigation.evidence``): the draft's record, a trainer named at launch (``EAGLE3_WORKBOOK_TRAINER``,
``EAGLE3_WORKBOOK_TRAIN_IDS``), the trainer the config names; the format's writers are a prior, never a
settled layout. ``refuse`` refuses a mismatch and a launch it cannot judge (nothing settles the training
layout, or the draft cannot be read); ``strict`` also refuses a match resting on a rule read on the
config's ids (the trainer the config names) rather than on what was stated at training.

Capture indices are read as boundaries: index i is the state entering layer i (0 = the embedding
output, L = the state after the last layer), the capture site of every SGLang and vLLM forward loop the
workbook has read (docs/conventions.md). Which indices a loop tests at all is the caller's to say: SGLang
0.5.23 captures at layer entries (0..L-1), vLLM 0.32's ``EagleModelMixin`` also after the last (0..L).
Imports: the standard library, the evidence chain (the record, the trainers' rules) and the forward-flag
rules, nothing that needs torch.
"""
from __future__ import annotations

import ast
import os
import sys
import textwrap
import time
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Callable, Sequence

from ..boundaries import ProblemKind
from ..errors import InputError
from ..investigation.evidence import (
    PROVEN,
    STATED,
    TRAIN_IDS_ENV,
    TRAINER_ENV,
    TRAINING_OUTPUT_ENV,
    Basis,
    Evidence,
    deploy_line,
    training_evidence,
)
from ..judgement import BLOCKING, Judgement, Verdict
from ..profile import NAME as PROFILE_NAME
from ..profile import read_profile
from ..rules.conventions import Engine, read_draft_config

GUARD_ENV = "EAGLE3_WORKBOOK_GUARD"
PREFIX = "eagle3-workbook guard"


class Mode(StrEnum):
    OFF = "off"
    WARN = "warn"
    REFUSE = "refuse"      # refuses a mismatch, and a launch it cannot judge (no settled training layout)
    STRICT = "strict"      # also refuses a match resting on the config's own ids, not on what training stated

    @property
    def refusing(self) -> bool:
        return self in (Mode.REFUSE, Mode.STRICT)


def mode_from(text: str | None) -> Mode:
    """``EAGLE3_WORKBOOK_GUARD``'s value; unset or empty is ``off``. Anything else is refused by name,
    since a typo must not silently switch a safety check off."""
    value = (text or "").strip().lower() or Mode.OFF
    try:
        return Mode(value)
    except ValueError:
        raise ValueError(f"{GUARD_ENV}={text!r}: expected off, warn, refuse or strict") from None


def mode() -> Mode:
    return mode_from(os.environ.get(GUARD_ENV))




@dataclass(frozen=True)
class GuardVerdict:
    kind: Judgement
    engine: str                          # "sglang 0.5.23", "vllm 0.32.0"
    draft: str
    served: tuple[int, ...]
    trained: tuple[int, ...] | None
    fix: str = ""
    ignored_flags: tuple[str, ...] = ()
    dropped: tuple[int, ...] = ()        # capture indices past the last layer: never captured
    basis: str = ""                      # where the served layout was read
    seconds: float = 0.0                 # what the check added to the engine's start
    ids: tuple[int, ...] | None = None   # the ids the engine was given
    evidence: Basis = Basis.NONE         # what the trained layout rests on: record, trainer, config, format
    evidence_source: str = ""            # ... as a sentence
    settle: str = ""                     # the command that measures the served layout (only a prior spoke)
    notes: tuple[str, ...] = field(default=())
    expected: str = ""                   # what the draft's speculation_profile.json expects, as a sentence
    fix_command: str | None = None       # the fix as the command that writes the copy (``fixes deploy``)
    prior: tuple[int, ...] | None = None  # what the config format's writers mean by its ids: never settled

    @property
    def blocking(self) -> bool:
        return self.kind in BLOCKING

    @property
    def proven(self) -> bool:
        """A verdict on a statement about this draft (record, trainer, its config's trainer), not a prior."""
        return self.kind is Judgement.OTHER_RANK or (self.trained is not None and self.evidence in PROVEN)

    @property
    def stated(self) -> bool:
        """A verdict on what was stated at training (record, trainer output, trainer named)."""
        return self.kind is Judgement.OTHER_RANK or (self.trained is not None and self.evidence in STATED)

    def refused_by(self, how: Mode) -> bool:
        """``refuse``: a mismatch, or a launch it cannot judge (UNKNOWN); ``strict``: also a verdict not on
        what was stated at training."""
        return how.refusing and (self.blocking or self.kind is Judgement.UNKNOWN
                                 or (how is Mode.STRICT and not self.stated))

    @property
    def judged(self) -> Verdict:
        """This verdict as every judge says one (``judgement.Verdict``)."""
        return Verdict(self.kind, "guard", self.engine, self.served, self.trained, self.evidence_source,
                       render(self), self.fix or None, self.fix_command)

    def as_dict(self) -> dict:
        return {"kind": str(self.kind), "engine": self.engine, "draft": self.draft,
                "served": list(self.served), "trained": None if self.trained is None else list(self.trained),
                "fix": self.fix,
                "ignored_flags": list(self.ignored_flags), "dropped": list(self.dropped), "basis": self.basis,
                "seconds": self.seconds, "ids": None if self.ids is None else list(self.ids),
                "evidence": str(self.evidence), "evidence_source": self.evidence_source,
                "proven": self.proven, "stated": self.stated, "settle": self.settle,
                "expected": self.expected or None, "prior": None if self.prior is None else list(self.prior)}


def render(v: GuardVerdict, how: Mode | None = None) -> str:
    """The one line a log or an exception carries: the mode, the verdict, what it rests on, and what the
    draft's speculation profile expects (the figure to watch or gate on once it serves)."""
    line = _render(v, how)
    return f"{line}; {v.expected}" if v.expected and v.kind is not Judgement.OTHER_RANK else line


def _render(v: GuardVerdict, how: Mode | None) -> str:
    head = f"{PREFIX} ({how}): {v.kind}" if how is not None else f"{PREFIX}: {v.kind}"
    served = f"{v.engine} will feed {v.draft} boundaries {v.served}"
    if v.ids is not None:
        served += f" (ids {list(v.ids)}"
        served += f"; {list(v.dropped)} past the last layer, never captured)" if v.dropped else ")"
    elif v.dropped:
        served += (f" (no ids read, the engine's default; {list(v.dropped)} past the last layer, never "
                   f"captured)")
    else:
        served += " (no ids read: the engine's default)"
    rests = f" [evidence: {v.evidence_source}]" if v.evidence_source else ""
    refused = how is not None and v.refused_by(how)
    if v.kind is Judgement.OTHER_RANK:
        return (f"{head}: {v.engine}: this pipeline stage does not feed the draft ({v.basis}); the last "
                f"stage does and is judged there; starting")
    if v.kind is Judgement.UNKNOWN:
        why = "; ".join(v.notes) or "no training record (training.json) and no trainer named"
        end = ("refusing: the guard cannot judge a draft whose training layout is not settled" if refused else
               "the guard cannot compare and does not guess; starting")
        return (f"{head}: {served}; the training layout is not settled ({why}); {end}. Settle it: "
                f"python -m helpers fixes record --draft {v.draft} --layout B1,B2,B3, or launch with "
                f"EAGLE3_WORKBOOK_TRAINER=NAME==VERSION [EAGLE3_WORKBOOK_TRAIN_IDS=...]")
    if v.kind is Judgement.MATCH:
        if not refused:
            return f"{head}: {served}, the layout it was trained on{rests}; starting"
        return (f"{head}: {served}, the layout its config's own ids give{rests}, not what was stated at "
                f"training; refusing: strict mode serves only a stated layout. State it: python -m helpers "
                f"fixes record --draft {v.draft} --layout {_csv(v.trained)}, or measure it: {v.settle}")
    if v.kind is Judgement.IGNORED_FLAG:
        return f"{head}: {served} as trained{rests}, but ignores {', '.join(v.ignored_flags)}; fix: {v.fix}"
    return f"{head}: {served}; it was trained on {v.trained}{rests}; fix: {v.fix}"


def _csv(values) -> str:
    return ",".join(map(str, values))


def refusal(verdict: dict | None) -> str | None:
    """The line a refusing guard recorded in its launch's report (the data, not the log's text), or None
    when it let the engine start."""
    if not verdict or not verdict.get("refused"):
        return None
    return verdict["line"]


def unjudged_launch(how: Mode, verdict: dict | None, *, engine: str, log: str | Path) -> str | None:
    """Where the workbook launches an engine with a draft: under a refusing mode, a launch that came up
    without a guard verdict was never judged (the plugin did not load: an allowlist such as
    ``VLLM_PLUGINS``/``SGLANG_PLUGINS`` without it, a foreign ``helpers``, a missing install), so it must not
    serve. The one line why, or None."""
    if not how.refusing or verdict is not None:
        return None
    return (f"{PREFIX} ({how}): {engine} came up without judging the draft (no guard record from its "
            f"processes: the workbook's plugin did not load or did not install; look for the "
            f"'{PREFIX} (...): installed' line in {log}); refusing to serve unguarded")


class GuardRefused(RuntimeError):
    """Raised inside the engine so it stops before serving; the message is the guard's line."""


# --------------------------------------------------------------------------------------
# The judgement.


def served_layout(indices: Sequence[int], highest: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(boundaries the forward loop captures, in the ascending order it concatenates them; indices it
    never reaches). ``highest``: the last index the loop tests (L - 1 where it captures at layer entries
    only, L where it also captures after the last layer)."""
    idx = sorted({int(i) for i in indices})
    return tuple(i for i in idx if 0 <= i <= highest), tuple(i for i in idx if not 0 <= i <= highest)


def judge(*, engine: str, draft: str | Path, indices: Sequence[int], highest: int,
          ids: Sequence[int] | None = None, evidence: Evidence | None = None,
          ignored: Sequence[tuple[str, str, str]] = (), ids_for: Callable[[tuple[int, ...]], list | None]
          | None = None, ids_key: str = "eagle_aux_hidden_state_layer_ids", basis: str = "",
          hazards: dict[int, str] | None = None, feeds_draft: bool = True, settle: str = "",
          target: str | None = None) -> GuardVerdict:
    """Compare the live capture with what the draft was trained on (``evidence``: the record, a named
    trainer, the config's own trainer, or the format's writers; ``investigation.evidence``).

    ``ignored``: (flag, why, fix) for each forward flag the draft sets that this engine's draft forward
    does not run (``ignored_flags``). ``ids_for(layout)``: the ids this engine turns into ``layout``,
    found by running its own setter (None where no ids can), used to name the fix. ``hazards``: boundary ->
    what else serving it needs on this engine (vLLM's boundary-0 residual; SGLang 0.5.9's), added to an ids
    fix. ``feeds_draft`` False: a rank that does not feed the draft (a pipeline stage before the last), never
    judged miswired. ``settle``: the command that measures the
    served layout, named where only a prior spoke. ``target``: the target's folder, for the fix's command.
    """
    served, dropped = served_layout(indices, highest)
    ev = evidence or Evidence(None, Basis.NONE, "")
    common = dict(engine=engine, draft=str(draft), served=served, dropped=dropped, basis=basis,
                  ids=None if ids is None else tuple(int(i) for i in ids), evidence=ev.basis,
                  evidence_source=ev.source, settle=settle)
    if not feeds_draft:
        return GuardVerdict(Judgement.OTHER_RANK, trained=ev.layout, **common)
    if ev.layout is None:
        return GuardVerdict(Judgement.UNKNOWN, trained=None, notes=(ev.note,) if ev.note else (),
                            prior=ev.prior, **common)
    trained = ev.layout
    if served == trained:
        if ignored:
            names = tuple(f for f, _, _ in ignored)
            return GuardVerdict(Judgement.IGNORED_FLAG, trained=trained, ignored_flags=names,
                                fix="; ".join(dict.fromkeys(fix for _, _, fix in ignored)), **common)
        return GuardVerdict(Judgement.MATCH, trained=trained, **common)
    if sorted(served) == sorted(trained):
        return GuardVerdict(Judgement.ORDER, trained=trained, fix=(
            f"the fc slots are in another order; python -m helpers fixes reorder --draft {draft} --out "
            f"{Path(draft).name}-reordered --served {_csv(served)} permutes them exactly"),
            **common)
    ascending = tuple(sorted(trained)) == trained
    want = ids_for(trained) if (ids_for and ascending) else None
    if want is not None:
        command = deploy_line(ev, draft, target or "TARGET", "==".join(engine.split()[:2]))
        fix = (f"set {ids_key} to {list(want)} (this engine's own setter turns them into {trained}): "
               f"{command} writes that copy, checked before it is written; or retrain the draft on {served}")
        needs = [note for b, note in (hazards or {}).items() if b in trained]
        if needs:
            fix += "; " + "; ".join(needs)
    else:
        why = ("it concatenates in ascending layer order" if not ascending else
               "no ids make this engine capture them")
        command = None
        fix = f"no ids serve {trained} here ({why}): retrain the draft on {served}, or patch the engine"
    return GuardVerdict(Judgement.MISWIRED, trained=trained, fix=fix, fix_command=command, **common)


def record_evidence(layout: Sequence[int]) -> Evidence:
    """A training layout stated by a record (what ``fixes record`` writes), as evidence."""
    return Evidence(tuple(int(b) for b in layout), Basis.RECORD, "the training record (training.json)")


def ignored_flags(cfg: dict, engine: Engine) -> list[tuple[str, str, str]]:
    """(flag, why, fix) for each forward flag the draft config sets that ``engine`` does not run, by the
    workbook's rules read from every release's draft file (``conventions``)."""
    from ..engines.vllm.rule import VLLM_HONOURS_NORM_BEFORE_RESIDUAL
    from ..rules.flags import honours_norm_before_residual, ignored_flag_problems, sets_norm_before_residual

    out = [(kind.replace("-", "_"), why, fix) for kind, why, fix in ignored_flag_problems(cfg, engine)
           if kind != ProblemKind.DRAFT_CLASS]      # a missing class fails the engine's own load first
    if sets_norm_before_residual(cfg) and not honours_norm_before_residual(engine):
        out.append(("norm_before_residual", f"{engine} does not implement norm_before_residual",
                    f"serve with vllm>={VLLM_HONOURS_NORM_BEFORE_RESIDUAL}, or retrain without "
                    f"norm_before_residual"))
    return out


class _UnsetResidual(ast.NodeVisitor):
    """Counts ``x + residual`` inside an ``if`` that tests the capture attribute, not under a test of
    ``residual`` itself (``... if residual is None else ...``, ``if residual is not None:``)."""

    def __init__(self, attr: str):
        self.attr, self.count, self._capture, self._tested = attr, 0, 0, 0

    def _visit_test(self, node, test) -> None:
        capture = self.attr in ast.unparse(test)
        tested = "residual" in ast.unparse(test)
        self._capture += capture
        self._tested += tested
        self.generic_visit(node)
        self._capture -= capture
        self._tested -= tested

    def visit_If(self, node):
        self._visit_test(node, node.test)

    def visit_IfExp(self, node):
        self._visit_test(node, node.test)

    def visit_BinOp(self, node):
        if (self._capture and not self._tested and isinstance(node.op, ast.Add)
                and isinstance(node.right, ast.Name) and node.right.id == "residual"):
            self.count += 1
        self.generic_visit(node)


def adds_unset_residual(forward_source: str, capture_attr: str) -> int:
    """How many captures in a forward add ``residual`` while it may still be None: the forward starts with
    ``residual = None`` and a capture under a test of ``capture_attr`` adds it unguarded. Boundary 0 then
    crashes the first forward (the original case's TypeError); read from the live class's own source."""
    source = textwrap.dedent(forward_source)
    if "residual = None" not in source:
        return 0
    finder = _UnsetResidual(capture_attr)
    finder.visit(ast.parse(source))
    return finder.count


def release(version: str) -> str:
    """'0.32.0+cpu' -> '0.32.0': the release the rules are keyed by."""
    return version.split("+", 1)[0]


def probe_ids(setter: Callable[[list[int]], None], read: Callable[[], Sequence[int]], highest: int,
              restore: Callable[[], None]) -> Callable[[tuple[int, ...]], list[int] | None]:
    """``ids_for`` from the engine's own setter: try the ids a layout would need under each id
    convention engines use (boundary - 1, the boundary itself, boundary + 1), read back what the live
    model would capture, and restore the original. The fix the guard names is what this release's own
    code does, not a rule restated."""
    def ids_for(layout: tuple[int, ...]) -> list[int] | None:
        try:
            for shift in (-1, 0, 1):
                ids = [b + shift for b in layout]
                try:
                    setter(ids)
                except Exception:    # noqa: BLE001 - a setter may reject ids; that convention is out
                    continue
                if served_layout(read(), highest) == (tuple(layout), ()):
                    return ids
            return None
        finally:
            restore()
    return ids_for


def local_draft(path: str | Path) -> Path:
    """The draft's folder: the path itself, or a hub id's cached snapshot (offline; never downloads)."""
    p = Path(str(path)).expanduser()
    if p.exists():
        return p
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(path), local_files_only=True))
    except Exception:    # noqa: BLE001 - not cached, or no hub client: the record is then absent
        return p


def _with_seconds(v: GuardVerdict, seconds: float) -> GuardVerdict:
    return replace(v, seconds=round(seconds, 6))


_said: set[tuple] = set()


def enforce(verdict: GuardVerdict, how: Mode, report: Callable[[dict], None] | None = None) -> None:
    """Log the line once per process, then raise ``GuardRefused`` when ``how`` refuses this verdict
    (``GuardVerdict.refused_by``). ``report`` receives the verdict as a dict, with the mode, the line and
    whether it refused."""
    if how is Mode.OFF:
        return
    line = render(verdict, how)
    refused = verdict.refused_by(how)
    if report is not None:
        report({**verdict.as_dict(), "mode": str(how), "line": line, "refused": refused})
    key = (verdict.kind, verdict.served, verdict.draft)
    if key not in _said:
        _said.add(key)
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    if refused:
        raise GuardRefused(line)


def launch_trainer() -> tuple[str | None, list[int] | None]:
    """The trainer named at launch (``EAGLE3_WORKBOOK_TRAINER=NAME==VERSION``) and the ids it ran with
    (``EAGLE3_WORKBOOK_TRAIN_IDS=2,30,58``): an edge, parsed here once."""
    spec = (os.environ.get(TRAINER_ENV) or "").strip() or None
    text = (os.environ.get(TRAIN_IDS_ENV) or "").strip()
    if not text:
        return spec, None
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise ValueError(f"{TRAIN_IDS_ENV}={text!r}: expected comma-separated integers, e.g. 2,30,58") \
            from None
    if spec is None:
        raise ValueError(f"{TRAIN_IDS_ENV} is set but {TRAINER_ENV} is not: name the trainer the ids are for")
    return spec, ids


def launch_training_output() -> Path | None:
    """The trainer's output named at launch (``EAGLE3_WORKBOOK_TRAINING_OUTPUT``): its recorded ids are read
    (``investigation.trainer_output``); the draft folder is read for them anyway."""
    text = (os.environ.get(TRAINING_OUTPUT_ENV) or "").strip()
    return Path(text).expanduser() if text else None


def _arch(holder, arch: str | None) -> str | None:
    if arch:
        return arch
    names = getattr(getattr(holder, "config", None), "architectures", None)
    return str(names[0]) if names else None


def settle_command(family: str, draft) -> str:
    """The measurement that replaces a prior: the running engine's own capture, then the paired test."""
    return (f"python -m helpers capture --backend {family} --target TARGET --draft {draft} --text TEXT "
            f"--out DUMP, "
            f"then python -m helpers diagnose --draft {draft} --data DUMP")


def at_load(*, family: str, version: str, draft, holder, attr: str, highest: int, ids,
            set_ids: Callable[[list[int]], None], report: Callable[[dict], None] | None = None,
            ids_key: str = "eagle_aux_hidden_state_layer_ids",
            hazards: dict[int, str] | None = None, feeds_draft: bool = True, arch: str | None = None,
            rules_release: str | None = None) -> GuardVerdict | None:
    """The guard at the moment the engine has set its capture layers: ``holder.<attr>`` holds the
    capture indices the forward loop will test, ``highest`` the last index it tests (``served_layout``),
    ``set_ids`` is the engine's own setter (used only to find the ids that would fix a mismatch;
    ``holder.<attr>`` is restored after). ``feeds_draft`` False on a rank that does not feed the draft.
    ``arch``: the target's class (else read from ``holder.config``); ``rules_release``: the release whose
    capture rule runs, when it is not the runtime's (the case replay). Returns the verdict, or None when the
    guard is off or could not judge; raises ``GuardRefused`` when refusing. A draft whose record or config
    cannot be read is not judged: ``warn`` says so and lets the engine start, ``refuse`` refuses with the
    reason."""
    how = mode()
    if how is Mode.OFF:
        return None
    started = time.perf_counter()
    try:
        from ..rules.conventions import parse_engine

        # the edge inside a live engine: it names itself as text, parsed once here
        engine = parse_engine(f"{family}=={release(rules_release or version)}")
        folder = local_draft(draft)
        cfg = read_draft_config(folder)     # the one reader: a config it refuses is never judged around
        original = getattr(holder, attr)
        indices = [int(i) for i in original]
        layers = getattr(holder, "layers", None)
        num_layers = len(layers) if layers is not None else highest + 1
        served, _ = served_layout(indices, highest)
        trainer, train_ids = launch_trainer()
        evidence = training_evidence(folder, cfg, engine=engine, arch=_arch(holder, arch),
                                     num_layers=num_layers, trainer=trainer, train_ids=train_ids,
                                     served=served, training_output=launch_training_output())

        def restore():
            setattr(holder, attr, original)

        ids_for = probe_ids(set_ids, lambda: getattr(holder, attr), highest, restore)
        ignored = ignored_flags(cfg, engine) if cfg else ()
        verdict = judge(engine=f"{family} {version}", draft=folder, indices=indices, highest=highest,
                        ids=ids, evidence=evidence, ignored=ignored, ids_for=ids_for, ids_key=ids_key,
                        hazards=hazards, basis=f"{type(holder).__name__}.{attr} = {indices} (live model)",
                        feeds_draft=feeds_draft, settle=settle_command(family, folder),
                        target=getattr(getattr(holder, "config", None), "_name_or_path", None) or None)
    except Exception as exc:      # noqa: BLE001 - the engine's start must not die of the guard in warn
        return _unjudged(how, draft, exc, started, report)
    return _decided(verdict, folder, how, started, report)


def cannot_judge(how: Mode, draft, exc: Exception, report: Callable[[dict], None] | None = None, *,
                 engine: str = "") -> None:
    """The one unjudged path, for a caller (an engine's hook) that could not even reach ``at_load``: one line;
    ``refuse``/``strict`` raise ``GuardRefused``, ``warn`` lets the engine start. Off: nothing."""
    if how is Mode.OFF:
        return None
    where = f"{engine}: " if engine else ""
    return _unjudged(how, draft if draft is not None else "the draft",
                     type(exc)(f"{where}{exc}") if _retypable(exc) else exc, time.perf_counter(), report)


def _retypable(exc: Exception) -> bool:
    try:
        type(exc)("x")
    except Exception:     # noqa: BLE001 - an exception class with another signature keeps its message
        return False
    return True


def _unjudged(how: Mode, draft, exc: Exception, started: float, report) -> None:
    """A draft the guard could not judge: one line; refused in ``refuse`` (fail closed), else started."""
    line = f"{PREFIX} ({how}): cannot judge {draft}: {type(exc).__name__}: {exc}"
    line += "; refusing to serve unjudged" if how.refusing else "; starting unjudged"
    if report is not None:
        report({"kind": "unjudged", "mode": str(how), "line": line, "draft": str(draft),
                "refused": how.refusing, "seconds": round(time.perf_counter() - started, 6)})
    sys.stderr.write(line + "\n")
    if how.refusing:
        raise GuardRefused(line) from None
    return None


def _decided(verdict: GuardVerdict, folder: Path, how: Mode, started: float, report) -> GuardVerdict:
    verdict = replace(_with_seconds(verdict, time.perf_counter() - started),
                      expected=profile_expectation(folder))
    enforce(verdict, how, report)
    return verdict


def profile_expectation(folder: Path) -> str:
    """The draft's ``speculation_profile.json``, as the sentence the guard's line ends with ("" when there
    is none). An unreadable one is said, never a reason to refuse: it is what to expect, not the judgement."""
    try:
        prof = read_profile(folder)
    except InputError as exc:
        return f"its {PROFILE_NAME} cannot be read ({exc})"
    if prof is None:
        return ""
    at = "unknown temperature" if prof.temperature is None else f"temperature {prof.temperature:g}"
    layout = f" fed {prof.layout}" if prof.layout else ""
    return (f"its {PROFILE_NAME} expects accept length {prof.accept_length:.2f} over {prof.steps} draft "
            f"tokens{layout} at {at} ({prof.source or 'a recorded profile'}); gate on it: python -m helpers "
            f"diagnose --metrics URL --draft {folder} --baseline {prof.path}")


def before_llamacpp(*, engine: Engine, draft, target_layers: Sequence[int], num_layers: int,
                    arch: str | None, gguf: str | Path, how: Mode | None = None,
                    report: Callable[[dict], None] | None = None,
                    target: str | Path | None = None) -> GuardVerdict | None:
    """llama.cpp's guard, run before ``llama-server`` starts (it has no plugin system): the draft GGUF's
    ``eagle3.target_layers`` (the ids its converter wrote; the engine feeds the input of each listed layer)
    judged against what ``draft`` (the Hugging Face folder it was converted from) was trained on. The same
    verdicts, lines and modes as ``at_load``; a draft that cannot be judged starts in ``warn`` and is
    refused in ``refuse``. ``target``: the target's folder, named in the fix's command. Returns the verdict
    (None when off or unjudged); raises ``GuardRefused``."""
    how = mode() if how is None else how
    if how is Mode.OFF:
        return None
    started = time.perf_counter()
    try:
        folder = local_draft(draft)
        cfg = read_draft_config(folder)
        indices = [int(i) for i in target_layers]
        served, _ = served_layout(indices, num_layers - 1)
        trainer, train_ids = launch_trainer()
        evidence = training_evidence(folder, cfg, engine=engine, arch=arch, num_layers=num_layers,
                                     trainer=trainer, train_ids=train_ids, served=served,
                                     training_output=launch_training_output())
        verdict = judge(engine=f"llamacpp {engine.version or ''}".strip(), draft=folder, indices=indices,
                        highest=num_layers - 1, ids=indices, evidence=evidence,
                        ids_for=lambda layout: list(layout),
                        ids_key="the top-level eagle_aux_hidden_state_layer_ids, then convert again,",
                        basis=f"{Path(gguf).name}: eagle3.target_layers = {indices}",
                        target=None if target is None else str(target),
                        settle=(f"python -m helpers bench --backend llamacpp --target TARGET --draft "
                                f"{folder} (llama.cpp's accept length beside the reference engine's for "
                                f"the served layout), then python -m helpers diagnose --draft {folder} "
                                f"--target TARGET"))
    except Exception as exc:      # noqa: BLE001 - judged or not, the launch is decided here, in one line
        return _unjudged(how, draft, exc, started, report)
    return _decided(verdict, folder, how, started, report)
