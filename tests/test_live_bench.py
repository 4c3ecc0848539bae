"""helpers.live.bench on stand-in engines: the first wiring's engine started beside the baseline, each
engine warmed on one prompt, losslessness judged pair by pair, and every engine stopped on every path."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

from helpers.live import bench
from helpers.live.bench import LiveWiring
from helpers.live.timing import MachineSignal


@dataclass
class Gen:
    tokens: list[list[int]]
    seconds: list[float]
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)


class Engine:
    version = "0"
    start_seconds = 0.1
    pid = None

    def __init__(self, name: str, log: list, differ: bool = False):
        self.name, self.log, self.differ = name, log, differ
        self.thread = threading.current_thread().name
        self.requests = 0

    def generate(self, prompts, max_tokens):
        self.requests += len(prompts)
        self.log.append(f"{self.name} generate {len(prompts)}")
        spec = self.name != "base"
        toks = [[p[0] + 1 + (1 if self.differ and spec else 0)] * 3 for p in prompts]
        return Gen(toks, [0.01 if spec else 0.02] * len(prompts), drafts=len(prompts) if spec else 0,
                   draft_tokens=2 * len(prompts) if spec else 0, accepted_tokens=len(prompts) if spec else 0,
                   accepted_per_position=[len(prompts), 0] if spec else [])

    def pause(self):
        self.log.append(f"{self.name} pause")

    def resume(self):
        self.log.append(f"{self.name} resume")

    def fixes_report(self):
        return []

    def metrics_text(self):
        return None

    def guard_verdict(self):
        return None

    def settings(self):
        return {"--threads": "2"}


class Quiet:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.signal = MachineSignal(0.0, 0.0, 1.0, 1.0, 2)


@pytest.fixture()
def launches(monkeypatch):
    monkeypatch.setattr(bench, "MachineWatch", Quiet)
    monkeypatch.setattr(bench, "tree_cpu_seconds", lambda pid: 0.0)
    log, engines = [], {}

    def make(fail_base=False, differ=False):
        @contextmanager
        def launch(draft, layout):
            name = "base" if draft is None else str(draft)
            if name == "base" and fail_base:
                raise RuntimeError("the baseline engine did not start")
            e = engines[name] = Engine(name, log, differ)
            log.append(f"{name} start")
            try:
                yield e
            finally:
                log.append(f"{name} stop")
        return launch

    return make, log, engines


WIRINGS = [LiveWiring("deployed", "d1", (2, 6, 9)), LiveWiring("fix A", "d2", (0, 3, 7))]
PROMPTS = [[1, 2], [3, 4], [5, 6]]


def test_the_first_wiring_starts_beside_the_baseline_and_every_engine_stops(launches):
    make, log, engines = launches
    rows = bench.live_bench(make(), "sglang", WIRINGS, PROMPTS, steps=2, max_new_tokens=3, repeats=2,
                            rules="r", progress=False, start_ahead=1)
    assert [r.wiring for r in rows] == ["deployed", "fix A"] and all(r.lossless for r in rows)
    assert engines["d1"].thread != threading.main_thread().name         # started in a thread
    assert engines["base"].thread == engines["d2"].thread == threading.main_thread().name
    assert log.index("d1 pause") < log.index("d1 resume") < log.index("d1 generate 1")
    # each engine warmed on one prompt, then 3 prompts x 2 repeats timed one at a time
    assert engines["base"].requests == 1 + 2 * 3 * 2 and engines["d1"].requests == engines["d2"].requests == 7
    assert sorted(x for x in log if x.endswith("stop")) == ["base stop", "d1 stop", "d2 stop"]
    assert rows[0].accept_length == pytest.approx(2.0) and rows[0].speedup == pytest.approx(2.0)


def test_every_wiring_may_start_ahead_and_each_waits_paused_for_its_turn(launches):
    make, log, engines = launches
    rows = bench.live_bench(make(), "sglang", WIRINGS, PROMPTS, steps=2, max_new_tokens=3, repeats=1,
                            rules="r", progress=False, start_ahead=len(WIRINGS))
    assert [r.wiring for r in rows] == ["deployed", "fix A"]
    main = threading.main_thread().name
    assert engines["d1"].thread != main and engines["d2"].thread != main and engines["base"].thread == main
    # fix A's engine stays paused while the deployed one is timed, and resumes only for its own turn
    assert log.index("d2 pause") < log.index("d1 generate 1")
    assert log.index("d2 resume") > log.index("d1 stop")
    assert sorted(x for x in log if x.endswith("stop")) == ["base stop", "d1 stop", "d2 stop"]


def test_a_baseline_that_fails_to_start_still_stops_the_engine_started_ahead(launches):
    make, log, engines = launches
    with pytest.raises(RuntimeError, match="baseline engine did not start"):
        bench.live_bench(make(fail_base=True), "sglang", WIRINGS, PROMPTS, steps=2, max_new_tokens=3,
                         repeats=1, rules="r", progress=False, start_ahead=1)
    assert "d1 start" in log and "d1 stop" in log and "d2 start" not in log


def test_lossless_compares_each_pair_and_a_differing_output_is_not_lossless(launches):
    make, log, engines = launches
    rows = bench.live_bench(make(differ=True), "sglang", WIRINGS[:1], PROMPTS, steps=2, max_new_tokens=3,
                            repeats=1, rules="r", progress=False)
    assert rows[0].lossless is False and rows[0].lossless_per_prompt == [False, False, False]
    assert engines["d1"].thread == threading.main_thread().name          # not started ahead unless asked
