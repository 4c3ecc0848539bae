"""vLLM's side of the live benchmark (``helpers.live.bench``): which plugin fixes each launch asks for.

One baseline engine (the target alone) stays up for the whole run; each wiring gets an engine of
its own (vLLM fixes the draft and its speculative config at start), with the plugin fixes its
layout needs. The accept length and per-position acceptance are vLLM's own counters.
"""
from __future__ import annotations

from pathlib import Path

from ...live import bench as live
from ...live.bench import LiveRow, LiveWiring
from ...live.guard import Mode
from ...rules.conventions import Engine, TargetSpec, read_target
from .engine import LaunchSpec, VllmEngine
from .install import VllmInstall


def fixes_for(target: TargetSpec, layout: tuple[int, ...] | None, install: VllmInstall) -> tuple[str, ...]:
    """The plugin fixes a launch asks for. Each fix still checks, inside the engine, whether this
    release needs it (helpers/engines/vllm/plugin.py) and reports what it did."""
    arch = target.arch or ""
    fixes = []
    if target.mla and install.device == "cpu":
        fixes += ["rope3d", "mla_width"]
    if layout is not None and 0 in layout and arch.startswith("Deepseek"):
        fixes.append("boundary0")
    return tuple(fixes)


def live_bench(install: VllmInstall, target: Path, wirings: list[LiveWiring], prompt_ids: list[list[int]],
               *, steps: int = 3, max_new_tokens: int = 64, repeats: int = 2, rules: Engine | None = None,
               max_model_len: int | None = None, progress: bool = True,
               log_dir: Path | None = None, guard: Mode = Mode.WARN) -> list[LiveRow]:
    """``helpers.live.bench.live_bench`` on vLLM: each engine gets the plugin fixes its layout needs."""
    tspec = read_target(target)
    longest = max((len(p) for p in prompt_ids), default=0)
    max_len = max_model_len or min(int(tspec.config.get("max_position_embeddings") or 2048),
                                   longest + max_new_tokens + steps + 64)

    def launch(draft: Path | None, layout: tuple[int, ...] | None) -> VllmEngine:
        spec = LaunchSpec(target, draft, steps=steps, max_model_len=max_len,
                          fixes=fixes_for(tspec, layout, install), guard=guard, device=install.device)
        return VllmEngine(install, spec, progress=progress, log_dir=log_dir)

    return live.live_bench(launch, "vllm", wirings, prompt_ids, steps=steps, max_new_tokens=max_new_tokens,
                           repeats=repeats, rules=str(rules or install.engine), progress=progress)
