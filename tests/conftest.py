"""Shared fixtures: tiny random Hugging Face causal LMs built from a fixed seed."""
from __future__ import annotations

import math
import os
import time

import pytest
import torch

import helpers  # noqa: F401  (older WORKBOOK_ variables read under the one prefix: helpers/environment.py)
from helpers.cores import size_torch_threads

# Waits on subprocesses, servers and browsers are wall-clock budgets, and a busy machine (CI on a
# developer's box, the suite run beside another) stretches them all alike. .ci/run sets this factor
# from the load it finds (os.getloadavg over the cores); a quiet machine runs at 1.
TIMEOUT_FACTOR_ENV = "EAGLE3_WORKBOOK_TEST_TIMEOUT_FACTOR"


def timeout_factor() -> float:
    try:
        value = float(os.environ.get(TIMEOUT_FACTOR_ENV, "1") or 1)
    except ValueError:
        value = 1.0
    return value if math.isfinite(value) and value >= 1 else 1.0


def scaled(seconds: float) -> float:
    """A test's wall-clock budget on this machine: ``seconds`` on a quiet one, longer under load."""
    return seconds * timeout_factor()

# Torch's threads follow the cores free now (helpers/cores.py): a second job on one of 2 cores otherwise
# makes torch's two threads wait on each other at every operator, five to six times slower. Asked again
# before a test at most every RESIZE_S seconds (a 0.1 s look at /proc/stat).
RESIZE_S = 20.0
_sized_at = [-math.inf]


@pytest.fixture(autouse=True)
def _torch_threads_on_free_cores():
    now = time.monotonic()
    if now - _sized_at[0] >= RESIZE_S:
        size_torch_threads(window_s=0.1)
        _sized_at[0] = now
    yield


TINY_ARCHS = ("llama", "qwen2", "qwen3", "deepseek_v3")


def tiny_lm_config(arch: str, hidden: int = 32, layers: int = 3, vocab: int = 128):
    """A config of the asked family small enough to build and run in well under a second."""
    from transformers import DeepseekV3Config, LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers,
                  max_position_embeddings=64, tie_word_embeddings=False, rms_norm_eps=1e-6)
    if arch == "llama":
        return LlamaConfig(**common, intermediate_size=2 * hidden, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=hidden // 4)
    if arch == "qwen2":
        return Qwen2Config(**common, intermediate_size=2 * hidden, num_attention_heads=4,
                           num_key_value_heads=2)
    if arch == "qwen3":
        return Qwen3Config(**common, intermediate_size=2 * hidden, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=hidden // 4)
    if arch == "deepseek_v3":
        # MLA (no q LoRA) + MoE with a shared expert; layer 0 dense, the rest MoE.
        return DeepseekV3Config(**common, intermediate_size=2 * hidden, moe_intermediate_size=hidden // 2,
                                num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
                                n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                                first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=16,
                                qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8)
    raise ValueError(f"unknown tiny arch {arch!r}; expected one of {TINY_ARCHS}")


def build_tiny_lm(arch: str = "llama", seed: int = 0, **kw):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_lm_config(arch, **kw)).eval()


@pytest.fixture(scope="session")
def make_tiny_lm():
    """``make_tiny_lm(arch='llama', seed=0, hidden=32, layers=3, vocab=128)`` -> model in eval mode."""
    return build_tiny_lm


IN_CI = os.environ.get("CI") == "true"


def unavailable(reason: str) -> None:
    """An engine, build or release a test needs is missing: skipped on a developer's machine, a failure in
    CI (``CI=true``), where ``workbook.sh`` must have set every engine up."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: every engine must be set up)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def sglang_install():
    """The SGLang venv the live SGLang tests drive; its absence fails them (EAGLE3_WORKBOOK_SGLANG=0 skips
    them)."""
    from helpers.engines.sglang.install import EngineUnavailable, find_sglang

    try:
        return find_sglang()
    except EngineUnavailable as exc:
        pytest.fail(f"{exc} (EAGLE3_WORKBOOK_SGLANG=0 skips these tests)")
