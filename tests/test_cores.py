"""helpers.cores: the cores free now, read from /proc/stat, and torch's threads sized to them."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import pytest
import torch

from helpers import cores


def test_idle_ticks_are_added_up_per_allowed_core(monkeypatch):
    samples = iter([{0: (100, 1000), 1: (100, 1000)}, {0: (100, 1100), 1: (195, 1100)}])
    monkeypatch.setattr(cores, "affinity", lambda: {0, 1})
    monkeypatch.setattr(cores, "_idle_and_total", lambda cpus, path: next(samples))
    seen = cores.free_cores(window_s=0)
    assert seen.allowed == 2 and seen.idle == pytest.approx(0.95) and seen.free == 1
    assert seen.line() == ("1 of 2 cores free (other work is using 1.1): torch runs 1 thread, so no thread "
                           "waits on a core another job holds")
    assert cores.Cores(2, 1.8).free == 2 and cores.Cores(4, 0.0).free == 1       # never none
    assert cores.Cores(2, 1.8).line() == "2 of 2 cores free: torch runs 2 threads"


def test_an_unreadable_stat_answers_the_affinity(tmp_path):
    seen = cores.free_cores(window_s=0, path=str(tmp_path / "missing"))
    assert math.isnan(seen.idle) and seen.free == seen.allowed == len(cores.affinity())


@pytest.mark.skipif(not os.path.exists(cores.STAT) or len(cores.affinity()) < 2,
                    reason="needs /proc/stat and two cores")
def test_a_core_held_by_a_busy_loop_is_not_free():
    core = min(cores.affinity())
    loop = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{core}}})\n"
                             "while True: pass"])
    try:
        time.sleep(0.5)
        seen = cores.free_cores(window_s=0.5)
        assert seen.free <= seen.allowed - 1, seen
        before = torch.get_num_threads()
        try:
            assert cores.size_torch_threads(window_s=0.5).free == torch.get_num_threads() <= seen.allowed - 1
        finally:
            torch.set_num_threads(before)
    finally:
        loop.kill()
        loop.wait()
