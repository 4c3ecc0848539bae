"""The live engines behind one shape: baseline against EAGLE-3 on a real engine, beside the reference engine.

vLLM (``helpers.engines.vllm``) and SGLang (``helpers.engines.sglang``) each start in a venv and process of
their own and
answer ``generate(prompts, max_tokens)`` with their own counters (drafts, accepted tokens, accepted per
position), ``pid``, ``version``, ``start_seconds`` and ``fixes_report()`` (what the workbook changed inside
the engine for this launch). ``live_bench`` drives any of them through a ``Launch``: one baseline engine for
the whole run, one engine per wiring, requests one prompt at a time after a warm-up, the side that goes
first counterbalanced (``helpers.live.timing.baseline_first``), so the speedup is a geometric mean of paired
ratios with its interval and verdict.
Each row carries the layout the engine's rules predict it serves and, where the caller ran it, the
reference engine's figures for that layout: the prediction is checked by measurement, and a gap is
reported, never smoothed over. What is engine-specific (flags, fixes, accommodations) stays in the
engine's own folder.
"""
from __future__ import annotations

import functools
import statistics
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Callable, ContextManager, Protocol

from tqdm.auto import tqdm

from .settings import side_by_side
from .timing import MachineWatch, PairedSpeedup, PairedTiming, baseline_first, speed_phrase, tree_cpu_seconds


class LiveEngine(Protocol):
    """What ``live_bench`` needs of a running engine (``VllmEngine``, ``SGLangEngine``)."""

    version: str
    start_seconds: float

    @property
    def pid(self) -> int | None: ...

    def generate(self, prompts: list[list[int]], max_tokens: int): ...

    def fixes_report(self) -> list[dict]: ...

    def metrics_text(self) -> str | None: ...


# (draft folder or None for the baseline, the layout it is predicted to serve) -> a started engine
Launch = Callable[[Path | None, tuple[int, ...] | None], ContextManager[LiveEngine]]


@dataclass
class LiveRow(PairedSpeedup):
    """One wiring measured on the real engine."""

    wiring: str
    backend: str                     # the engine that ran, e.g. 'vllm==0.32.0' or 'sglang==0.5.23'
    rules: str                       # whose rules predicted the served layout, e.g. 'vllm==0.32.0:v1',
                                     # 'runtime 0.5.23, capture rule 0.5.9'
    draft: str
    served_layout: list[int]         # as wiring/check predict it for this release
    steps: int
    prompts: int
    max_new_tokens: int
    repeats: int
    baseline_tok_s: float
    spec_tok_s: float
    accept_length: float             # the engine's own counters: 1 + accepted / drafts
    accept_rate: float               # accepted / drafted tokens
    accepted_per_position: list[float]   # share of drafts whose position i was accepted
    drafts: int
    lossless: bool                   # every prompt's speculative output equals the baseline's
    lossless_per_prompt: list[bool]
    baseline_runs: list[float] = field(default_factory=list)
    spec_runs: list[float] = field(default_factory=list)
    fixes: list[dict] = field(default_factory=list)
    reference: dict | None = None    # the reference engine fed served_layout: tau, speedup, ...
    start_seconds: float = 0.0
    timing: PairedTiming | None = None   # the paired runs behind ``speedup``: interval and verdict
    metrics: str | None = field(default=None, repr=False)   # its /metrics page after the run (Prometheus)
    guard: dict | None = None        # the engine guard's verdict at load (helpers.live.guard), None when off
    settings: dict | None = None     # both launches' engine settings side by side (live.settings), and
                                     # any that differ besides speculation
    costs: dict | None = None        # the engine's own round costs, where it exposes them (llama.cpp:
                                     # engines.llamacpp.costs): decode, verify, draft step, break-even

    @property
    def tau_gap(self) -> float | None:
        """The engine's accept length minus the reference engine's for the predicted layout."""
        return None if not self.reference else round(self.accept_length - self.reference["tau"], 3)

    def finding(self, label: str) -> str:
        """This row in one sentence, as ``reference.finding`` says a reference row."""
        ref = f" (reference engine {self.reference['tau']:.2f})" if self.reference else ""
        return (f"{self.wiring} {label} on {self.backend}: accept length {self.accept_length:.2f}{ref}, "
                f"{'lossless' if self.lossless else 'NOT lossless'}; speed {speed_phrase(self.timing)}.")

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("timing")
        d.pop("metrics")
        return d | {
            "speedup": round(self.speedup, 3), "speedup_interval": self.speedup_interval,
            "timing": self.timing_verdict,
            "timing_detail": None if self.timing is None else self.timing.to_dict(),
            "tau_gap": self.tau_gap}

    @classmethod
    def from_dict(cls, d: dict) -> "LiveRow":
        """The row a ``to_dict`` recorded, its timing rebuilt from the recorded pairs (notebook 06 reuses
        notebook 01's deployed row this way); the /metrics page is not part of the record."""
        names = {f.name for f in fields(cls)} - {"timing", "metrics"}
        return cls(**{k: v for k, v in d.items() if k in names},
                   timing=PairedTiming.from_dict(d.get("timing_detail")))

    def row(self) -> dict:
        ref = self.reference or {}
        return {"wiring": self.wiring, "backend": self.backend, "layout": self.served_layout,
                "baseline_tok_s": self.baseline_tok_s, "spec_tok_s": self.spec_tok_s,
                "speedup": round(self.speedup, 3), "speedup_interval": self.speedup_interval,
                "timing": self.timing_verdict, "accept_length": round(self.accept_length, 3),
                "per_position": [round(x, 3) for x in self.accepted_per_position],
                "lossless": self.lossless, "ref_tau": ref.get("tau"), "ref_speedup": ref.get("speedup"),
                "tau_gap": self.tau_gap}


@dataclass
class LiveWiring:
    """A wiring to measure: the draft folder vLLM loads and the layout the release is predicted to serve."""

    name: str
    draft: Path
    served_layout: tuple[int, ...]


def _tok_s(gen) -> float:
    return sum(len(t) for t in gen.tokens) / sum(gen.seconds)


def _merge(gens: list):
    """One prompt's generations, one after another, as one call over all of them would report (the
    engine's own ``Generation`` type: both live engines share these fields)."""
    width = max((len(g.accepted_per_position) for g in gens), default=0)
    return type(gens[0])([t for g in gens for t in g.tokens], [x for g in gens for x in g.seconds],
                      sum(g.drafts for g in gens), sum(g.draft_tokens for g in gens),
                      sum(g.accepted_tokens for g in gens),
                      [sum(g.accepted_per_position[i] for g in gens if i < len(g.accepted_per_position))
                       for i in range(width)])


def _active(engine, other) -> None:
    """Only the engine being timed runs: the other is paused where it can be (SGLang's idle scheduler
    polls a core; vLLM's waits and has no ``pause``)."""
    getattr(other, "pause", lambda: None)()
    getattr(engine, "resume", lambda: None)()


def _pause_all(*engines) -> None:
    for e in engines:
        getattr(e, "pause", lambda: None)()


def _timed(engine, prompt: list[int], max_new_tokens: int, other=None) -> tuple[object, float]:
    """One prompt on one engine, with the CPU seconds its process tree spent on it."""
    if other is not None:
        _active(engine, other)
    c0 = tree_cpu_seconds(engine.pid)
    gen = engine.generate([prompt], max_new_tokens)
    return gen, tree_cpu_seconds(engine.pid) - c0


@dataclass
class PairedGenerations:
    """Every timed request of a paired run, as the engine answered it: ``prompt[j]`` is the prompt index of
    ``baseline[j]`` and ``speculative[j]``, the two sides of one pair. A ``costs`` callback reads the
    engine's own per-request timings from these instead of generating again."""

    prompt: list[int] = field(default_factory=list)
    baseline: list = field(default_factory=list)
    speculative: list = field(default_factory=list)


def _paired(base, spec, prompt_ids: list[list[int]], max_new_tokens: int,
            repeats: int, bar) -> tuple[PairedTiming, list[float], list[float], list, PairedGenerations]:
    """Every prompt of every repeat as one pair, baseline and speculative back to back, the side that
    goes first counterbalanced (``baseline_first``), as the reference engine times them
    (``reference.run_bench``). Returns the paired timing, each repeat's pooled tok/s per side, each
    repeat's speculative generations merged, and every request's generation."""
    pb, ps, po, first, cb, cs, b_runs, s_runs, gens = [], [], [], [], [], [], [], [], []
    every = PairedGenerations()
    quiet = functools.partial(_pause_all, base, spec)
    quiet()                      # the calibration kernel times the machine, not our own idle engines
    with MachineWatch() as watch:
        for rep in range(repeats):
            b_gens, s_gens = [], []
            for i, p in enumerate(prompt_ids):
                first.append(baseline_first(i, rep))
                if first[-1]:
                    bg, bc = _timed(base, p, max_new_tokens, spec)
                    sg, sc = _timed(spec, p, max_new_tokens, base)
                else:
                    sg, sc = _timed(spec, p, max_new_tokens, base)
                    bg, bc = _timed(base, p, max_new_tokens, spec)
                b_gens.append(bg)
                s_gens.append(sg)
                every.prompt.append(i)
                every.baseline.append(bg)
                every.speculative.append(sg)
                pb.append(_tok_s(bg))
                ps.append(_tok_s(sg))
                po.append(i)
                cb.append(len(bg.tokens[0]) / bc if bc > 0 else float("nan"))
                cs.append(len(sg.tokens[0]) / sc if sc > 0 else float("nan"))
                bar.update(1)
            b_runs.append(_tok_s(_merge(b_gens)))
            gens.append(_merge(s_gens))
            s_runs.append(_tok_s(gens[-1]))
        quiet()
    return PairedTiming(pb, ps, po, watch.signal, cb, cs, first), b_runs, s_runs, gens, every


class _Ahead:
    """A wiring's engine, started in a thread while the baseline starts and warms up (neither is timed
    then), and paused once up; taken by the loop, or stopped however ``live_bench`` returns."""

    def __init__(self, pool: ThreadPoolExecutor, launch: Launch, w: LiveWiring):
        self.taken = False
        self.future = pool.submit(self._start, launch, w)

    @staticmethod
    def _start(launch: Launch, w: LiveWiring):
        cm = launch(w.draft, tuple(w.served_layout))
        engine = cm.__enter__()
        getattr(engine, "pause", lambda: None)()
        return cm, engine

    def take(self):
        self.taken = True
        return self.future.result()

    def drop(self) -> None:
        if self.taken:
            return
        try:
            cm, _ = self.future.result()
        except BaseException:       # it never started: nothing to stop
            return
        cm.__exit__(None, None, None)


def live_bench(launch: Launch, name: str, wirings: list[LiveWiring], prompt_ids: list[list[int]], *,
               steps: int, max_new_tokens: int, repeats: int, rules: str,
               progress: bool = True, costs: Callable | None = None,
               start_ahead: int = 0) -> list[LiveRow]:
    """Each wiring against one shared baseline engine; engines are stopped however this returns.
    ``name``: the engine family ('vllm', 'sglang', 'llamacpp'), for the rows' ``backend``. ``costs(base,
    spec, every)``: a round's costs, from the paired run's own requests (``every``) and whatever the
    callback still measures while both engines are up, into the row's ``costs``. ``start_ahead``: how many
    wirings' engines (the first ones) start beside the baseline's start and warm-up, each paused once up
    until its turn: as many as the engine's launches may hold side by side (their memory is bounded)."""
    if not wirings:
        raise ValueError("no wirings to benchmark")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1 (a warm-up pass runs before them), got {repeats}")
    rows = []
    with ExitStack() as outer:
        ahead: list[_Ahead] = []
        if start_ahead > 0:
            pool = outer.enter_context(ThreadPoolExecutor(min(start_ahead, len(wirings))))
            for w in wirings[:start_ahead]:
                ahead.append(_Ahead(pool, launch, w))
                outer.callback(ahead[-1].drop)
        base = outer.enter_context(launch(None, None))
        base.generate(prompt_ids[:1], max_new_tokens)                 # warm-up
        for a in ahead:              # nothing is timed while an engine is still starting; one that could
            a.future.result()        # not start fails the run now, before any other is measured
        for n, w in enumerate(wirings):
            getattr(base, "pause", lambda: None)()                    # the next engine loads alone
            with ExitStack() as inner:
                if n < len(ahead):
                    cm, spec = ahead[n].take()
                    inner.push(cm)
                    getattr(spec, "resume", lambda: None)()
                else:
                    spec = inner.enter_context(launch(w.draft, tuple(w.served_layout)))
                spec.generate(prompt_ids[:1], max_new_tokens)            # warm-up
                bar = tqdm(total=repeats * len(prompt_ids), desc=f"{name} {w.name}", disable=not progress)
                timing, b_runs, s_runs, gens, every = _paired(base, spec, prompt_ids, max_new_tokens, repeats,
                                                              bar)
                bar.close()
                measured = costs(base, spec, every) if costs is not None else None
                getattr(base, "resume", lambda: None)()
                drafts = sum(g.drafts for g in gens)
                accepted = sum(g.accepted_tokens for g in gens)
                drafted = sum(g.draft_tokens for g in gens)
                width = max((len(g.accepted_per_position) for g in gens), default=0)
                per_pos = [sum(g.accepted_per_position[i] for g in gens if i < len(g.accepted_per_position))
                           / drafts if drafts else 0.0 for i in range(width)]
                # lossless: the last repeat's speculative output against the baseline's, prompt by prompt
                same = [a == b for a, b in zip(gens[-1].tokens,
                                               [g.tokens[0] for g in every.baseline[-len(prompt_ids):]])]
                rows.append(LiveRow(
                    wiring=w.name, backend=f"{name}=={spec.version}", rules=str(rules),
                    draft=str(w.draft), served_layout=list(w.served_layout), steps=steps,
                    prompts=len(prompt_ids), max_new_tokens=max_new_tokens, repeats=repeats,
                    baseline_tok_s=round(statistics.fmean(b_runs), 2),
                    spec_tok_s=round(statistics.fmean(s_runs), 2),
                    accept_length=round(1 + accepted / drafts, 3) if drafts else 1.0,
                    accept_rate=round(accepted / drafted, 3) if drafted else 0.0,
                    accepted_per_position=[round(x, 3) for x in per_pos], drafts=drafts,
                    lossless=all(same), lossless_per_prompt=same,
                    baseline_runs=[round(x, 2) for x in b_runs], spec_runs=[round(x, 2) for x in s_runs],
                    fixes=spec.fixes_report(), start_seconds=spec.start_seconds, timing=timing,
                    metrics=spec.metrics_text(), guard=spec.guard_verdict(),
                    settings=side_by_side(base.settings(), spec.settings()).to_dict(), costs=measured))
    return rows
