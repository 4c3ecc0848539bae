"""SGLang's side of the live benchmark (``helpers.live.bench``): the same rows as vLLM's, on SGLang itself.

Each engine is an ``SGLangEngine`` from ``.venv-sglang``: on a CPU host with the workbook's
accommodations (``helpers.engines.sglang.cpu``), on a CUDA host stock. ``capture_rule`` names a release whose
own ``set_eagle3_layers_to_capture`` the runtime runs instead of its own (the original case's 0.5.9 on a
0.5.23 runtime): the rows then say "runtime 0.5.23, capture rule 0.5.9". The accept length and per-position
acceptance are SGLang's own per-request counters (``spec_verify_ct``, ``spec_num_correct_drafts``,
``spec_correct_drafts_histogram``).
"""
from __future__ import annotations

from pathlib import Path

from ...live import bench as live
from ...live.bench import LiveRow, LiveWiring
from ...live.guard import Mode
from .engine import SGLangEngine, SglangLaunch, rules_label
from .install import SglangInstall


def capture_rule_for(install: SglangInstall, named_version: str | None) -> str | None:
    """The release whose setter the runtime should run: the one the user named, when it is not the
    runtime itself (``--engine sglang==0.5.9`` on a 0.5.23 runtime)."""
    return named_version if named_version and named_version != install.version else None


def live_bench(install: SglangInstall, target: Path, wirings: list[LiveWiring], prompt_ids: list[list[int]],
               *, steps: int = 3, max_new_tokens: int = 64, repeats: int = 2, capture_rule: str | None = None,
               progress: bool = True, log_dir: Path | None = None, guard: Mode = Mode.WARN) -> list[LiveRow]:
    """``helpers.live.bench.live_bench`` on SGLang; every engine runs ``capture_rule``'s setter when named."""
    longest = max((len(p) for p in prompt_ids), default=0)
    context = longest + max_new_tokens + steps + 64

    def launch(draft: Path | None, layout: tuple[int, ...] | None) -> SGLangEngine:
        spec = SglangLaunch(target, draft, steps=steps, context_length=max(context, 256),
                            capture_rule=capture_rule, guard=guard)
        return SGLangEngine(install, spec, progress=progress, log_dir=log_dir)

    # on a CPU host every wiring's engine starts beside the baseline (each is a few hundred MB of host
    # memory, paused until its turn); on a GPU the launches share its memory two at a time (GPU_SHARE)
    ahead = len(wirings) if install.device == "cpu" else 1
    return live.live_bench(launch, "sglang", wirings, prompt_ids, steps=steps, max_new_tokens=max_new_tokens,
                           repeats=repeats, rules=rules_label(install.version, capture_rule),
                           progress=progress, start_ahead=ahead)
