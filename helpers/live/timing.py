"""Paired, interleaved timing and the noise gate: a speed ratio with its interval, or a plain
statement that this machine's timing cannot support one.

The workbook exists to measure a slowdown, so a ratio it prints is what a user acts on. On a shared
GPU node or a busy laptop, two runs of the same thing can differ by 5x; a median of two runs is then
their mean, and a ratio of two such medians is noise. Every benchmark therefore times baseline and
speculative decoding as *pairs*: the same prompt, back to back. Which side runs first is
counterbalanced (``baseline_first``): each prompt alternates AB, BA across repeats and the prompts
alternate within a repeat, so with an even number of repeats a first-runner effect cancels within
every prompt; an odd number is kept but the verdict says the design is not balanced.

- The ratio is the **geometric mean of the paired ratios** (speculative tok/s over baseline tok/s, one
  per prompt and repeat; each prompt weighted alike), with a 95% **Student t interval over the prompts'
  means** (each prompt's repeats averaged first; a bootstrap of the repeats where there is one prompt).
  It is an interval for the workload the prompts sample, so it holds how differently the draft does on
  different prompts as well as timing noise (docs/timing.md, "Coverage"). The ratio is
  called faster or slower only when that interval, as printed, does not touch 1.
- The **noise gate** reads the data itself: how wide the same statistic's interval is with the prompts
  held fixed (repeats resampled within each prompt: timing noise alone), how much repeats of the
  same prompt on the same side disagree (a quiet machine repeats a greedy generation to a few per
  cent). A machine signal sits beside it: the share of the cores that *other* processes used while the
  benchmark ran (the machine's busy time from ``/proc/stat`` less this process tree's, engines included,
  so the run's own work before it, which a load average would count, is not held against it), and a
  fixed calibration kernel timed before and after the benchmark.
- The verdict is ``ok``, ``noisy`` (a ratio is stated, with the caveats that make it uncertain) or
  ``unusable`` (timing noise alone cannot tell faster from slower, or repeats disagree wildly): then
  no ratio is stated as a finding, only the ranges that show why. Accept length, per-position
  acceptance and losslessness are deterministic and do not depend on it.

Results here are data (``TimingVerdict`` has a kind and reasons as typed values); sentences are made
by ``speed_phrase`` at the edge.
"""
from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from enum import StrEnum

import torch

from ..errors import finite_or_none

CONFIDENCE = 0.95
# The gate's thresholds, read on this project's machines (docs/timing.md has the figures behind them):
# a quiet 2-core host repeats a prompt's wall time within ~5% and gives paired intervals ~5-15% wide.
NOISY_WIDTH = 0.30        # interval width over the ratio above this: the size of the effect is uncertain
NOISY_SPREAD = 0.25       # repeats of one prompt on one side differing by more than this (max/min - 1)
UNUSABLE_SPREAD = 1.0     # ... by more than 2x: the machine's speed changed under the benchmark
UNUSABLE_WIDTH = 0.15     # an interval this wide that straddles 1 cannot tell faster from slower
CALIBRATION_DRIFT = 0.25  # the calibration kernel slower or faster by this much after than before
FOREIGN_SHARE = 0.25      # other processes using more than this share of the cores while it ran
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
    WIDE = "wide-interval"               # relative width of the noise interval (prompts held fixed)
    STRADDLES = "straddles-1"            # the noise interval holds 1.0 and is too wide to call it a tie
    UNBALANCED = "unbalanced-order"      # prompts that ran one side first more often than the other
    REPEATS_DISAGREE = "repeats-disagree"  # median over prompts of max/min - 1 across repeats, worse side
    CALIBRATION = "calibration-drift"    # after/before - 1 of the calibration kernel
    BUSY = "busy-machine"                # other processes' share of the cores while it ran
    LOAD = "load"                        # load average per core before it (where BUSY cannot be read)


@dataclass(frozen=True)
class MachineSignal:
    """A look at the machine around a benchmark: the load average, a fixed kernel's time, and the share of
    the cores other processes used while it ran (``foreign``; None where unread, or recorded before)."""

    load_before: float
    load_after: float
    calibration_ms_before: float
    calibration_ms_after: float
    cores: int
    foreign: float | None = None

    @property
    def drift(self) -> float:
        """The calibration kernel's after/before - 1: the machine's speed changed under us."""
        b = self.calibration_ms_before
        return self.calibration_ms_after / b - 1 if b > 0 else 0.0

    def to_dict(self) -> dict:
        return {"load_before": round(self.load_before, 2), "load_after": round(self.load_after, 2),
                "calibration_ms_before": round(self.calibration_ms_before, 3),
                "calibration_ms_after": round(self.calibration_ms_after, 3), "cores": self.cores,
                "calibration_drift": round(self.drift, 3),
                "others_share_of_cores": None if self.foreign is None else round(self.foreign, 3)}


def calibration_ms(size: int = 512, reps: int = 8) -> float:
    """The median time of a fixed fp32 matmul chain (~7 ms on 2 cores, every thread used; one a tenth as
    long varied 2x between calls on a quiet host): what this machine gives one process right now."""
    g = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=g)
    times = []
    for _ in range(8):
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


def busy_seconds() -> float:
    """CPU seconds this machine's cores have spent busy since boot (``/proc/stat``); NaN where unread."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
        user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
        return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


class MachineWatch:
    """``with MachineWatch() as w: ...`` then ``w.signal``: load and calibration before and after, and the
    share of the cores that processes outside this one's tree (its engines are in it) used in between."""

    def __enter__(self):
        self._load, self._cal = _load(), calibration_ms()
        self._t, self._busy, self._own = time.monotonic(), busy_seconds(), tree_cpu_seconds(os.getpid())
        return self

    def __exit__(self, *exc):
        busy, own, wall = busy_seconds(), tree_cpu_seconds(os.getpid()), time.monotonic() - self._t
        cores = os.cpu_count() or 1
        foreign = ((busy - self._busy) - (own - self._own)) / (wall * cores) if wall > 0 else float("nan")
        self.signal = MachineSignal(self._load, _load(), self._cal, calibration_ms(), cores,
                                    None if math.isnan(foreign) else max(0.0, foreign))
        return False


def tree_cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a live process and every live descendant, and of the children they
    have reaped (Linux ``/proc``): the work an engine in another process did, or this process's own tree;
    NaN where it cannot be read."""
    if pid is None:
        return float("nan")
    try:
        tick = os.sysconf("SC_CLK_TCK")
        stats = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat", encoding="utf-8") as f:
                        parts = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                # ppid; utime + stime + cutime + cstime
                stats[int(d)] = (int(parts[1]), sum(int(x) for x in parts[11:15]))
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


def t_within(x: float, df: int) -> float:
    """P(|T| < x) for Student's t with ``df`` (an integer) degrees of freedom: the closed form in
    theta = atan(x / sqrt(df)), a finite sum in cos(theta)^2 (odd and even df apart)."""
    theta = math.atan(x / math.sqrt(df))
    c2, term, total = math.cos(theta) ** 2, 1.0, 1.0
    if df % 2 == 0:
        for j in range(1, df // 2):
            term *= c2 * (2 * j - 1) / (2 * j)
            total += term
        return math.sin(theta) * total
    if df == 1:
        return 2 * theta / math.pi
    for j in range(1, (df - 1) // 2):
        term *= c2 * (2 * j) / (2 * j + 1)
        total += term
    return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile for p > 0.5 and an integer ``df`` >= 1: ``t_within`` inverted by bisection."""
    if df < 1 or not 0.5 < p < 1:
        raise ValueError(f"t quantile needs p in (0.5, 1) and df >= 1, got p={p}, df={df}")
    want, lo, hi = 2 * p - 1, 0.0, 1.0
    while t_within(hi, df) < want:
        hi *= 2
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_within(mid, df) < want else (lo, mid)
    return (lo + hi) / 2


def baseline_first(prompt: int, repeat: int) -> bool:
    """Whether ``prompt`` runs the baseline first in ``repeat``: AB in one repeat, BA in the next, and
    within a repeat the prompts alternate too. Over an even number of repeats every prompt runs each
    way equally often, so a first-runner effect (a warm cache, a clock that ramps up) cancels within
    each prompt instead of lifting some prompts' ratios and lowering others' for the whole run."""
    return (prompt + repeat) % 2 == 0


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


class Direction(StrEnum):
    """What an interval says of the ratio against 1, as printed (two decimals)."""

    FASTER = "faster"
    SLOWER = "slower"
    UNRESOLVED = "no measurable difference"   # the interval touches or holds 1


@dataclass
class PairedTiming:
    """Baseline and speculative tok/s, one pair per prompt and repeat, timed back to back."""

    base_tok_s: list[float]
    spec_tok_s: list[float]
    prompt_of: list[int]                     # which prompt each pair ran
    machine: MachineSignal | None = None
    base_cpu_tok_s: list[float] = field(default_factory=list)   # tokens per CPU-second of the process
    spec_cpu_tok_s: list[float] = field(default_factory=list)
    base_first: list[bool] = field(default_factory=list)   # each pair's order (``baseline_first``), [] if
                                                           # not recorded

    @property
    def ratios(self) -> list[float]:
        return [s / b for b, s in zip(self.base_tok_s, self.spec_tok_s) if b > 0 and s > 0]

    @property
    def pairs(self) -> int:
        return len(self.ratios)

    def _log_ratios(self) -> dict[int, list[float]]:
        """Each prompt's paired log ratios (speculative over baseline), in the order they ran."""
        by: dict[int, list[float]] = {}
        for b, s, p in zip(self.base_tok_s, self.spec_tok_s, self.prompt_of):
            if b > 0 and s > 0:
                by.setdefault(p, []).append(math.log(s / b))
        return by

    @property
    def speedup(self) -> float:
        """The geometric mean of the paired ratios, every prompt weighted alike (the mean over prompts
        of each prompt's mean log ratio). In a balanced design each prompt has as many pairs with
        either side first, so a first-runner effect cancels within the prompt."""
        by = self._log_ratios()
        return math.exp(statistics.fmean(statistics.fmean(v) for v in by.values())) if by else 0.0

    @property
    def repeats(self) -> int:
        """Repeats per prompt (the fewest any prompt had)."""
        counts: dict[int, int] = {}
        for p in self.prompt_of[:len(self.base_tok_s)]:
            counts[p] = counts.get(p, 0) + 1
        return min(counts.values()) if counts else 0

    @property
    def balanced(self) -> bool | None:
        """Whether every prompt ran baseline-first as often as speculative-first; None where the order
        of the pairs was not recorded."""
        if not self.base_first:
            return None
        first: dict[int, int] = {}
        for p, bf in zip(self.prompt_of, self.base_first):
            first[p] = first.get(p, 0) + (1 if bf else -1)
        return all(v == 0 for v in first.values())

    @property
    def unbalanced_prompts(self) -> int:
        """How many prompts ran one side first more often than the other (0 when the order is unknown)."""
        first: dict[int, int] = {}
        for p, bf in zip(self.prompt_of, self.base_first):
            first[p] = first.get(p, 0) + (1 if bf else -1)
        return sum(1 for v in first.values() if v)

    def _bootstrap(self, prompts: bool) -> torch.Tensor:
        """``BOOTSTRAP`` draws of the log of ``speedup``, seed 0. Each draw resamples, with replacement,
        the prompts (when ``prompts``) and then, within each drawn prompt, its pairs."""
        by = list(self._log_ratios().values())
        k, width = len(by), max(len(v) for v in by)
        vals = torch.zeros(k, width, dtype=torch.float64)
        for i, v in enumerate(by):
            vals[i, :len(v)] = torch.tensor(v, dtype=torch.float64)
        counts = torch.tensor([len(v) for v in by], dtype=torch.float64)
        g = torch.Generator().manual_seed(0)
        chosen = (torch.randint(k, (BOOTSTRAP, k), generator=g) if prompts
                  else torch.arange(k).expand(BOOTSTRAP, k))
        n = counts[chosen]                                                     # (B, k) pairs per drawn prompt
        j = (torch.rand(BOOTSTRAP, k, width, generator=g, dtype=torch.float64) * n[..., None]).long()
        picked = vals[chosen[..., None], j]                                    # (B, k, width)
        keep = torch.arange(width)[None, None, :] < n[..., None]      # each draws as many pairs as it has
        per_prompt = (picked * keep).sum(2) / n
        return per_prompt.mean(1)

    def _percentile(self, draws: torch.Tensor) -> tuple[float, float]:
        """The percentile interval of the draws, widened to hold the point estimate if it fell outside
        (the estimate is the same statistic on the data, so that is rare and only at the edge)."""
        a = (1 - CONFIDENCE) / 2
        lo, hi = torch.quantile(draws, torch.tensor([a, 1 - a], dtype=torch.float64)).tolist()
        est = math.log(self.speedup)
        return math.exp(min(lo, est)), math.exp(max(hi, est))

    @property
    def interval(self) -> tuple[float, float]:
        return self._interval()[:2]

    @property
    def method(self) -> str:
        return self._interval()[2]

    def _interval(self) -> tuple[float, float, str]:
        """The interval of ``speedup`` as a finding about this kind of workload. Each prompt's repeats are
        averaged first (a balanced order cancels the first-runner effect there), then a Student t interval
        over the prompts' means with k-1 degrees of freedom: it holds the timing noise and how differently
        the draft does on different prompts (six prompts are a sample of a workload, not the workload),
        and it keeps its 95% with few prompts, where a percentile bootstrap over them covers ~87%
        (docs/timing.md, "Coverage"). With one prompt only its repeats can be resampled, and the method
        says so."""
        if self.pairs < 2:
            s = self.speedup
            return s, s, "no interval: fewer than two pairs"
        means = [statistics.fmean(v) for v in self._log_ratios().values()]
        k = len(means)
        if k < 2:
            lo, hi = self._percentile(self._bootstrap(prompts=False))
            return lo, hi, (f"{CONFIDENCE:.0%} bootstrap of one prompt's repeats ({BOOTSTRAP} resamples, "
                            f"seed 0): timing noise only, no spread across prompts")
        half = t_quantile(1 - (1 - CONFIDENCE) / 2, k - 1) * statistics.stdev(means) / math.sqrt(k)
        est = statistics.fmean(means)
        per = "each prompt's repeats averaged first" if self.repeats >= 2 else "one repeat each"
        return math.exp(est - half), math.exp(est + half), (
            f"{CONFIDENCE:.0%} t interval over the {k} prompts' mean log paired ratios ({k - 1} degrees of "
            f"freedom; {per}), prompts weighted alike")

    @property
    def noise_interval(self) -> tuple[float, float]:
        """The same statistic's interval with the prompts held fixed (repeats resampled within each
        prompt): how far timing noise alone moves it. The noise gate reads this one, so a quiet machine
        is not called noisy because the prompts differ; it equals ``interval`` with one repeat."""
        if self.pairs < 2:
            return self.speedup, self.speedup
        if self.repeats < 2:
            return self.interval
        return self._percentile(self._bootstrap(prompts=False))

    @property
    def direction(self) -> Direction:
        """Faster or slower only when the interval, as printed, lies wholly on one side of 1."""
        lo, hi = (float(shown(x)) for x in self.interval)
        return Direction.FASTER if lo > 1 else Direction.SLOWER if hi < 1 else Direction.UNRESOLVED

    def spread(self, side: list[float]) -> float:
        """How much a typical prompt's repeats disagree on one side: the median over prompts of max/min - 1
        across its repeats (0 with one repeat per prompt, where repeats cannot be compared). The median,
        not the worst prompt, so one run slowed by a passing process does not condemn the benchmark."""
        by: dict[int, list[float]] = {}
        for p, v in zip(self.prompt_of, side):
            by.setdefault(p, []).append(v)
        each = [max(v) / min(v) - 1 for v in by.values() if len(v) > 1 and min(v) > 0]
        return statistics.median(each) if each else 0.0

    @property
    def verdict(self) -> TimingVerdict:
        reasons: list[tuple[Reason, float]] = []
        bad = False
        if self.pairs < MIN_PAIRS:
            return TimingVerdict(Timing.UNUSABLE, ((Reason.FEW_PAIRS, float(self.pairs)),))
        lo, hi = self.noise_interval
        width = (hi - lo) / self.speedup if self.speedup else float("inf")
        spread = max(self.spread(self.base_tok_s), self.spread(self.spec_tok_s))
        if self.repeats < 2:
            reasons.append((Reason.ONE_REPEAT, 1.0))
        elif lo <= 1.0 <= hi and width > UNUSABLE_WIDTH:
            reasons.append((Reason.STRADDLES, width))
            bad = True
        elif width > NOISY_WIDTH:
            reasons.append((Reason.WIDE, width))
        if self.balanced is False:
            reasons.append((Reason.UNBALANCED, float(self.unbalanced_prompts)))
        if spread > NOISY_SPREAD:
            reasons.append((Reason.REPEATS_DISAGREE, spread))
            bad = bad or spread > UNUSABLE_SPREAD
        if self.machine is not None:
            if abs(self.machine.drift) > CALIBRATION_DRIFT:
                reasons.append((Reason.CALIBRATION, self.machine.drift))
            foreign = self.machine.foreign
            if foreign is not None:
                if foreign > FOREIGN_SHARE:
                    reasons.append((Reason.BUSY, foreign))
            elif self.machine.load_before / self.machine.cores > 1.0:   # no /proc: the load average
                reasons.append((Reason.LOAD, self.machine.load_before / self.machine.cores))
        kind = Timing.UNUSABLE if bad else Timing.NOISY if reasons else Timing.OK
        return TimingVerdict(kind, tuple(reasons))

    def side_range(self, side: str) -> tuple[float, float]:
        xs = self.base_tok_s if side == "baseline" else self.spec_tok_s
        return (min(xs), max(xs)) if xs else (float("nan"), float("nan"))

    @property
    def order(self) -> str:
        balanced = self.balanced
        if balanced is None:
            return "not recorded"
        if balanced:
            return "balanced: every prompt ran baseline-first and speculative-first equally often"
        return (f"NOT balanced: {self.unbalanced_prompts} prompt(s) ran one side first more often (an odd "
                f"number of repeats), so a first-runner effect does not cancel within them")

    def to_dict(self) -> dict:
        lo, hi = self.interval
        nlo, nhi = self.noise_interval
        v = self.verdict
        out = {"speedup": round(self.speedup, 3), "speedup_interval": [round(lo, 3), round(hi, 3)],
               "interval": self.method, "direction": str(self.direction),
               "noise_interval": [round(nlo, 3), round(nhi, 3)], "pairs": self.pairs,
               "repeats": self.repeats, "order": self.order, "balanced": self.balanced,
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
        # the pairs themselves: the record holds what the figures above were computed from, so a reader
        # (or a later notebook reusing this measurement: ``from_dict``) recomputes them, never re-parses them
        machine = None if self.machine is None else list(dataclasses.astuple(self.machine))
        # (a figure that could not be measured, NaN, is null: strict JSON has no NaN)
        out["pairs_measured"] = finite_or_none({
            "base_tok_s": self.base_tok_s, "spec_tok_s": self.spec_tok_s, "prompt_of": list(self.prompt_of),
            "base_first": list(self.base_first), "base_cpu_tok_s": self.base_cpu_tok_s,
            "spec_cpu_tok_s": self.spec_cpu_tok_s, "machine": machine})
        return out

    @classmethod
    def from_dict(cls, d: dict | None) -> "PairedTiming | None":
        """The timing a ``to_dict`` recorded, rebuilt from its pairs; None when the record holds none (an
        older record, or a row without timing)."""
        raw = (d or {}).get("pairs_measured")
        if not raw:
            return None
        machine = None if not raw.get("machine") else MachineSignal(*raw["machine"])
        return cls(_floats(raw["base_tok_s"]), _floats(raw["spec_tok_s"]), [int(x) for x in raw["prompt_of"]],
                   machine, _floats(raw.get("base_cpu_tok_s", [])), _floats(raw.get("spec_cpu_tok_s", [])),
                   [bool(x) for x in raw.get("base_first", [])])


def _floats(xs: list) -> list[float]:
    return [float("nan") if x is None else float(x) for x in xs]


_REASON_TEXT = {
    Reason.FEW_PAIRS: "only {v:.0f} timed pair(s)",
    Reason.ONE_REPEAT: "one repeat per prompt, so noise cannot be told from the prompts' own variety",
    Reason.WIDE: "timing noise alone moves the ratio over {v:.0%} of it",
    Reason.STRADDLES: "timing noise alone spans {v:.0%} of the ratio, on both sides of 1",
    Reason.UNBALANCED: "order not balanced in {v:.0f} prompt(s) (use an even number of repeats)",
    Reason.REPEATS_DISAGREE: "repeats of a prompt typically differ by {v:.0%}",
    Reason.CALIBRATION: "calibration kernel {v:+.0%} after vs before",
    Reason.BUSY: "other processes used {v:.0%} of the cores while it ran",
    Reason.LOAD: "load {v:.1f} per core before it started",
}


def reasons_text(v: TimingVerdict) -> str:
    return "; ".join(_REASON_TEXT[r].format(v=x) for r, x in v.reasons)


def shown(x: float) -> str:
    """A ratio as every sentence and table prints it: the records hold 3 decimals (``to_dict``), the text 2,
    rounded from those 3, so a sentence never says 1.97 where its table says 1.98."""
    return f"{round(x, 3):.2f}"


def speed_phrase(t: PairedTiming) -> str:
    """The speed ratio as a finding, with its interval, or why there is none: the one sentence every
    headline, table caption and CLI line uses. Faster or slower only when the interval, as printed,
    does not touch 1 (``PairedTiming.direction``)."""
    v = t.verdict
    if v.kind == Timing.UNUSABLE:
        (blo, bhi), (slo, shi) = t.side_range("baseline"), t.side_range("speculative")
        return (f"timing too noisy to state a speed ratio ({reasons_text(v)}): baseline runs ranged "
                f"{blo:.1f}-{bhi:.1f} tok/s, speculative {slo:.1f}-{shi:.1f}; rerun on a quiet machine or "
                f"with more repeats")
    lo, hi = t.interval
    text = f"{shown(t.speedup)}x [{shown(lo)}, {shown(hi)}] ({t.direction})"
    if v.kind == Timing.NOISY:
        text += f", timing noisy: {reasons_text(v)}"
    return text


def table_notes(rows: list[tuple[str, str, "PairedTiming | None"]]) -> list[str]:
    """What a before/after table cannot say of its speed columns, as sentences: which rows' intervals lie
    wholly above or below 1 and which hold it, and why a row's timing is noisy or gave no ratio. ``rows``:
    (wiring, engine, its timing or None when it was not timed)."""
    by: dict[Direction, list[str]] = {d: [] for d in Direction}
    why = []
    for wiring, engine, t in rows:
        name = f"{wiring} on {engine}"
        if t is None or t.verdict.kind == Timing.UNUSABLE:
            why.append(f"{name}: no speed ratio ({reasons_text(t.verdict) if t else 'not timed'})")
            continue
        by[t.direction].append(name)
        if t.verdict.kind == Timing.NOISY:
            why.append(f"{name}: timing noisy ({reasons_text(t.verdict)})")
    said = {Direction.FASTER: "faster than the baseline, the whole interval above 1",
            Direction.SLOWER: "slower than the baseline, the whole interval below 1",
            Direction.UNRESOLVED: "no measurable difference, the interval holds 1"}
    out = [f"{said[d][0].upper()}{said[d][1:]}: {', '.join(names)}" for d, names in by.items() if names]
    return [f"{s}." for s in out + [w[0].upper() + w[1:] for w in why]]


class PairedSpeedup:
    """What a benchmark row says of its speed, for any row holding ``timing`` (a PairedTiming or None)
    and its pooled ``baseline_tok_s`` / ``spec_tok_s``: the reference engine's and a live engine's alike."""

    @property
    def speedup(self) -> float:
        """The geometric mean of the paired ratios (one per prompt and repeat, prompts weighted alike),
        not a ratio of two medians."""
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
    # the same prompts on both runs: timing noise alone (the prompts held fixed) is what may differ
    a = first.get("noise_interval") or first.get("speedup_interval")
    b = second.get("noise_interval") or second.get("speedup_interval")
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
