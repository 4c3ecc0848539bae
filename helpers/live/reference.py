"""The reference engine timed: baseline against speculative throughput, measured in one process on the
same prompts (``bench --backend reference``, notebooks 01 and 06, and beside every live row).

Baseline and speculative decoding are timed as pairs: the same prompt back to back, every prompt in
every repeat, after one warm-up pair on the first prompt that is not counted; which side goes first is
counterbalanced (``timing.baseline_first``: each prompt AB in one repeat, BA in the next), so repeats
default to an even number. The speedup is the geometric mean of the paired ratios with its interval and
a timing verdict (``timing.PairedTiming``); the round costs (decode, verify, draft step) are pooled over
every measured pass, so the break-even accept length does not hang on one pass.
"""
from __future__ import annotations

import functools
import statistics
import time
from dataclasses import dataclass, field, fields

import torch
from tqdm.auto import tqdm

from ..boundaries import CapturePlan
from ..errors import BadOption, check_finite
from ..investigation.pair import (
    check_steps,
)
from ..model.engine import (
    GenerationResult,
    acceptance_histogram,
    baseline_generate,
    check_lossless,
    position_acceptance,
    speculative_generate,
)
from .timing import MachineWatch, PairedSpeedup, PairedTiming, baseline_first, speed_phrase


@dataclass
class BenchResult(PairedSpeedup):
    layout: tuple[int, ...]
    label: str
    steps: int
    baseline_tok_s: float
    spec_tok_s: float
    tau: float
    accept_rate: float
    lossless: bool
    lossless_per_prompt: list[bool]
    histogram: list[int]
    position_acceptance: list[float]
    verify_steps: int
    tokens: int
    repeats: int
    baseline_runs: list[float] = field(default_factory=list)
    spec_runs: list[float] = field(default_factory=list)
    plan_source: str = ""
    decode_ms: float = 0.0          # baseline: one target forward per token
    verify_ms: float = 0.0          # speculative: one target forward over k+1 tokens
    draft_step_ms: float = 0.0      # one draft forward (extend or chain step)
    per_prompt: list[dict] = field(default_factory=list)  # tau and median tok/s of each prompt
    timing: PairedTiming | None = None   # the paired runs behind ``speedup``: its interval and verdict
    engine: str = "reference"            # what measured it: this workbook's reference engine

    @property
    def break_even_tau(self) -> float:
        """The accept length at which speculation only ties the baseline here: one round's measured
        cost in baseline decode steps (tau / speedup). Above it speculation pays; below it, it loses."""
        return self.tau / self.speedup if self.speedup else 0.0

    @property
    def slower_prompts(self) -> int:
        """Prompts on which speculation lost to the baseline: a fleet average can hide them."""
        return sum(1 for p in self.per_prompt if p["speedup"] < 1.0)

    @property
    def draft_cost_ratio(self) -> float:
        """A draft step's cost in target decode steps (EAGLE's 'c')."""
        return self.draft_step_ms / self.decode_ms if self.decode_ms else 0.0

    @property
    def predicted_speedup(self) -> float:
        """tau x decode / (verify + k draft steps): what accept length and overheads allow."""
        cycle = self.verify_ms + self.steps * self.draft_step_ms
        return self.tau * self.decode_ms / cycle if cycle else 0.0

    @property
    def efficiency(self) -> float:
        """speedup / tau: the share of the accept length's ideal gain that survives overheads."""
        return self.speedup / self.tau if self.tau else 0.0

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["layout"] = list(self.layout)
        d.pop("timing")
        d.update(speedup_interval=self.speedup_interval, timing=self.timing_verdict,
                 timing_detail=None if self.timing is None else self.timing.to_dict())
        d.update(speedup=round(self.speedup, 3), efficiency=round(self.efficiency, 3),
                 draft_cost_ratio=round(self.draft_cost_ratio, 3),
                 predicted_speedup=round(self.predicted_speedup, 3),
                 break_even_tau=round(self.break_even_tau, 3), slower_prompts=self.slower_prompts)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "BenchResult":
        """The result a ``to_dict`` recorded (notebook 06 reuses notebook 01's deployed row this way): the
        recorded fields, the timing rebuilt from its pairs, every derived figure computed again."""
        names = {f.name for f in fields(cls)} - {"timing"}
        kept = {k: v for k, v in d.items() if k in names}
        return cls(**kept | {"layout": tuple(d["layout"])},
                   timing=PairedTiming.from_dict(d.get("timing_detail")))

    def row(self, wiring: str) -> dict:
        """One configuration as a table row, named ``wiring``: notebooks 01 and 06 and summary.json
        (``reports.bench_tables``) must show the same rounded figures under the same names."""
        return {"wiring": wiring, "engine": self.engine, "layout": list(self.layout),
                "baseline_tok_s": self.baseline_tok_s, "spec_tok_s": self.spec_tok_s,
                "speedup": round(self.speedup, 3), "speedup_interval": self.speedup_interval,
                "timing": self.timing_verdict, "tau": self.tau,
                "accept_rate": self.accept_rate, "speedup_per_tau": round(self.efficiency, 3),
                "lossless": self.lossless, "decode_ms": self.decode_ms, "verify_ms": self.verify_ms,
                "draft_step_ms": self.draft_step_ms, "draft_cost_ratio": round(self.draft_cost_ratio, 3),
                "predicted_speedup": round(self.predicted_speedup, 3),
                "break_even_tau": round(self.break_even_tau, 3), "slower_prompts": self.slower_prompts,
                "prompts": len(self.per_prompt)}


def encode_prompts(tokenizer, prompts: list[str], device="cpu") -> list[torch.Tensor]:
    # verbose=False: transformers' own 'longer than the maximum' warning; fit_prompts says it in one line
    return [torch.tensor(tokenizer(p, verbose=False)["input_ids"], dtype=torch.long, device=device)
            for p in prompts]


def run_bench(target, draft, plan: CapturePlan, prompt_ids: list[torch.Tensor], steps: int = 5,
              max_new_tokens: int = 96, repeats: int = 4, progress: bool = True,
              label: str = "") -> BenchResult:
    if not prompt_ids:
        raise ValueError("no prompts to benchmark")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1 (the warm-up pass is not counted), got {repeats}")
    check_steps(steps, "steps")
    limit = getattr(getattr(target, "config", None), "max_position_embeddings", None)
    longest = max(int(p.numel()) for p in prompt_ids)
    if limit and longest + max_new_tokens + steps > limit:  # checked before any work, not after minutes
        raise BadOption(f"the longest prompt ({longest} tokens) + max_new_tokens {max_new_tokens} "
                        f"+ steps {steps} "
                        f"exceeds the target's {limit} positions (max_position_embeddings); "
                        f"shorten or truncate "
                        f"the prompts (bench --truncate-prompts) or generate fewer tokens")
    bar = tqdm(total=1 + repeats * len(prompt_ids), desc=f"bench {label or plan.layout}",
               disable=not progress, mininterval=1.0)
    with bar:
        base_all, spec_all, pairs, signal = _measure(
            functools.partial(baseline_generate, target, max_new_tokens=max_new_tokens),
            functools.partial(speculative_generate, target, draft, plan, max_new_tokens=max_new_tokens,
                              k=steps),
            prompt_ids, repeats, bar)
    keys = ("base", "spec", "prompt", "base_cpu", "spec_cpu", "first")
    col = {key: [p[key] for p in pairs] for key in keys}
    timing = PairedTiming(col["base"], col["spec"], col["prompt"], signal, col["base_cpu"], col["spec_cpu"],
                          col["first"])
    base_last, spec_last = base_all[-1], spec_all[-1]
    base_flat = [b for rep in base_all for b in rep]
    spec_flat = [s for rep in spec_all for s in rep]
    base_runs = [sum(len(b.tokens) for b in rep) / sum(b.seconds for b in rep) for rep in base_all]
    spec_runs = [sum(len(s.tokens) for s in rep) / sum(s.seconds for s in rep) for rep in spec_all]
    lossless = [check_lossless(b, s) for b, s in zip(base_last, spec_last)]
    # round costs pooled over every measured pass of the same paired design
    decode_ms = 1000 * sum(b.seconds for b in base_flat) / max(sum(len(b.tokens) for b in base_flat), 1)
    verify_ms = (1000 * sum(s.verify_seconds for s in spec_flat)
                 / max(sum(s.verify_steps for s in spec_flat), 1))
    draft_ms = 1000 * sum(s.draft_seconds for s in spec_flat) / max(sum(s.draft_calls for s in spec_flat), 1)
    accepted = sum(sum(r.accepted) for r in spec_last)
    per_prompt = _per_prompt(pairs, base_last, spec_last, lossless)
    verifies = sum(r.verify_steps for r in spec_last)
    check_finite("tok/s", *base_runs, *spec_runs)
    tokens_b, secs_b = sum(len(b.tokens) for b in base_flat), sum(b.seconds for b in base_flat)
    tokens_s, secs_s = sum(len(s.tokens) for s in spec_flat), sum(s.seconds for s in spec_flat)
    return BenchResult(
        layout=tuple(plan.layout), label=label or plan.label, steps=steps,
        baseline_tok_s=round(tokens_b / secs_b, 2), spec_tok_s=round(tokens_s / secs_s, 2),
        tau=round((accepted + verifies) / verifies, 3) if verifies else 1.0,
        accept_rate=round(accepted / (verifies * steps), 3) if verifies else 0.0,
        lossless=all(lossless), lossless_per_prompt=lossless, histogram=acceptance_histogram(spec_last),
        position_acceptance=[round(x, 3) for x in position_acceptance(spec_last)], verify_steps=verifies,
        tokens=sum(len(r.tokens) for r in spec_last), repeats=repeats,
        baseline_runs=[round(x, 2) for x in base_runs], spec_runs=[round(x, 2) for x in spec_runs],
        plan_source=plan.source, decode_ms=round(decode_ms, 3), verify_ms=round(verify_ms, 3),
        draft_step_ms=round(draft_ms, 3), per_prompt=per_prompt, timing=timing,
    )


def _measure(baseline, speculative, prompt_ids, repeats: int, bar):
    """A warm-up pair on the first prompt, then ``repeats`` passes over the prompts, each prompt a pair
    (``baseline(ids)``, ``speculative(ids)``) in the balanced order ``baseline_first`` gives. Returns the
    generations per measured pass, one record per measured pair (wall and CPU tok/s of each side, the
    prompt, which ran first), and the machine's noise."""
    base_all: list[list[GenerationResult]] = []    # per measured repeat, per prompt
    spec_all: list[list[GenerationResult]] = []
    pairs: list[dict] = []

    def timed(fn):
        c0 = time.process_time()
        out = fn()
        return out, time.process_time() - c0

    with MachineWatch() as watch:
        for rep in range(repeats + 1):  # rep 0 warms up, on the first prompt
            base_rep, spec_rep = [], []
            for i, ids in enumerate(prompt_ids if rep else prompt_ids[:1]):
                run_b, run_s = functools.partial(baseline, ids), functools.partial(speculative, ids)
                first = baseline_first(i, rep - 1)      # measured repeats count from 0; the warm-up is -1
                if first:
                    (b, cb), (s, cs) = timed(run_b), timed(run_s)
                else:
                    (s, cs), (b, cb) = timed(run_s), timed(run_b)
                if rep:
                    pairs.append({"prompt": i, "first": first, "base": len(b.tokens) / b.seconds,
                                  "spec": len(s.tokens) / s.seconds,
                                  "base_cpu": len(b.tokens) / cb if cb > 0 else float("nan"),
                                  "spec_cpu": len(s.tokens) / cs if cs > 0 else float("nan")})
                base_rep.append(b)
                spec_rep.append(s)
                bar.update(1)
            if rep:
                base_all.append(base_rep)
                spec_all.append(spec_rep)
    return base_all, spec_all, pairs, watch.signal


def _per_prompt(pairs: list[dict], base_last, spec_last, lossless: list[bool]) -> list[dict]:
    """Each prompt's figures: its tau in the last pass, the median tok/s of each side over its pairs and the
    geometric mean of their ratios."""
    out = []
    for i, s in enumerate(spec_last[:len(base_last)]):
        mine = [p for p in pairs if p["prompt"] == i]
        out.append({"prompt": i, "tau": round(s.tau, 3),
                    "baseline_tok_s": round(statistics.median(p["base"] for p in mine), 2),
                    "spec_tok_s": round(statistics.median(p["spec"] for p in mine), 2),
                    "speedup": round(statistics.geometric_mean(p["spec"] / p["base"] for p in mine), 3),
                    "lossless": lossless[i]})
    return out


def finding(name: str, label: str, res: BenchResult) -> str:
    """One configuration in one sentence: the deterministic figures always, the speed ratio only as far
    as its timing supports it (``timing.speed_phrase``)."""
    return (f"{name} {label} on the {res.engine} engine: accept length {res.tau:.2f}, "
            f"{'lossless' if res.lossless else 'NOT lossless'}; speed {speed_phrase(res.timing)}.")


def reference_figures(res: BenchResult) -> dict:
    """The reference engine's figures a live row is checked against (same layout, prompts, steps)."""
    return {"engine": "reference", "tau": res.tau, "speedup": round(res.speedup, 3),
            "speedup_interval": res.speedup_interval, "timing": res.timing_verdict,
            "accept_rate": res.accept_rate, "position_acceptance": res.position_acceptance,
            "lossless": res.lossless, "baseline_tok_s": res.baseline_tok_s, "spec_tok_s": res.spec_tok_s}


