"""Baseline vs EAGLE-3 on the real vLLM engine, on the same prompts, beside the reference engine.

One baseline engine (the target alone) stays up for the whole run; each wiring gets an engine of
its own (vLLM fixes the draft and its speculative config at start). Requests alternate between the
two, a warm-up pass first, so drift in the machine's speed hits both alike; the figures are
medians over repeats. The accept length and per-position acceptance are vLLM's own counters. Each
row carries the layout the release serves as ``wiring`` predicts it, and, where the caller ran it,
the reference engine's figures for that layout on the same prompts and steps: the prediction is
checked by measurement, and a gap is reported, never smoothed over.
"""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from ..conventions import Engine, read_target_config
from .engine import Generation, LaunchSpec, VllmEngine
from .install import VllmInstall

MLA_KEYS = ("kv_lora_rank", "qk_rope_head_dim")


def fixes_for(target_config: dict, layout: tuple[int, ...] | None, install: VllmInstall) -> tuple[str, ...]:
    """The plugin fixes a launch asks for. Each fix still checks, inside the engine, whether this
    release needs it (helpers/vllm/plugin.py) and reports what it did."""
    mla = all(target_config.get(k) is not None for k in MLA_KEYS)
    arch = (target_config.get("architectures") or [""])[0]
    fixes = []
    if mla and install.device == "cpu":
        fixes += ["rope3d", "mla_width"]
    if layout is not None and 0 in layout and arch.startswith("Deepseek"):
        fixes.append("boundary0")
    return tuple(fixes)


@dataclass
class LiveRow:
    """One wiring measured on the real engine."""

    wiring: str
    backend: str                     # the engine that ran, e.g. 'vllm==0.32.0'
    rules: str                       # whose rules predicted the served layout, e.g. 'vllm==0.32.0:v1'
    draft: str
    served_layout: list[int]         # as wiring/check predict it for this release
    steps: int
    prompts: int
    max_new_tokens: int
    repeats: int
    baseline_tok_s: float
    spec_tok_s: float
    accept_length: float             # vLLM's counters: 1 + accepted / drafts
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

    @property
    def speedup(self) -> float:
        return self.spec_tok_s / self.baseline_tok_s if self.baseline_tok_s else 0.0

    @property
    def tau_gap(self) -> float | None:
        """vLLM's accept length minus the reference engine's for the predicted layout."""
        return None if not self.reference else round(self.accept_length - self.reference["tau"], 3)

    def to_dict(self) -> dict:
        return asdict(self) | {"speedup": round(self.speedup, 3), "tau_gap": self.tau_gap}

    def row(self) -> dict:
        ref = self.reference or {}
        return {"wiring": self.wiring, "backend": self.backend, "layout": self.served_layout,
                "baseline_tok_s": self.baseline_tok_s, "spec_tok_s": self.spec_tok_s,
                "speedup": round(self.speedup, 3), "accept_length": round(self.accept_length, 3),
                "per_position": [round(x, 3) for x in self.accepted_per_position],
                "lossless": self.lossless, "ref_tau": ref.get("tau"), "ref_speedup": ref.get("speedup"),
                "tau_gap": self.tau_gap}


@dataclass
class LiveWiring:
    """A wiring to measure: the draft folder vLLM loads and the layout the release is predicted to serve."""

    name: str
    draft: Path
    served_layout: tuple[int, ...]


def _tok_s(gen: Generation) -> float:
    return sum(len(t) for t in gen.tokens) / sum(gen.seconds)


def live_bench(install: VllmInstall, target: Path, wirings: list[LiveWiring], prompt_ids: list[list[int]],
               *, steps: int = 3, max_new_tokens: int = 64, repeats: int = 2, rules: Engine | None = None,
               max_model_len: int | None = None, progress: bool = True,
               log_dir: Path | None = None) -> list[LiveRow]:
    """Each wiring against one shared baseline engine; engines are stopped however this returns."""
    if not wirings:
        raise ValueError("no wirings to benchmark")
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1 (a warm-up pass runs before them), got {repeats}")
    tcfg = read_target_config(target)
    longest = max(len(p) for p in prompt_ids)
    max_len = max_model_len or min(int(tcfg.get("max_position_embeddings") or 2048),
                                   longest + max_new_tokens + steps + 64)
    rules = rules or install.engine
    base_fixes = fixes_for(tcfg, None, install)
    rows = []
    with VllmEngine(install, LaunchSpec(target, max_model_len=max_len, fixes=base_fixes),
                    progress=progress, log_dir=log_dir) as base:
        base_ref = base.generate(prompt_ids, max_new_tokens)          # warm-up, and the reference output
        for w in wirings:
            fixes = fixes_for(tcfg, w.served_layout, install)
            with VllmEngine(install, LaunchSpec(target, w.draft, steps=steps, max_model_len=max_len,
                                                fixes=fixes), progress=progress, log_dir=log_dir) as spec:
                spec.generate(prompt_ids[:1], max_new_tokens)            # warm-up
                b_runs, s_runs, gens = [], [], []
                bar = tqdm(total=repeats, desc=f"vLLM {w.name}", disable=not progress)
                for _ in range(repeats):
                    b_runs.append(_tok_s(base.generate(prompt_ids, max_new_tokens)))
                    gens.append(spec.generate(prompt_ids, max_new_tokens))
                    s_runs.append(_tok_s(gens[-1]))
                    bar.update(1)
                bar.close()
                drafts = sum(g.drafts for g in gens)
                accepted = sum(g.accepted_tokens for g in gens)
                drafted = sum(g.draft_tokens for g in gens)
                width = max((len(g.accepted_per_position) for g in gens), default=0)
                per_pos = [sum(g.accepted_per_position[i] for g in gens if i < len(g.accepted_per_position))
                           / drafts if drafts else 0.0 for i in range(width)]
                same = [a == b for a, b in zip(gens[-1].tokens, base_ref.tokens)]
                rows.append(LiveRow(
                    wiring=w.name, backend=str(Engine("vllm", spec.version)), rules=str(rules),
                    draft=str(w.draft), served_layout=list(w.served_layout), steps=steps,
                    prompts=len(prompt_ids), max_new_tokens=max_new_tokens, repeats=repeats,
                    baseline_tok_s=round(statistics.median(b_runs), 2),
                    spec_tok_s=round(statistics.median(s_runs), 2),
                    accept_length=round(1 + accepted / drafts, 3) if drafts else 1.0,
                    accept_rate=round(accepted / drafted, 3) if drafted else 0.0,
                    accepted_per_position=[round(x, 3) for x in per_pos], drafts=drafts,
                    lossless=all(same), lossless_per_prompt=same,
                    baseline_runs=[round(x, 2) for x in b_runs], spec_runs=[round(x, 2) for x in s_runs],
                    fixes=spec.fixes_report(), start_seconds=spec.start_seconds))
    return rows
