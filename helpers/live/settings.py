"""The engine settings of one launch, flag by flag, and a speed ratio's two launches side by side.

A speed ratio compares a launch with a draft against one without. It measures speculation only if the two
share every other setting: the scheduler (SGLang's overlap schedule), threads, attention backend, CUDA
graphs, context and memory limits. Each live engine reports its own launch as a flat mapping
(``settings()``); ``side_by_side`` lines the two up and names every setting that differs besides
speculation itself and the per-process port.
"""
from __future__ import annotations

from dataclasses import dataclass

# environment variables that set an engine's threads or memory: settings as much as any flag
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_KVCACHE_SPACE")
# On a GPU the two sides of a paired benchmark are up together (the baseline engine stays loaded while each
# speculative one starts and runs): each gets this share of the device's memory, explicitly and the same on
# both sides. vLLM's default (gpu_memory_utilization 0.92, config/cache.py) would leave the second engine
# short of its startup check (v1/worker/utils.py request_memory); SGLang's --mem-fraction-static likewise.
# Two shares leave the rest (0.2) for CUDA contexts, graphs and activations.
GPU_SHARE = 0.4
# the settings that carry that budget, by engine (what the dry run checks every CUDA launch has)
GPU_BUDGET_KEYS = {"vllm": "gpu_memory_utilization", "sglang": "--mem-fraction-static"}
# What each engine resolved at start (beside what it was asked for): the configuration both sides of a ratio
# are held to share, read back from the running engine. SGLang's /server_info carries its resolved server
# args; vLLM's worker reads its engine's VllmConfig (helpers/engines/vllm/worker.py). Capacities that follow
# from the weights loaded (KV blocks, a draft's share) are left out: they differ by what speculation is.
SGLANG_RESOLVED = ("mem_fraction_static", "max_running_requests", "chunked_prefill_size", "context_length",
                   "dtype", "kv_cache_dtype", "attention_backend", "disable_overlap_schedule",
                   "disable_cuda_graph", "cuda_graph_max_bs", "tp_size", "page_size", "device")
RESOLVED_PREFIX = "resolved."


def resolved_settings(values: dict, keys=None) -> dict[str, str]:
    """``resolved.<key>`` -> the value as text, for ``keys`` (default: every key given) that are present."""
    keys = list(values) if keys is None else keys
    return {f"{RESOLVED_PREFIX}{k}": str(values[k]) for k in keys if k in values}


# what is allowed to differ: speculation itself (SGLang's --speculative-*, vLLM's speculative_config,
# llama.cpp's --model-draft and --spec-*), and where each process listens
PER_LAUNCH = ("--speculative", "speculative_config", "--model-draft", "--spec-", "--port")


def argv_settings(argv: list[str], env: dict[str, str] | None = None) -> dict[str, str]:
    """``--flag value [value ...]`` (or a bare ``--flag``: "true") from a command line, after the program
    and module, plus ``env``'s entries."""
    out: dict[str, str] = {}
    key = None
    for tok in argv:
        if tok.startswith("--"):
            key = tok
            out[key] = "true"
        elif key is not None:
            out[key] = tok if out[key] == "true" else f"{out[key]} {tok}"
    return out | dict(env or {})


def flat_settings(kwargs: dict, env: dict[str, str] | None = None, prefix: str = "") -> dict[str, str]:
    """An engine's constructor arguments (nested mappings flattened to dotted keys), plus ``env``'s."""
    out: dict[str, str] = {}
    for k, v in kwargs.items():
        if isinstance(v, dict):
            out |= flat_settings(v, None, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = str(v)
    return out | dict(env or {})


@dataclass(frozen=True)
class SideBySide:
    """Both launches' settings, and those that differ besides speculation."""

    rows: tuple[tuple[str, str | None, str | None], ...]   # (setting, baseline, speculative)
    differ: tuple[str, ...]

    @property
    def equal(self) -> bool:
        return not self.differ

    def to_dict(self) -> dict:
        return {"equal": self.equal, "differ": list(self.differ),
                "rows": [{"setting": k, "baseline": b, "speculative": s} for k, b, s in self.rows]}


def side_by_side(baseline: dict[str, str], speculative: dict[str, str]) -> SideBySide:
    rows = tuple((k, baseline.get(k), speculative.get(k)) for k in sorted(set(baseline) | set(speculative)))
    differ = tuple(k for k, b, s in rows if b != s and not k.startswith(PER_LAUNCH))
    return SideBySide(rows, differ)
