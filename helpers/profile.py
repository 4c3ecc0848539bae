"""The speculation profile: what a draft is expected to reach per draft position, in a file the field reads.

``speculation_profile.json`` beside a draft (or anywhere ``--baseline`` points) holds the per-position
acceptance a draft reached in one measurement: its training evaluation, or an earlier healthy window of
served traffic. The fields are those of NVIDIA ModelOpt's proposed profile (Model-Optimizer pull requests
#2313 export, #2247 specdec_bench, #2315 ar_validate, #2316 docs; open, not merged, 2026-09): both
conventions named, ``conditional_accept_rates`` (position i accepted given 0..i-1 were) and
``marginal_accept_rates`` (positions 0..i all accepted), the ``acceptance_length_histogram`` (tokens per
verify step -> verify steps), ``mean_accept_length`` (with the verifier's own token), ``method``,
``verification_method``, ``accept_length_model`` and ``measurement_conditions``. Because that schema is
not settled, the file carries ``schema_version`` and the reader takes either convention and either
spelling of the version (``schema_version``, ``version``). The workbook adds what a gate needs: the
counts (``drafts``, accepted per position) and the 95% intervals they give.

Standard library only (and ``errors``): the engine guard reads it inside the engines' own processes.
docs/metrics.md "The speculation profile" documents it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from .errors import BadConfig, read_json_file

NAME = "speculation_profile.json"
SCHEMA_VERSION = 1
READS_VERSIONS = (1,)
Z95 = 1.959964


def wilson(k: int, n: int) -> tuple[float, float]:
    """The 95% Wilson interval of k successes in n: honest at small n and near 0 or 1."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + Z95**2 / n
    c = (p + Z95**2 / (2 * n)) / d
    h = Z95 * math.sqrt(max(p * (1 - p) / n + Z95**2 / (4 * n * n), 0.0)) / d
    return max(0.0, c - h), min(1.0, c + h)


def conditional_from_marginal(marginal) -> list[float]:
    out, prev = [], 1.0
    for m in marginal:
        out.append(m / prev if prev > 0 else 0.0)
        prev = m
    return out


def marginal_from_conditional(conditional) -> list[float]:
    out, run = [], 1.0
    for c in conditional:
        run *= c
        out.append(run)
    return out


@dataclass(frozen=True)
class SpeculationProfile:
    """One measurement of a draft's acceptance. ``marginal[i]``: the share of verify steps that accepted
    draft positions 0..i (so ``1 + sum(marginal)`` is the accept length of a chain)."""

    marginal: tuple[float, ...]
    temperature: float | None = 0.0  # None: the traffic's sampling is not known
    verification: str = "greedy"  # greedy | speculative-sampling
    source: str = ""  # a sentence: which measurement
    drafts: int | None = None  # verify steps behind the rates (None: a rate without counts)
    accepted_per_position: tuple[int, ...] | None = None
    mean_interval: tuple[float, float] | None = None  # 95% interval of the accept length, where known
    layout: tuple[int, ...] | None = None  # the boundaries fed to the draft's fc in that measurement
    engine: str | None = None  # the engine that served it, or None (teacher-forced)
    path: Path | None = None
    conditions: dict = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return len(self.marginal)

    @property
    def conditional(self) -> list[float]:
        return conditional_from_marginal(self.marginal)

    @property
    def accept_length(self) -> float:
        return 1.0 + sum(self.marginal)

    def position_interval(self, i: int) -> tuple[float, float] | None:
        if self.drafts and self.accepted_per_position and i < len(self.accepted_per_position):
            return wilson(self.accepted_per_position[i], self.drafts)
        return None

    def histogram(self) -> dict[str, float]:
        """Tokens per verify step (the verifier's own included) -> share of verify steps."""
        m = [1.0, *self.marginal, 0.0]
        return {str(j + 1): round(max(m[j] - m[j + 1], 0.0), 6) for j in range(len(self.marginal) + 1)}

    def to_json(self) -> dict:
        cond = {
            "temperature": self.temperature,
            "verification": self.verification,
            "source": self.source,
            **({"layout": list(self.layout)} if self.layout is not None else {}),
            **({"engine": self.engine} if self.engine else {}),
            **self.conditions,
        }
        out = {
            "schema_version": SCHEMA_VERSION,
            "producer": "eagle3-workbook",
            "method": "eagle3",
            "num_speculative_tokens": self.steps,
            "conditional_accept_rates": [round(x, 6) for x in self.conditional],
            "marginal_accept_rates": [round(x, 6) for x in self.marginal],
            "mean_accept_length": round(self.accept_length, 6),
            "acceptance_length_histogram": self.histogram(),
            "verification_method": self.verification,
            "accept_length_model": "chain: 1 + sum(marginal_accept_rates)",
            "measurement_conditions": cond,
        }
        if self.drafts is not None:
            out["counts"] = {
                "verify_steps": self.drafts,
                "accepted_per_position": None
                if self.accepted_per_position is None
                else list(self.accepted_per_position),
            }
        if self.mean_interval is not None:
            out["mean_accept_length_interval_95"] = [round(x, 6) for x in self.mean_interval]
        return out


def _rates(value, key: str, path: Path) -> tuple[float, ...]:
    ok = (
        isinstance(value, list)
        and value
        and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and 0.0 <= v <= 1.0
            for v in value
        )
    )
    if not ok:
        raise BadConfig(
            f"{path}: {key} is {str(value)[:80]}; expected a non-empty list of fractions in [0, 1]"
        )
    return tuple(float(v) for v in value)


def parse_profile(obj, path: Path) -> SpeculationProfile:
    """A profile object (ours or ModelOpt's proposed schema) -> SpeculationProfile, or one BadConfig."""
    if not isinstance(obj, dict):
        raise BadConfig(f"{path}: a JSON {type(obj).__name__}; expected a speculation profile object")
    version = obj.get("schema_version", obj.get("version"))
    if (
        version is not None
        and version not in READS_VERSIONS
        and str(version).split(".")[0] not in {str(v) for v in READS_VERSIONS}
    ):
        raise BadConfig(f"{path}: schema_version {version!r}; this workbook reads {list(READS_VERSIONS)}")
    if "marginal_accept_rates" in obj:
        marginal = _rates(obj["marginal_accept_rates"], "marginal_accept_rates", path)
    elif "conditional_accept_rates" in obj:
        marginal = tuple(
            marginal_from_conditional(
                _rates(obj["conditional_accept_rates"], "conditional_accept_rates", path)
            )
        )
    else:
        raise BadConfig(
            f"{path}: neither marginal_accept_rates nor conditional_accept_rates; expected a "
            f"speculation profile"
        )
    if any(b > a + 1e-9 for a, b in zip(marginal, marginal[1:])):
        raise BadConfig(
            f"{path}: marginal_accept_rates {list(marginal)} rise with the position; a chain's "
            f"marginals never do"
        )
    cond = obj.get("measurement_conditions") or {}
    if not isinstance(cond, dict):
        raise BadConfig(f"{path}: measurement_conditions is a JSON {type(cond).__name__}; expected an object")
    temp = cond.get("temperature", obj.get("temperature", None))
    if temp is not None and (
        not isinstance(temp, (int, float)) or isinstance(temp, bool) or temp < 0 or not math.isfinite(temp)
    ):
        raise BadConfig(f"{path}: temperature {temp!r}; expected a number >= 0")
    verification = str(
        obj.get("verification_method")
        or cond.get("verification")
        or ("greedy" if temp == 0 else "speculative-sampling" if temp else "unknown")
    )
    counts = obj.get("counts") or {}
    drafts = counts.get("verify_steps") if isinstance(counts, dict) else None
    per_pos = counts.get("accepted_per_position") if isinstance(counts, dict) else None
    if drafts is not None and not (isinstance(drafts, int) and drafts > 0):
        raise BadConfig(f"{path}: counts.verify_steps is {drafts!r}; expected a positive integer")
    if per_pos is not None and not (
        isinstance(per_pos, list) and all(isinstance(a, int) and a >= 0 for a in per_pos)
    ):
        raise BadConfig(f"{path}: counts.accepted_per_position is {str(per_pos)[:60]}; expected counts")
    interval = obj.get("mean_accept_length_interval_95")
    layout = cond.get("layout")
    known = {"temperature", "verification", "source", "layout", "engine"}
    return SpeculationProfile(
        marginal,
        None if temp is None else float(temp),
        verification,
        str(cond.get("source", "")),
        drafts,
        None if per_pos is None else tuple(per_pos),
        tuple(float(x) for x in interval) if isinstance(interval, list) and len(interval) == 2 else None,
        tuple(int(b) for b in layout)
        if isinstance(layout, list) and all(isinstance(b, int) for b in layout)
        else None,
        cond.get("engine"),
        path,
        {k: v for k, v in cond.items() if k not in known},
    )


def profile_path(where: str | Path) -> Path:
    p = Path(where)
    return p / NAME if p.is_dir() else p


def read_profile(where: str | Path, *, required: bool = False) -> SpeculationProfile | None:
    """The profile at ``where`` (a file, or a draft folder holding ``speculation_profile.json``)."""
    path = profile_path(where)
    if not path.is_file():
        if required:
            raise BadConfig(f"{where}: no speculation profile there (expected {NAME} or a path to one)")
        return None
    return parse_profile(read_json_file(path, "speculation profile"), path)


def write_profile(where: str | Path, profile: SpeculationProfile) -> Path:
    path = profile_path(where)
    path.write_text(json.dumps(profile.to_json(), indent=2) + "\n", encoding="utf-8")
    return path


def from_record(rec) -> SpeculationProfile | None:
    """The training evaluation's profile, from a ``record.TrainingRecord`` carrying ``full_acc``
    (teacher-forced greedy acceptance per step on the validation tokens); None without it."""
    if not rec or not rec.full_acc:
        return None
    raw = rec.raw if isinstance(getattr(rec, "raw", None), dict) else {}
    tokens = raw.get("val_tokens")
    cond = {"dataset": "the trainer's validation split"}
    if isinstance(tokens, int) and tokens > 0:
        cond["tokens"] = tokens
    if rec.trainer:
        cond["trainer"] = rec.trainer
    return SpeculationProfile(
        tuple(float(x) for x in rec.full_acc),
        0.0,
        "greedy",
        "training evaluation: teacher-forced validation accuracy per step (training.json final_val)",
        layout=rec.layout,
        conditions=cond,
    )
