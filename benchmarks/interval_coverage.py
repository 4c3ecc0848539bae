"""How often the speed ratio's 95% interval holds the true ratio, for the design the notebooks and ``bench``
run (prompts x repeats, counterbalanced), by simulation.

    .venv/bin/python benchmarks/interval_coverage.py [--sims 1000]

Each simulated run draws every prompt's effect around a true speedup (the spread between prompts) and
every pair's timing noise (the spread within a prompt, which in a recorded run already holds any
first-runner effect the balanced order leaves). The spreads are those of recorded runs
(tests/kernels/llamacpp_x96_f16.json: the three wirings' measured pairs, 6 prompts x 2 repeats), plus a
run with no spread between prompts. Two methods are compared on the same draws: the percentile two-stage
bootstrap the workbook used before, and the t interval over the prompts' means it uses now
(``PairedTiming.interval``). Prints a markdown table (docs/timing.md, "Coverage").
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from helpers.live.timing import PairedTiming, baseline_first  # noqa: E402

TRUE = 1.3
RECORDED = Path(__file__).resolve().parent.parent / "tests" / "kernels" / "llamacpp_x96_f16.json"


def recorded_spreads() -> list[tuple[str, float, float]]:
    """(label, between-prompt sd, within-prompt sd) of each recorded row's paired log ratios (one-way
    random effects, method of moments)."""
    out = []
    for row in json.loads(RECORDED.read_text(encoding="utf-8"))["rows"]:
        d = row["timing_detail"]["pairs_measured"]
        by: dict[int, list[float]] = {}
        for b, s, p in zip(d["base_tok_s"], d["spec_tok_s"], d["prompt_of"]):
            by.setdefault(p, []).append(math.log(s / b))
        r = min(len(v) for v in by.values())
        within = [x - statistics.fmean(v) for v in by.values() for x in v]
        sw = math.sqrt(sum(x * x for x in within) / (len(within) - len(by)))
        means = [statistics.fmean(v) for v in by.values()]
        sb = math.sqrt(max(0.0, statistics.variance(means) - sw ** 2 / r))
        out.append((f"recorded: llama.cpp, {row['wiring']}", round(sb, 3), round(sw, 3)))
    return out


def simulate(rnd: random.Random, k: int, repeats: int, sd_between: float, sd_within: float) -> PairedTiming:
    effects = [math.log(TRUE) + rnd.gauss(0, sd_between) for _ in range(k)]
    base, spec, prompt_of, first = [], [], [], []
    for rep in range(repeats):
        for i in range(k):
            bf = baseline_first(i, rep)
            lr = effects[i] + rnd.gauss(0, sd_within)
            base.append(100.0)
            spec.append(100.0 * math.exp(lr))
            prompt_of.append(i)
            first.append(bf)
    return PairedTiming(base, spec, prompt_of, base_first=first)


def coverage(k: int, repeats: int, sd_between: float, sd_within: float, sims: int, bootstrap: bool,
             seed: int = 0) -> tuple[float, float]:
    """(coverage of the t interval, of the percentile bootstrap or nan) over ``sims`` simulated runs."""
    rnd = random.Random(seed)
    hit_t = hit_b = 0
    for _ in range(sims):
        t = simulate(rnd, k, repeats, sd_between, sd_within)
        lo, hi = t.interval
        hit_t += lo <= TRUE <= hi
        if bootstrap:
            blo, bhi = t._percentile(t._bootstrap(prompts=True))
            hit_b += blo <= TRUE <= bhi
    return hit_t / sims, (hit_b / sims if bootstrap else float("nan"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sims", type=int, default=1000)
    ap.add_argument("--prompts", default="6,12")
    ns = ap.parse_args()
    spreads = recorded_spreads() + [("no spread between prompts", 0.0, 0.05)]
    se = math.sqrt(0.95 * 0.05 / ns.sims)
    print(f"{ns.sims} simulated runs per cell, 2 repeats per prompt; a cell's own 95% range is 0.95 ± "
          f"{1.96 * se:.3f}\n")
    print("| spread (between, within sd of log ratio) | prompts | percentile two-stage bootstrap (before) "
          "| t over prompt means (now) |\n|---|---|---|---|")
    for label, sb, sw in spreads:
        for k in (int(x) for x in ns.prompts.split(",")):
            ct, cb = coverage(k, 2, sb, sw, ns.sims, bootstrap=True)
            print(f"| {label} ({sb}, {sw}) | {k} | {cb:.3f} | {ct:.3f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
