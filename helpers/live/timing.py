"""Paired, interleaved timing and the noise gate: a speed ratio with its interval, or a plain
statement that this machine's timing cannot support one.

The workbook exists to measure a slowdown, so a ratio it prints is what a user acts on. On a shared
GPU node or a busy laptop, two runs of the same thing can differ by 5x; a median of two runs is then
their mean, and a ratio of two such medians is noise. Every benchmark therefore times baseline and
speculative decoding as *pairs*: the same prompt, back to back, in ABBA order (baseline first, then
speculative first, alternately), so a drift in the machine's speed hits both sides of a pair alike.

- The ratio is the **median of the paired ratios** (speculative tok/s over baseline tok/s, one per
  prompt and repeat), with a 95% interval from a **stratified bootstrap**: repeats are resampled
  within each prompt, so the interval measures timing noise, not how differently the draft does on
  different prompts (which is the workload, and the same on any machine). With one repeat per
  prompt the two cannot be separated; a distribution-free interval (binomial order statistics) over
  all pairs is given instead and the verdict says why it is wide.
- The **noise gate** reads the data itself: how wide that interval is, and how much repeats of the
  same prompt on the same side disagree (a quiet machine repeats a greedy generation to a few per
  cent). A machine signal sits beside it: the load average, and a fixed calibration kernel timed
  before and after the benchmark.
- The verdict is ``ok``, ``noisy`` (the direction is clear, the size is not) or ``unusable`` (the
  interval cannot tell faster from slower, or repeats disagree wildly): then no ratio is stated as a
  finding, only the ranges that show why. Accept length, per-position acceptance and losslessness
  are deterministic and do not depend on it.

Results here are data (``TimingVerdict`` has a kind and reasons as typed values); sentences are made
by ``speed_phrase`` at the edge.
"""
from __future__ import annotations

import math
import os
import statistics
import time
from dataclasses import dataclass, field
from enum import StrEnum

import torch

CONFIDENCE = 0.95
# The gate's thresholds, read on this project's machines (docs/timing.md has the figures behind them):
# a quiet 2-core host repeats a prompt's wall time within ~5% and gives paired intervals ~5-15% wide.
NOISY_WIDTH = 0.30        # interval width over the ratio above this: the size of the effect is uncertain
NOISY_SPREAD = 0.25       # repeats of one prompt on one side differing by more than this (max/min - 1)
UNUSABLE_SPREAD = 1.0     # ... by more than 2x: the machine's speed changed under the benchmark
UNUSABLE_WIDTH = 0.15     # an interval this wide that straddles 1 cannot tell faster from slower
CALIBRATION_DRIFT = 0.25  # the calibration kernel slower or faster by this much after than before
MIN_PAIRS = 3
BOOTSTRAP = 2000


class Timing(StrEnum):
    OK = "ok"
    NOISY = "noisy"
    UNUSABLE = "unusable"


class Reason(StrEnum):
    """Why a verdict is not ``ok``; each has a value to show (see ``TimingVerdict.reasons``)."""

    FEW_PAIRS = "few-pairs"              # fewer pairs than an interval needs
    ONE_REPEAT = "one-repeat"            # noise cannot be told from the prompts' variety
    WIDE = "wide-interval"               # relative width of the interval
    STRADDLES = "straddles-1"            # the interval holds 1.0 and is too wide to call it a tie
    REPEATS_DISAGREE = "repeats-disagree"  # max/min - 1 across repeats of one prompt, worst side
    CALIBRATION = "calibration-drift"    # after/before - 1 of the calibration kernel
    LOAD = "load"                        # load average per core before the benchmark


@dataclass(frozen=True)
class MachineSignal:
    """A cheap look at the machine around a benchmark: load per core and a fixed kernel's time."""

    load_before: float
    load_after: float
    calibration_ms_before: float
    calibration_ms_after: float
    cores: int

    @property
    def drift(self) -> float:
        """The calibration kernel's after/before - 1: the machine's speed changed under us."""
        b = self.calibration_ms_before
        return self.calibration_ms_after / b - 1 if b > 0 else 0.0

    def to_dict(self) -> dict:
        return {"load_before": round(self.load_before, 2), "load_after": round(self.load_after, 2),
                "calibration_ms_before": round(self.calibration_ms_before, 3),
                "calibration_ms_after": round(self.calibration_ms_after, 3), "cores": self.cores,
                "calibration_drift": round(self.drift, 3)}


def calibration_ms(size: int = 192, reps: int = 8) -> float:
    """The median time of a fixed fp32 matmul chain: what this machine gives one process right now."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=g)
    times = []
    for _ in range(6):
        t0 = time.perf_counter()
        x = a
        for _ in range(reps):
            x = torch.tanh(x @ a)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times[1:])    # the first wakes the thread pool: not counted


def _load() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:       # not every platform has a load average
        return float("nan")


class MachineWatch:
    """``with MachineWatch() as w: ...`` then ``w.signal``: load and calibration before and after."""

    def __enter__(self):
        self._load, self._cal = _load(), calibration_ms()
        return self

    def __exit__(self, *exc):
        self.signal = MachineSignal(self._load, _load(), self._cal, calibration_ms(), os.cpu_count() or 1)
        return False


def tree_cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a live process and every live descendant (Linux ``/proc``), the
    work an engine in another process did; NaN where it cannot be read."""
    if pid is None:
        return float("nan")
    try:
        tick = os.sysconf("SC_CLK_TCK")
        stats = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as f:
                        parts = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                stats[int(d)] = (int(parts[1]), int(parts[11]) + int(parts[12]))   # ppid, utime + stime
    except (OSError, ValueError, IndexError):
        return float("nan")
    keep, total, frontier = {pid}, 0, [pid]
    while frontier:
        p = frontier.pop()
        total += stats.get(p, (0, 0))[1]
        kids = [c for c, (pp, _) in stats.items() if pp == p and c not in keep]
        keep.update(kids)
        frontier += kids
    return total / tick if pid in stats else float("nan")


def abba(k: int) -> bool:
    """Whether pair ``k`` runs the baseline first: AB BA AB BA ..., so a steady drift in the machine's
    speed favours neither side."""
    return k % 2 == 0


def median_interval(values: list[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """A distribution-free interval for the median: order statistics (j, n-1-j) with the largest j
    whose coverage 1 - 2 P(Bin(n, 1/2) <= j) reaches ``confidence``; with too few values, the range
    [min, max] and its own (lower) coverage. Returns (lo, hi, coverage)."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return float("nan"), float("nan"), 0.0

    def coverage(k: int) -> float:
        return 1 - 2 * sum(math.comb(n, i) for i in range(k + 1)) * 0.5 ** n

    k = 0
    while 2 * (k + 1) <= n - 1 and coverage(k + 1) >= confidence:
        k += 1
    return xs[k], xs[n - 1 - k], max(coverage(k), 0.0)


@dataclass(frozen=True)
class TimingVerdict:
    kind: Timing
    reasons: tuple[tuple[Reason, float], ...] = ()

    def to_dict(self) -> dict:
        return {"timing": str(self.kind), "reasons": {str(r): round(v, 3) for r, v in self.reasons}}


@dataclass
class PairedTiming:
    """Baseline and speculative tok/s, one pair per prompt and repeat, timed back to back."""

    base_tok_s: list[float]
    spec_tok_s: list[float]
    prompt_of: list[int]                     # which prompt each pair ran (for the repeats' agreement)
    machine: MachineSignal | None = None
    base_cpu_tok_s: list[float] = field(default_factory=list)   # tokens per CPU-second of the process
    spec_cpu_tok_s: list[float] = field(default_factory=list)

    @property
    def ratios(self) -> list[float]:
        return [s / b for b, s in zip(self.base_tok_s, self.spec_tok_s) if b > 0]

    @property
    def pairs(self) -> int:
        return len(self.ratios)

    @property
    def speedup(self) -> float:
        r = self.ratios
        return statistics.median(r) if r else 0.0

    @property
    def repeats(self) -> int:
        """Repeats per prompt (the fewest any prompt had)."""
        counts: dict[int, int] = {}
        for p in self.prompt_of[:self.pairs]:
            counts[p] = counts.get(p, 0) + 1
        return min(counts.values()) if counts else 0

    @property
    def interval(self) -> tuple[float, float]:
        return self._interval()[:2]

    @property
    def method(self) -> str:
        return self._interval()[2]

    def _interval(self) -> tuple[float, float, str]:
        """Prompts differ in how well the draft does on them, so their ratios differ on any machine;
        what timing noise adds is the disagreement between repeats of the same prompt. The interval
        resamples repeats within each prompt (a stratified bootstrap of the median paired ratio), so
        it is as wide as the noise, not as the workload's variety. With one repeat per prompt the
        two cannot be told apart: the distribution-free interval over all pairs is given instead."""
        ratios = self.ratios
        if self.repeats < 2:
            lo, hi, cov = median_interval(ratios)
            return lo, hi, (f"{CONFIDENCE:.0%} distribution-free interval of the median paired ratio "
                            f"over prompts (binomial order statistics, coverage {cov:.1%}); one repeat per "
                            f"prompt, so it holds the prompts' own variety too")
        by: dict[int, list[float]] = {}
        for p, r in zip(self.prompt_of, ratios):
            by.setdefault(p, []).append(r)
        g = torch.Generator().manual_seed(0)
        draws = []
        for rs in by.values():
            t = torch.tensor(rs, dtype=torch.float64)
            draws.append(t[torch.randint(len(rs), (BOOTSTRAP, len(rs)), generator=g)])
        x = torch.cat(draws, 1).sort(1).values
        n = x.shape[1]
        med = (x[:, (n - 1) // 2] + x[:, n // 2]) / 2     # the median as statistics.median takes it
        a = (1 - CONFIDENCE) / 2
        lo, hi = torch.quantile(med, torch.tensor([a, 1 - a], dtype=torch.float64)).tolist()
        return lo, hi, (f"{CONFIDENCE:.0%} stratified bootstrap of the median paired ratio ({BOOTSTRAP} "
                        f"resamples of the repeats within each prompt, seed 0)")

    def spread(self, side: list[float]) -> float:
        """The worst prompt's disagreement between its repeats on one side: max/min - 1 (0 with one
        repeat per prompt, where repeats cannot be compared)."""
        by: dict[int, list[float]] = {}
        for p, v in zip(self.prompt_of, side):
            by.setdefault(p, []).append(v)
        worst = [max(v) / min(v) - 1 for v in by.values() if len(v) > 1 and min(v) > 0]
        return statistics.median(worst) if worst else 0.0

    @property
    def verdict(self) -> TimingVerdict:
        reasons: list[tuple[Reason, float]] = []
        bad = False
        if self.pairs < MIN_PAIRS:
            return TimingVerdict(Timing.UNUSABLE, ((Reason.FEW_PAIRS, float(self.pairs)),))
        lo, hi = self.interval
        width = (hi - lo) / self.speedup if self.speedup else float("inf")
        spread = max(self.spread(self.base_tok_s), self.spread(self.spec_tok_s))
        if self.repeats < 2:
            reasons.append((Reason.ONE_REPEAT, 1.0))
        elif lo <= 1.0 <= hi and width > UNUSABLE_WIDTH:
            reasons.append((Reason.STRADDLES, width))
            bad = True
        elif width > NOISY_WIDTH:
            reasons.append((Reason.WIDE, width))
        if spread > NOISY_SPREAD:
            reasons.append((Reason.REPEATS_DISAGREE, spread))
            bad = bad or spread > UNUSABLE_SPREAD
        if self.machine is not None:
            if abs(self.machine.drift) > CALIBRATION_DRIFT:
                reasons.append((Reason.CALIBRATION, self.machine.drift))
            per_core = self.machine.load_before / self.machine.cores
            if per_core > 1.0:
                reasons.append((Reason.LOAD, per_core))
        kind = Timing.UNUSABLE if bad else Timing.NOISY if reasons else Timing.OK
        return TimingVerdict(kind, tuple(reasons))

    def side_range(self, side: str) -> tuple[float, float]:
        xs = self.base_tok_s if side == "baseline" else self.spec_tok_s
        return (min(xs), max(xs)) if xs else (float("nan"), float("nan"))

    def to_dict(self) -> dict:
        lo, hi = self.interval
        v = self.verdict
        out = {"speedup": round(self.speedup, 3), "speedup_interval": [round(lo, 3), round(hi, 3)],
               "interval": self.method, "pairs": self.pairs, "repeats": self.repeats,
               "order": "ABBA, one pair per prompt and repeat",
               "baseline_range": [round(x, 2) for x in self.side_range("baseline")],
               "spec_range": [round(x, 2) for x in self.side_range("speculative")],
               "repeat_spread": {"baseline": round(self.spread(self.base_tok_s), 3),
                                 "speculative": round(self.spread(self.spec_tok_s), 3)},
               **v.to_dict()}
        if self.machine is not None:
            out["machine"] = self.machine.to_dict()
        if self.base_cpu_tok_s and self.spec_cpu_tok_s:
            out["cpu_tok_s"] = {"baseline": round(statistics.median(self.base_cpu_tok_s), 2),
                                "speculative": round(statistics.median(self.spec_cpu_tok_s), 2)}
        return out


_REASON_TEXT = {
    Reason.FEW_PAIRS: "only {v:.0f} timed pair(s)",
    Reason.ONE_REPEAT: "one repeat per prompt, so noise cannot be told from the prompts' own variety",
    Reason.WIDE: "interval {v:.0%} of the ratio wide",
    Reason.STRADDLES: "interval {v:.0%} wide and on both sides of 1",
    Reason.REPEATS_DISAGREE: "repeats of one prompt differ by {v:.0%}",
    Reason.CALIBRATION: "calibration kernel {v:+.0%} after vs before",
    Reason.LOAD: "load {v:.1f} per core before it started",
}


def reasons_text(v: TimingVerdict) -> str:
    return "; ".join(_REASON_TEXT[r].format(v=x) for r, x in v.reasons)


def speed_phrase(t: PairedTiming) -> str:
    """The speed ratio as a finding, with its interval, or why there is none: the one sentence every
    headline, table caption and CLI line uses."""
    v = t.verdict
    if v.kind == Timing.UNUSABLE:
        (blo, bhi), (slo, shi) = t.side_range("baseline"), t.side_range("speculative")
        return (f"timing too noisy to state a speed ratio ({reasons_text(v)}): baseline runs ranged "
                f"{blo:.1f}-{bhi:.1f} tok/s, speculative {slo:.1f}-{shi:.1f}; rerun on a quiet machine or "
                f"with more repeats")
    lo, hi = t.interval
    word = "faster" if lo > 1 else "slower" if hi < 1 else "no measurable difference"
    text = f"{t.speedup:.2f}x [{lo:.2f}, {hi:.2f}] ({word})"
    if v.kind == Timing.NOISY:
        text += f", timing noisy: {reasons_text(v)}"
    return text


class PairedSpeedup:
    """What a benchmark row says of its speed, for any row holding ``timing`` (a PairedTiming or None)
    and its pooled ``baseline_tok_s`` / ``spec_tok_s``: the reference engine's and a live engine's alike."""

    @property
    def speedup(self) -> float:
        """The median of the paired ratios (one per prompt and repeat), not a ratio of two medians."""
        if self.timing is not None and self.timing.pairs:
            return self.timing.speedup
        return self.spec_tok_s / self.baseline_tok_s if self.baseline_tok_s else 0.0

    @property
    def speedup_interval(self) -> list[float] | None:
        return None if self.timing is None else [round(x, 3) for x in self.timing.interval]

    @property
    def timing_verdict(self) -> str:
        return "unusable" if self.timing is None else str(self.timing.verdict.kind)


def agreement(first: dict, second: dict, what: str) -> str:
    """Two measurements of the same wiring on the same engine (``speedup``, ``speedup_interval`` and
    ``timing`` of each ``to_dict``): whether they agree within their intervals, or why they may not."""
    a, b = first.get("speedup_interval"), second.get("speedup_interval")
    if not a or not b or "unusable" in (first.get("timing"), second.get("timing")):
        return (f"{what}: one of the two runs has no usable timing, so they cannot be compared; the accept "
                f"lengths ({first.get('tau', first.get('accept_length'))} and "
                f"{second.get('tau', second.get('accept_length'))}) are deterministic")
    if a[0] <= b[1] and b[0] <= a[1]:
        return (f"{what}: {first['speedup']:.2f}x [{a[0]:.2f}, {a[1]:.2f}] and {second['speedup']:.2f}x "
                f"[{b[0]:.2f}, {b[1]:.2f}] agree within their intervals")
    return (f"{what}: {first['speedup']:.2f}x [{a[0]:.2f}, {a[1]:.2f}] and {second['speedup']:.2f}x "
            f"[{b[0]:.2f}, {b[1]:.2f}] disagree beyond their intervals: the machine's speed changed between "
            f"the two runs")
