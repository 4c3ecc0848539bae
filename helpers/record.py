"""The training record: ``training.json`` beside a draft, read and written in one place.

Every check that needs the layout a draft was trained on reads it here, with one validation, so a
record that one command accepts is never refused (or read differently) by another. The engine guard
(``helpers.live.guard``) reads it inside vLLM's and SGLang's own processes, so this module imports only the
standard library and ``errors``. docs/metrics.md "The training record" documents the schema.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from .errors import BadConfig, BadOption, read_json_file

NAME = "training.json"
# Keys the workbook reads, each with the JSON type it must have; anything else is kept as written.
_INT_LISTS = ("training_boundaries", "captured_boundaries", "deployed_eagle_ids", "train_ids")
_FLOAT_LISTS = ("full_acc", "cond_acc")


def _int_list(value, key: str, path: Path, *, nonnegative: bool) -> tuple[int, ...]:
    ok = isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    if not ok or (nonnegative and any(v < 0 for v in value)):
        kind = "non-negative integers (boundaries)" if nonnegative else "integers"
        raise BadConfig(f"{path}: {key} is {value!r}; expected a list of {kind}")
    return tuple(value)


@dataclass(frozen=True)
class TrainingRecord:
    """What a trainer did, in the workbook's vocabulary (boundaries: 0 = embedding output, L = the
    final state before the norm). Every field but the path may be missing: a draft from elsewhere often
    carries only ``training_boundaries``."""
    path: Path
    training_boundaries: tuple[int, ...] | None = None
    captured_boundaries: tuple[int, ...] | None = None
    deployed_eagle_ids: tuple[int, ...] | None = None
    trainer: str | None = None             # "speculators==0.3.0", "specforge==0.2.0", "workbook"
    train_ids: tuple[int, ...] | None = None   # the ids as the trainer's own config wrote them
    forward_flags: dict[str, bool] = field(default_factory=dict)
    ttt_steps: int | None = None
    full_acc: tuple[float, ...] | None = None  # per step: steps 0..i all right (greedy acceptance)
    cond_acc: tuple[float, ...] | None = None
    source: str | None = None              # how the record was made: "trainer", "user", "diagnose"
    raw: dict = field(default_factory=dict, repr=False)

    @property
    def layout(self) -> tuple[int, ...] | None:
        return self.training_boundaries


def parse_record(raw, path: Path) -> TrainingRecord:
    """One validation for every reader: wrong types are named with the key and what was expected."""
    if not isinstance(raw, dict):
        raise BadConfig(f"{path} holds a JSON {type(raw).__name__}; expected an object with "
                        f"training_boundaries (docs/metrics.md, 'The training record')")
    lists = {}
    for key in _INT_LISTS:
        if raw.get(key) is not None:
            lists[key] = _int_list(raw[key], key, path, nonnegative=key.endswith("boundaries"))
    tb = lists.get("training_boundaries")
    if tb is not None and (not tb or len(set(tb)) != len(tb)):
        raise BadConfig(f"{path}: training_boundaries {list(tb)} must name distinct boundaries, at least one")
    val = raw.get("final_val") if isinstance(raw.get("final_val"), dict) else {}
    accs = {}
    for key in _FLOAT_LISTS:
        value = raw.get(key, val.get(key))
        if value is None:
            continue
        if not (isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                and 0.0 <= v <= 1.0 for v in value)):
            raise BadConfig(f"{path}: {key} is {value!r}; expected a list of fractions in [0, 1], "
                            f"one per step")
        accs[key] = tuple(float(v) for v in value)
    flags = raw.get("forward_flags") or {}
    if not isinstance(flags, dict) or not all(isinstance(v, bool) for v in flags.values()):
        raise BadConfig(f"{path}: forward_flags is {flags!r}; expected an object {{flag: true/false}}")
    steps = raw.get("ttt_steps")
    if steps is not None and (not isinstance(steps, int) or isinstance(steps, bool) or steps < 1):
        raise BadConfig(f"{path}: ttt_steps is {steps!r}; expected a positive integer")
    trainer = raw.get("trainer")
    if trainer is not None and not isinstance(trainer, str):
        raise BadConfig(f"{path}: trainer is {trainer!r}; expected a string such as 'speculators==0.3.0'")
    return TrainingRecord(path, tb, lists.get("captured_boundaries"), lists.get("deployed_eagle_ids"),
                          trainer, lists.get("train_ids"), dict(flags), steps, accs.get("full_acc"),
                          accs.get("cond_acc"), raw.get("source"), dict(raw))


def read_record(draft: str | Path) -> TrainingRecord | None:
    """The record beside a draft (its folder, or its config.json), or None when it has none."""
    where = Path(draft).expanduser()
    folder = where.parent if where.is_file() else where
    path = folder / NAME
    if not path.is_file():
        return None
    return parse_record(read_json_file(path, "training record"), path)


def write_record(draft: str | Path, **fields) -> TrainingRecord:
    """Write (or update) the record beside ``draft``: the given fields replace theirs, the rest stays.
    The result is validated before anything is written, so a bad value changes nothing."""
    folder = Path(draft).expanduser()
    if folder.is_file():
        folder = folder.parent
    if not (folder / "config.json").is_file():
        raise BadOption(f"{folder}: not a draft folder (no config.json); expected the folder the draft's "
                        f"config.json and weights are in")
    path = folder / NAME
    old = read_record(folder)
    raw = dict(old.raw) if old else {}
    for key, value in fields.items():
        if value is None:
            continue
        raw[key] = list(value) if isinstance(value, tuple) else value
    record = parse_record(raw, path)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(raw, indent=2) + "\n", encoding="utf-8")
    tmp.replace(path)
    return record
