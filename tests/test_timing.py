"""Paired timing and its noise gate, on synthetic runs whose noise is known (no clock is read here:
speed is measured in benchmarks, never asserted in a timed test)."""
from __future__ import annotations

import math
import random

import pytest

from helpers.live.timing import (
    MachineSignal,
    PairedTiming,
    Reason,
    Timing,
    abba,
    agreement,
    median_interval,
    speed_phrase,
)

# how well the draft does on each prompt differs (0.6x to 2x), on any machine: that is the workload
PROMPT_EFFECT = [0.6, 1.8, 1.2, 2.0, 1.5, 1.1]


def runs(noise: float, repeats: int = 3, seed: int = 0, jumps: float = 0.0) -> PairedTiming:
    """Pairs whose tok/s carry multiplicative noise of +-``noise``; ``jumps``: the share of runs slowed
    5x by another process, as on a shared host."""
    rnd = random.Random(seed)
    base, spec, prompt_of = [], [], []
    for _ in range(repeats):
        for i, effect in enumerate(PROMPT_EFFECT):
            slow = [5.0 if rnd.random() < jumps else 1.0 for _ in range(2)]
            b = 50 * (1 + noise * (2 * rnd.random() - 1)) / slow[0]
            base.append(b)
            spec.append(50 * effect * (1 + noise * (2 * rnd.random() - 1)) / slow[1])
            prompt_of.append(i)
    return PairedTiming(base, spec, prompt_of)


def test_median_interval_is_the_binomial_order_statistics():
    lo, hi, cov = median_interval(list(range(12)))
    assert (lo, hi) == (2, 9) and cov == pytest.approx(1 - 2 * (1 + 12 + 66) / 4096)
    lo, hi, cov = median_interval(list(range(6)))
    assert (lo, hi) == (0, 5) and cov == pytest.approx(1 - 2 / 64)        # too few for more: stated
    assert median_interval([2.0])[2] == 0.0 and math.isnan(median_interval([])[0])


def test_abba_alternates_which_side_runs_first():
    assert [abba(k) for k in range(4)] == [True, False, True, False]


def test_a_quiet_machine_is_ok_even_when_prompts_differ():
    t = runs(0.03)
    lo, hi = t.interval
    assert t.verdict.kind == Timing.OK, t.verdict
    assert lo <= t.speedup <= hi and (hi - lo) / t.speedup < 0.1     # the prompts' variety is not noise
    assert "bootstrap" in t.method and t.repeats == 3 and t.pairs == 18
    assert speed_phrase(t).startswith(f"{t.speedup:.2f}x [{lo:.2f}, {hi:.2f}] (faster)")


def test_a_hogged_machine_is_unusable_and_states_no_ratio():
    t = runs(0.03, jumps=0.4)
    v = t.verdict
    assert v.kind == Timing.UNUSABLE and Reason.REPEATS_DISAGREE in dict(v.reasons), v
    text = speed_phrase(t)
    assert text.startswith("timing too noisy to state a speed ratio") and "x [" not in text
    blo, bhi = t.side_range("baseline")
    assert f"baseline runs ranged {blo:.1f}-{bhi:.1f} tok/s" in text and "rerun on a quiet machine" in text


def test_one_repeat_cannot_tell_noise_from_the_prompts():
    t = runs(0.03, repeats=1)
    assert t.verdict.kind == Timing.NOISY and dict(t.verdict.reasons) == {Reason.ONE_REPEAT: 1.0}
    assert "distribution-free" in t.method
    assert PairedTiming([50.0], [60.0], [0]).verdict.kind == Timing.UNUSABLE    # one pair: nothing to say


def test_the_machine_signal_joins_the_verdict():
    t = runs(0.03)
    t.machine = MachineSignal(0.1, 0.2, 10.0, 14.0, 2)
    assert t.verdict.kind == Timing.NOISY
    assert dict(t.verdict.reasons)[Reason.CALIBRATION] == pytest.approx(0.4)
    t.machine = MachineSignal(5.0, 5.0, 10.0, 10.0, 2)
    assert dict(t.verdict.reasons)[Reason.LOAD] == pytest.approx(2.5)
    d = t.to_dict()
    assert d["timing"] == "noisy" and d["machine"]["cores"] == 2 and len(d["speedup_interval"]) == 2


def test_two_runs_of_one_wiring_agree_or_say_why_not():
    one = {"speedup": 1.25, "speedup_interval": [1.2, 1.3], "timing": "ok", "tau": 2.1}
    assert "agree within their intervals" in agreement(one, dict(one, speedup=1.28), "deployed")
    far = {"speedup": 3.45, "speedup_interval": [3.3, 3.6], "timing": "ok", "tau": 2.1}
    assert "disagree beyond their intervals" in agreement(one, far, "deployed")
    assert "cannot be compared" in agreement(one, dict(far, timing="unusable"), "deployed")


def test_run_bench_times_pairs_in_abba_order(monkeypatch):
    """Every prompt of every repeat is one pair, run back to back, the side that goes first
    alternating; the warm-up pass is not counted."""
    import torch

    from helpers.boundaries import CapturePlan
    from helpers.live import reference as bench
    from helpers.model.engine import GenerationResult

    order = []

    def fake(kind):
        def run(*args, **kw):
            order.append(kind)
            return GenerationResult(tokens=[1, 2, 3, 4], seconds=0.1 if kind == "b" else 0.05, verify_steps=2,
                                    accepted=[1, 1], k=2, verify_seconds=0.04, draft_seconds=0.01,
                                    draft_calls=2)
        return run

    monkeypatch.setattr(bench, "baseline_generate", fake("b"))
    monkeypatch.setattr(bench, "speculative_generate", fake("s"))
    monkeypatch.setattr(bench, "check_lossless", lambda b, s: True)

    class QuietMachine:          # the load and calibration of this host are not what is tested here
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.signal = MachineSignal(0.0, 0.0, 1.0, 1.0, 2)

    monkeypatch.setattr(bench, "MachineWatch", QuietMachine)
    plan = CapturePlan(layout=(0, 1, 2), num_layers=4, source="test")
    res = bench.run_bench(object(), object(), plan, [torch.tensor([1, 2])] * 3, steps=2, max_new_tokens=4,
                          repeats=2, progress=False)
    # warm-up (pairs 0-2), then two measured repeats (pairs 3-8): AB BA AB | BA AB BA | AB BA AB
    assert "".join(order) == "bssbbs" + "sbbssb" + "bssbbs"
    assert res.timing.pairs == 6 and res.speedup == pytest.approx(2.0)
    assert res.to_dict()["timing"] == "ok" and res.row("x")["speedup_interval"] == [2.0, 2.0]
