"""How many of this process's cores are free now, and torch's threads sized to them.

On a small machine shared with other work, torch's default (one OpenMP thread per core) makes its threads
wait on each other at every operator's barrier whenever another job holds one of the cores: measured on 2
cores with a busy loop on one, tests that run small torch models took five to six times as long
(docs/timing.md), where one thread on the free core would have lost nothing. So the notebooks (their setup
cell) and the test suite ask ``free_cores`` first and give torch that many threads.

``free_cores`` samples ``/proc/stat`` over a short window for the cores in this process's affinity: the
idle share of each, added up, is how many cores no other work is using (this process is between tasks
when it asks). Where ``/proc/stat`` cannot be read it answers the affinity's size.
"""
from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass

STAT = "/proc/stat"
WINDOW_S = 0.2          # long enough to see a busy core as busy; short enough to ask before every notebook
SLACK = 0.25            # a core idle for 75% of the window counts as free (a daemon's tick is not a job)


def affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _idle_and_total(cpus: set[int], path: str) -> dict[int, tuple[int, int]]:
    out = {}
    with open(path, encoding="ascii") as f:
        for line in f:
            if not line.startswith("cpu") or line.startswith("cpu "):
                continue
            name, *fields = line.split()
            cpu = int(name[3:])
            if cpu in cpus:
                # user nice system idle iowait irq softirq steal
                ticks = [int(x) for x in fields[:8]]
                out[cpu] = (ticks[3] + ticks[4], sum(ticks))
    return out


@dataclass(frozen=True)
class Cores:
    """What ``free_cores`` saw: the cores this process may run on, and how many of them were idle."""

    allowed: int
    idle: float           # cores' worth of idle time over the window (nan where it could not be read)

    @property
    def free(self) -> int:
        if math.isnan(self.idle):
            return self.allowed
        return max(1, min(self.allowed, math.floor(self.idle + SLACK)))

    def line(self) -> str:
        if self.free == self.allowed:
            return f"{self.allowed} of {self.allowed} cores free: torch runs {self.allowed} threads"
        busy = self.allowed - self.idle
        return (f"{self.free} of {self.allowed} cores free (other work is using {busy:.1f}): torch runs "
                f"{self.free} thread{'s' if self.free != 1 else ''}, so no thread waits on a "
                f"core another job holds")


def free_cores(window_s: float = WINDOW_S, path: str = STAT) -> Cores:
    cpus = affinity()
    try:
        a = _idle_and_total(cpus, path)
        time.sleep(window_s)
        b = _idle_and_total(cpus, path)
    except (OSError, ValueError):
        return Cores(len(cpus), float("nan"))
    idle = 0.0
    for cpu, (i1, t1) in b.items():
        i0, t0 = a.get(cpu, (i1, t1))
        if t1 > t0:
            idle += (i1 - i0) / (t1 - t0)
        else:
            idle += 1.0                       # no tick in the window: nothing ran there
    return Cores(len(cpus), idle if b else float("nan"))


def size_torch_threads(window_s: float = WINDOW_S) -> Cores:
    """Give torch (already imported or not) as many intra-op threads as there are free cores now."""
    import torch

    seen = free_cores(window_s)
    if torch.get_num_threads() != seen.free:
        torch.set_num_threads(seen.free)
    return seen
