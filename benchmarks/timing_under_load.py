"""A benchmark of the benchmark: ``bench`` on a quiet machine, then beside a CPU hog, side by side.

    .venv/bin/python benchmarks/timing_under_load.py [--backend reference|vllm|sglang] [--repeats N]

The hog is one busy Python process (pinned to one core where ``taskset`` exists). For each run it
prints the paired speedup, its interval, the timing verdict, each side's tok/s range and the tokens per
CPU-second of the engine's process tree, then says whether the loaded run either lands inside the quiet
run's interval or flags itself ``noisy``/``unusable`` -- what docs/timing.md requires of the noise gate.
Not a test: it reads the clock on purpose and takes minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAIR = REPO / "data" / "tiny-kimi"


def bench(args: list[str]) -> dict:
    cmd = [sys.executable, "-m", "helpers", "bench", "--json", *args]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        raise SystemExit(f"bench failed ({out.returncode}): {out.stderr.strip().splitlines()[-1:]}")
    d = json.loads(out.stdout.strip().splitlines()[-1])
    d["wall_s"] = round(time.perf_counter() - t0, 1)
    return d


def hog() -> subprocess.Popen:
    pin = ["taskset", "-c", "0"] if shutil.which("taskset") else []
    return subprocess.Popen([*pin, sys.executable, "-c", "while True: pass"])


def show(name: str, d: dict) -> None:
    t = d.get("timing_detail") or {}
    cpu = t.get("cpu_tok_s") or {}
    print(f"{name:<7} speedup {d['speedup']:.2f}x {d['speedup_interval']}  timing {d['timing']:<8} "
          f"baseline {t.get('baseline_range')} tok/s  speculative {t.get('spec_range')} tok/s  "
          f"cpu tok/s {cpu or '-'}  accept length {d.get('tau', d.get('accept_length'))}  ({d['wall_s']} s)")
    if t.get("reasons"):
        print(f"        reasons: {t['reasons']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="reference", choices=["reference", "vllm", "sglang"])
    ap.add_argument("--repeats", type=int, default=4)
    a, rest = ap.parse_known_args()
    args = ["--target", str(PAIR / "target"), "--draft", str(PAIR / "draft"), "--backend", a.backend,
            "--repeats", str(a.repeats), "--max-new-tokens", "48", "--steps", "5", *rest]
    print(f"load before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; backend {a.backend}")
    quiet = bench(args)
    h = hog()
    try:
        time.sleep(2)
        loaded = bench(args)
    finally:
        h.kill()
        h.wait()
    show("quiet", quiet)
    show("hogged", loaded)
    lo, hi = quiet["speedup_interval"]
    inside = lo <= loaded["speedup"] <= hi
    flagged = loaded["timing"] in ("noisy", "unusable")
    qc = (quiet.get("timing_detail") or {}).get("cpu_tok_s") or {}
    lc = (loaded.get("timing_detail") or {}).get("cpu_tok_s") or {}
    for side in ("baseline", "speculative"):
        if qc.get(side) and lc.get(side):
            print(f"cpu tok/s {side}: quiet {qc[side]}, hogged {lc[side]} ({lc[side] / qc[side] - 1:+.1%})")
    print(f"gate: loaded ratio inside the quiet interval: {inside}; loaded run flagged: {flagged} -> "
          f"{'PASS' if inside or flagged else 'FAIL'}")
    return 0 if inside or flagged else 1


if __name__ == "__main__":
    sys.exit(main())
