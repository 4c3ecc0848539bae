"""Each engine's acceptance rule above temperature 0, read from the release's own files (rules.acceptance),
and the target's distribution as each engine samples it (evaluate.sampler_probs)."""
from __future__ import annotations

import dataclasses
import tarfile

import pytest
import torch

from helpers.investigation.evaluate import sampler_probs
from helpers.rules import acceptance
from helpers.rules.acceptance import RECORDED, Sampler, Verify, read_llamacpp, rule_for


@pytest.mark.parametrize("release,lines", [
    ("0.32.0", ("rejection_sampler.py:872", "rejection_sampler_utils.py:188")),
    ("0.34.0", ("rejection_sampler_utils.py:201",))])
def test_vllm_rule_is_read_from_each_release(release, lines):
    """vLLM drafts its argmax by default (draft_sample_method "greedy") and each runner's rejection kernel
    takes the draft's probability as 1: target-only. 0.34 has only the V2 runner's kernel, and the rule says
    so."""
    rule, why = rule_for("vllm", release)
    assert why is None and rule.read and rule.verify is Verify.TARGET_ONLY and rule.sampler.off
    assert all(any(line in w for w in rule.where) for line in lines), rule.where
    assert (release == "0.34.0") == (not any("v1/sample/rejection_sampler.py" in w for w in rule.where))
    if release == "0.32.0":   # the recorded rule is this release's, read
        assert dataclasses.replace(rule, read=False) == RECORDED["vllm"]


def test_sglang_rule_depends_on_the_device_and_the_release():
    """SGLang 0.5.23 verifies greedily on a CPU (``_verify_uses_greedy``), target-only elsewhere; 0.5.9 falls
    back to greedy where its tree kernel (CUDA only) is missing."""
    gpu, why = rule_for("sglang", "0.5.23")
    cpu, _ = rule_for("sglang", "0.5.23", "cpu")
    assert why is None and (gpu.verify, cpu.verify) == (Verify.TARGET_ONLY, Verify.GREEDY)
    assert dataclasses.replace(gpu, read=False) == RECORDED["sglang"]
    assert dataclasses.replace(cpu, read=False) == RECORDED["sglang-cpu"]
    old, _ = rule_for("sglang", "0.5.9", "cpu")
    assert old.verify is Verify.GREEDY and old.read
    assert old.where[0].startswith("sglang/srt/speculative/eagle_info.py:310 if is_all_greedy or not "
                                   "TREE_SPEC_KERNEL_AVAILABLE")
    assert "TREE_SPEC_KERNEL_AVAILABLE = _is_cuda" in old.where[1]


def test_llamacpp_rule_read_from_its_sdist_is_the_recorded_one(tmp_path):
    """llama.cpp b11434 drafts greedily and verifies by sampling the target (top-k 40, top-p 0.95, min-p 0.05,
    before the temperature) and matching: read from the pinned sdist, it is the recorded rule."""
    from helpers.engines.llamacpp.build import BUILD, fetch_sdist

    sdist = fetch_sdist(tmp_path)
    texts = {}
    with tarfile.open(sdist) as tf:
        for m in tf.getmembers():
            rel = m.name.split("llama.cpp/", 1)[-1]
            if m.isfile() and rel in acceptance.LLAMACPP_FILES:
                texts[rel] = tf.extractfile(m).read().decode()
    rule = read_llamacpp(texts, BUILD)
    assert rule is not None and rule.verify is Verify.TARGET_ONLY
    assert rule.sampler == Sampler(40, 0.95, 0.05, True)
    assert dataclasses.replace(rule, read=False) == RECORDED["llamacpp"]


def test_an_unreadable_release_falls_back_to_the_recorded_rule_and_says_why():
    rule, why = rule_for("vllm", None)
    assert rule == RECORDED["vllm"] and why == "no release named" and not rule.read
    assert "recorded from its files, not read now" in rule.sentence()
    rule, why = rule_for("llamacpp", "b1")   # no files kept for a build that was never built here
    assert rule == RECORDED["llamacpp"] and why


def test_sampler_probs_follow_each_engine_order():
    """Top-k, top-p and min-p on a known distribution, before the temperature (llama.cpp) or after it."""
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.06, 0.04]]))
    assert torch.allclose(sampler_probs(logits, 1.0, Sampler()), logits.exp())
    k2 = sampler_probs(logits, 1.0, Sampler(top_k=2))
    assert torch.allclose(k2, torch.tensor([[2 / 3, 1 / 3, 0, 0, 0]]))
    p = sampler_probs(logits, 1.0, Sampler(top_p=0.8))          # 0.5 + 0.25 < 0.8: the third is kept too
    assert torch.allclose(p, torch.tensor([[0.5, 0.25, 0.15, 0, 0]]) / 0.9)
    m = sampler_probs(logits, 1.0, Sampler(min_p=0.2))          # keeps p >= 0.1
    assert torch.allclose(m, torch.tensor([[0.5, 0.25, 0.15, 0, 0]]) / 0.9)
    # llama.cpp filters at temperature 1, then tempers what is left; vLLM tempers, then filters
    first = sampler_probs(logits, 2.0, Sampler(top_p=0.7, filters_first=True))
    after = sampler_probs(logits, 2.0, Sampler(top_p=0.7))
    assert int((first > 0).sum()) == 2 and int((after > 0).sum()) == 3
    assert torch.allclose(first.sum(-1), torch.ones(1)) and torch.allclose(after.sum(-1), torch.ones(1))


def test_lmdeploy_rule_is_read_from_its_wheel():
    """LMDeploy 0.18.0's EAGLE-3 proposer drafts its argmax and its agent calls the rejection sampler without
    the draft's probabilities: target-only, with GenerationConfig's top-k 50 as the sampler a request
    keeps."""
    rule, why = rule_for("lmdeploy", "0.18.0")
    assert why is None and rule.read and rule.verify is Verify.TARGET_ONLY and rule.sampler == Sampler(50)
    assert dataclasses.replace(rule, read=False) == RECORDED["lmdeploy"]
    old, why = rule_for("lmdeploy", "0.0.10")      # no such files: the recorded rule, and why
    assert old == RECORDED["lmdeploy"] and why
