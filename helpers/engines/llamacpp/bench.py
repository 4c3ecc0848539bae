"""llama.cpp's side of the live benchmark (``helpers.live.bench``): convert, guard, launch.

The target and every wiring's draft are converted by llama.cpp's own converter (``convert``; f32, so the
weights are the ones the reference engine uses). What a draft serves is then read from its GGUF
(``eagle3.target_layers``, used as given: each id the input of that layer), not predicted from its config:
the row's layout is the file's, and where the rules' prediction differs the row says so in its ``guard``
line. Before each speculative launch the guard judges the file against the draft's training record
(``live.guard.before_llamacpp``): ``refuse`` stops a miswired or unjudgeable draft before ``llama-server``
starts. One baseline server for the whole run, one server per wiring, requests timed in counterbalanced
pairs (``live.bench``); a round's costs in decode steps (``costs``) are read from those requests' own
timings, with one verify per prompt measured after them.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from ...cores import affinity
from ...live import bench as live
from ...live import guard as guard_mod
from ...live.bench import LiveRow, LiveWiring
from ...live.guard import Mode
from ...rules.conventions import Engine, read_target
from . import costs
from .build import ServerBuild
from .convert import Converted, convert, describe, say
from .engine import LlamacppEngine, LlamacppEngineError, ServerLaunch


def host_threads() -> int:
    """The cores this process may run on: llama.cpp's threads, the same on both sides of a ratio."""
    return max(1, len(affinity()))


def convert_wirings(target: Path, wirings: list[LiveWiring], log=say,
                    outtype: str = "f32") -> tuple[Converted, dict[Path, Converted]]:
    """The target's GGUF (its weights as ``outtype``) and each wiring's draft GGUF (f32: the draft's
    arithmetic is the reference engine's), cached while their inputs are unchanged."""
    tgt = convert(target, log=log, outtype=outtype)
    drafts = {}
    for w in wirings:
        drafts[Path(w.draft)] = c = convert(w.draft, target_dir=target, log=log)
        log(f"[llamacpp] {w.name}: {describe(c)}")
    return tgt, drafts


def live_bench(build: ServerBuild, target: Path, wirings: list[LiveWiring], prompt_ids: list[list[int]], *,
               steps: int = 3, max_new_tokens: int = 64, repeats: int = 2, rules: Engine,
               progress: bool = True, log_dir: Path | None = None, guard: Mode = Mode.WARN,
               threads: int | None = None, outtype: str = "f32", log=say) -> list[LiveRow]:
    """``helpers.live.bench.live_bench`` on ``llama-server``: every wiring's layout is its GGUF's.
    ``outtype``: the target GGUF's weight type (f32 holds the pair's bf16-rounded weights exactly; f16 and
    bf16 halve what a decode step reads and change which kernels multiply them)."""
    spec = read_target(target)
    num_layers = int(spec.num_layers)
    longest = max((len(p) for p in prompt_ids), default=0)
    ctx = -(-(longest + max_new_tokens + steps + 64) // 256) * 256
    threads = threads or host_threads()
    tgt, drafts = convert_wirings(target, wirings, log, outtype)
    served = [replace(w, served_layout=tuple(drafts[Path(w.draft)].target_layers)) for w in wirings]
    verdicts: dict[Path, dict] = {}

    def launch(draft: Path | None, layout: tuple[int, ...] | None) -> LlamacppEngine:
        if draft is None:
            return LlamacppEngine(build, ServerLaunch(tgt.gguf, None, steps, threads, ctx), log_dir=log_dir)
        c = drafts[Path(draft)]
        try:
            guard_mod.before_llamacpp(engine=rules, draft=draft, target_layers=c.target_layers,
                                      num_layers=num_layers, arch=spec.arch, gguf=c.gguf, how=guard,
                                      target=target,
                                      report=lambda v: verdicts.__setitem__(Path(draft), v))
        except guard_mod.GuardRefused as exc:     # llama-server never starts: nothing served
            raise LlamacppEngineError(f"llama-server not started: {exc}") from None
        return LlamacppEngine(build, ServerLaunch(tgt.gguf, c.gguf, steps, threads, ctx), log_dir=log_dir,
                              guard=verdicts.get(Path(draft)))

    def round_costs(base: LlamacppEngine, spec: LlamacppEngine, every: live.PairedGenerations) -> dict:
        return costs.measure(base, spec, prompt_ids, steps=steps, every=every).to_dict()

    return live.live_bench(launch, "llamacpp", served, prompt_ids, steps=steps, max_new_tokens=max_new_tokens,
                           repeats=repeats, rules=str(rules), progress=progress, costs=round_costs,
                           start_ahead=1)
