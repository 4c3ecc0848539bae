"""The engine guard: before the first token, compare what the engine will feed the draft with what the
draft was trained on, and warn or refuse in one line.

It runs inside the engine's own processes, called by the workbook's vLLM plugin (``vllm/plugin.py``)
and SGLang hooks (``sglang/cpu/hooks.py``) right after the engine's own code has chosen the capture
layers, so it judges the live model object, not a prediction. ``EAGLE3_WORKBOOK_GUARD`` sets the mode:
``off`` (the default when a user's engine loads the workbook), ``warn`` (the workbook's own launches:
the symptom must stay measurable) or ``refuse``. The judgement is data (``GuardVerdict``: a kind, the
two layouts, the fix); the one-line sentence is rendered where it is logged or raised.

Capture indices are read as boundaries: index i is the state entering layer i (0 = the embedding
output, L = the state after the last layer), the capture site of every SGLang and vLLM forward loop the
workbook has read (docs/conventions.md). Which indices a loop tests at all is the caller's to say: SGLang
0.5.23 captures at layer entries (0..L-1), vLLM 0.32's ``EagleModelMixin`` also after the last (0..L).
Imports: the standard library, the training record and the forward-flag rules, nothing that needs torch.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path
from typing import Callable, Sequence

from ..record import TrainingRecord, read_record

GUARD_ENV = "EAGLE3_WORKBOOK_GUARD"
PREFIX = "eagle3-workbook guard"


class Mode(StrEnum):
    OFF = "off"
    WARN = "warn"
    REFUSE = "refuse"


def mode_from(text: str | None) -> Mode:
    """``EAGLE3_WORKBOOK_GUARD``'s value; unset or empty is ``off``. Anything else is refused by name,
    since a typo must not silently switch a safety check off."""
    value = (text or "").strip().lower() or Mode.OFF
    try:
        return Mode(value)
    except ValueError:
        raise ValueError(f"{GUARD_ENV}={text!r}: expected off, warn or refuse") from None


def mode() -> Mode:
    return mode_from(os.environ.get(GUARD_ENV))


class Kind(StrEnum):
    MATCH = "match"                # serves the trained layout, every flag honoured
    MISWIRED = "miswired"          # other boundaries than training used
    ORDER = "order"                # the same boundaries in another fc slot order
    IGNORED_FLAG = "ignored-flag"  # right layout, a forward flag the draft was trained with is not run
    NO_RECORD = "no-record"        # no training record: nothing to compare with, no guess made


BLOCKING = (Kind.MISWIRED, Kind.ORDER, Kind.IGNORED_FLAG)


@dataclass(frozen=True)
class GuardVerdict:
    kind: Kind
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
    notes: tuple[str, ...] = field(default=())

    @property
    def blocking(self) -> bool:
        return self.kind in BLOCKING

    def as_dict(self) -> dict:
        return {"kind": str(self.kind), "engine": self.engine, "draft": self.draft,
                "served": list(self.served), "trained": None if self.trained is None else list(self.trained),
                "fix": self.fix,
                "ignored_flags": list(self.ignored_flags), "dropped": list(self.dropped), "basis": self.basis,
                "seconds": self.seconds, "ids": None if self.ids is None else list(self.ids)}


def render(v: GuardVerdict) -> str:
    """The one line a log or an exception carries."""
    served = f"{v.engine} will feed {v.draft} boundaries {v.served}"
    if v.ids is not None:
        served += f" (ids {list(v.ids)}"
        served += f"; {list(v.dropped)} past the last layer, never captured)" if v.dropped else ")"
    elif v.dropped:
        served += f" (capture indices {list(v.dropped)} past the last layer, never captured)"
    if v.kind is Kind.NO_RECORD:
        return (f"{PREFIX}: {served}; the draft has no training record (training.json), so the guard "
                f"cannot compare and does not guess (python -m helpers fixes record --draft {v.draft} ...)")
    if v.kind is Kind.MATCH:
        return f"{PREFIX}: {served}, the layout it was trained on; starting"
    if v.kind is Kind.IGNORED_FLAG:
        return f"{PREFIX}: {served} as trained, but ignores {', '.join(v.ignored_flags)}; fix: {v.fix}"
    return f"{PREFIX}: {served}; it was trained on {v.trained}; fix: {v.fix}"


def _csv(values) -> str:
    return ",".join(map(str, values))


def refusal(verdict: dict | None) -> str | None:
    """The line a refusing guard recorded in its launch's report (the data, not the log's text), or None
    when it let the engine start."""
    if not verdict or verdict.get("mode") != Mode.REFUSE:
        return None
    if verdict.get("kind") in BLOCKING or verdict.get("kind") == "unjudged":
        return verdict["line"]
    return None


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
          ids: Sequence[int] | None = None, record: TrainingRecord | None = None,
          ignored: Sequence[tuple[str, str, str]] = (), ids_for: Callable[[tuple[int, ...]], list | None]
          | None = None, ids_key: str = "eagle_aux_hidden_state_layer_ids", basis: str = "",
          hazards: dict[int, str] | None = None) -> GuardVerdict:
    """Compare the live capture with the draft's training record.

    ``ignored``: (flag, why, fix) for each forward flag the draft sets that this engine's draft forward
    does not run (``ignored_flags``). ``ids_for(layout)``: the ids this engine turns into ``layout``,
    found by running its own setter (None where no ids can), used to name the fix. ``hazards``: boundary ->
    what else serving it needs on this engine (vLLM's boundary-0 residual), added to an ids fix.
    """
    served, dropped = served_layout(indices, highest)
    common = dict(engine=engine, draft=str(draft), served=served, dropped=dropped, basis=basis,
                  ids=None if ids is None else tuple(int(i) for i in ids))
    if record is None or record.layout is None:
        return GuardVerdict(Kind.NO_RECORD, trained=None, **common)
    trained = record.layout
    if served == trained:
        if ignored:
            names = tuple(f for f, _, _ in ignored)
            return GuardVerdict(Kind.IGNORED_FLAG, trained=trained, ignored_flags=names,
                                fix="; ".join(dict.fromkeys(fix for _, _, fix in ignored)), **common)
        return GuardVerdict(Kind.MATCH, trained=trained, **common)
    if sorted(served) == sorted(trained):
        return GuardVerdict(Kind.ORDER, trained=trained, fix=(
            f"the fc slots are in another order; python -m helpers fixes reorder --draft {draft} --out "
            f"{Path(draft).name}-reordered --served {_csv(served)} permutes them exactly"),
            **common)
    ascending = tuple(sorted(trained)) == trained
    want = ids_for(trained) if (ids_for and ascending) else None
    if want is not None:
        family = engine.split()[0]
        fix = (f"set {ids_key} to {list(want)} (this engine's own setter turns them into {trained}): "
               f"python -m helpers fixes ids --draft {draft} --out {Path(draft).name}-ids --engine {family} "
               f"--ids {_csv(want)} --layout {_csv(trained)}; or retrain the "
               f"draft on {served}")
        needs = [note for b, note in (hazards or {}).items() if b in trained]
        if needs:
            fix += "; " + "; ".join(needs)
    else:
        why = ("it concatenates in ascending layer order" if not ascending else
               "no ids make this engine capture them")
        fix = f"no ids serve {trained} here ({why}): retrain the draft on {served}, or patch the engine"
    return GuardVerdict(Kind.MISWIRED, trained=trained, fix=fix, **common)


def ignored_flags(cfg: dict, engine: str) -> list[tuple[str, str, str]]:
    """(flag, why, fix) for each forward flag the draft config sets that ``engine`` ("sglang==0.5.23")
    does not run, by the workbook's rules read from every release's draft file (``conventions``). An
    edge: the engine names itself as text inside its own process, parsed here."""
    from ..rules.conventions import parse_engine
    from ..rules.flags import honours_norm_before_residual, ignored_flag_problems, sets_norm_before_residual
    from ..rules.vllm.rule import VLLM_HONOURS_NORM_BEFORE_RESIDUAL

    engine = parse_engine(engine)

    out = [(kind.replace("-", "_"), why, fix) for kind, why, fix in ignored_flag_problems(cfg, engine)
           if kind != "draft-class"]      # a missing class fails the engine's own load first
    if sets_norm_before_residual(cfg) and not honours_norm_before_residual(engine):
        out.append(("norm_before_residual", f"{engine} does not implement norm_before_residual",
                    f"serve with vllm>={VLLM_HONOURS_NORM_BEFORE_RESIDUAL}, or retrain without "
                    f"norm_before_residual"))
    return out


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
    """Log the line once per process (warn, and refuse when it lets the engine start), then raise
    ``GuardRefused`` when refusing a blocking verdict. ``report`` receives the verdict as a dict."""
    if how is Mode.OFF:
        return
    line = render(verdict)
    if report is not None:
        report({**verdict.as_dict(), "mode": str(how), "line": line})
    key = (verdict.kind, verdict.served, verdict.draft)
    if key not in _said:
        _said.add(key)
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    if how is Mode.REFUSE and verdict.blocking:
        raise GuardRefused(line)


def at_load(*, family: str, version: str, draft, holder, attr: str, highest: int, ids,
            set_ids: Callable[[list[int]], None], report: Callable[[dict], None] | None = None,
            ids_key: str = "eagle_aux_hidden_state_layer_ids",
            hazards: dict[int, str] | None = None) -> GuardVerdict | None:
    """The guard at the moment the engine has set its capture layers: ``holder.<attr>`` holds the
    capture indices the forward loop will test, ``highest`` the last index it tests (``served_layout``),
    ``set_ids`` is the engine's own setter (used only to find the ids that would fix a mismatch;
    ``holder.<attr>`` is restored after). Returns the verdict, or None when the guard is off or could not
    judge; raises ``GuardRefused`` when refusing. A draft whose record or config cannot be read is not
    judged: ``warn`` says so and lets the engine start, ``refuse`` refuses with the reason."""
    how = mode()
    if how is Mode.OFF:
        return None
    started = time.perf_counter()
    try:
        folder = local_draft(draft)
        record = read_record(folder)
        cfg_path = folder / "config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        engine = f"{family}=={release(version)}"
        original = getattr(holder, attr)
        indices = [int(i) for i in original]

        def restore():
            setattr(holder, attr, original)

        ids_for = probe_ids(set_ids, lambda: getattr(holder, attr), highest, restore)
        ignored = ignored_flags(cfg, engine) if cfg else ()
        verdict = judge(engine=f"{family} {version}", draft=folder, indices=indices, highest=highest,
                        ids=ids, record=record, ignored=ignored, ids_for=ids_for, ids_key=ids_key,
                        hazards=hazards, basis=f"{type(holder).__name__}.{attr} = {indices} (live model)")
    except Exception as exc:      # noqa: BLE001 - the engine's start must not die of the guard in warn
        line = f"{PREFIX}: cannot judge {draft}: {type(exc).__name__}: {exc}"
        if report is not None:
            report({"kind": "unjudged", "mode": str(how), "line": line, "draft": str(draft),
                    "seconds": round(time.perf_counter() - started, 6)})
        sys.stderr.write(line + "\n")
        if how is Mode.REFUSE:
            raise GuardRefused(line) from None
        return None
    verdict = _with_seconds(verdict, time.perf_counter() - started)
    enforce(verdict, how, report)
    return verdict
