"""Real draft configs as tests (issue 19, item 8): each fixture under tests/heads/drafts/ is a draft
config.json as it is published or vendored: the trainer-shipped ones byte for byte (repo, path, commit),
the ``hf--*`` ones the Hugging Face repos' own config.json with every key and value as published
(tests/heads/manifest.json names the URL, the HF repo and how complete the copy is), checked against its
target's public config (trimmed to the keys the workbook reads, as the manifest says). No weights:
``check`` reads the config only.

``tests/heads/expected.json`` holds, per case and release, the exit status, the served layout, the
blocking problem kinds, the served layout per release group and the candidates; the hand-written tests
below pin the cases whose answer follows from a rule docs/conventions.md states.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers.investigation.gate import check
from helpers.rules.conventions import parse_engine

HEADS = Path(__file__).resolve().parent / "heads"
MANIFEST = json.loads((HEADS / "manifest.json").read_text())
EXPECTED = json.loads((HEADS / "expected.json").read_text())
CASES = [(d, eng) for d in MANIFEST["drafts"] for eng in EXPECTED[d]]


def _run(tmp: Path, draft: str, engine: str):
    folder = tmp / draft
    folder.mkdir(exist_ok=True)
    shutil.copy(HEADS / "drafts" / f"{draft}.json", folder / "config.json")
    target = HEADS / "targets" / f"{MANIFEST['drafts'][draft]['target']}.json"
    return check(folder, parse_engine(engine), target_config=target)


def test_every_fixture_names_its_source_and_is_checked():
    drafts = {p.stem for p in (HEADS / "drafts").glob("*.json")}
    assert drafts == set(MANIFEST["drafts"]) == set(EXPECTED) and len(drafts) >= 15
    for name, entry in MANIFEST["drafts"].items():
        src = entry["source"]
        assert ("commit" in src and len(src["commit"]) == 40) or src.get("url", "").startswith("https://")
        assert entry["target"] in MANIFEST["targets"]
        assert (HEADS / "targets" / f"{entry['target']}.json").is_file()
    families = {MANIFEST["drafts"][d]["target"].split("-")[0] for d in drafts}
    assert {"Kimi", "gpt", "Llama", "Qwen3", "DeepSeek"} <= families


@pytest.mark.parametrize("draft, engine", CASES, ids=[f"{d}@{e}" for d, e in CASES])
def test_published_head(tmp_path, draft, engine):
    want = EXPECTED[draft][engine]
    r = _run(tmp_path, draft, engine)
    assert r.exit_code == want["exit"]
    assert list(r.served_layout) == want["served"]
    assert sorted({p.kind for p in r.problems if p.blocking}) == want["kinds"]
    assert [[x["first"], x["last"], x["served_layout"]] for x in r.served_across_releases] == want["groups"]
    assert [[c["trainer"], c["training_layout"], c["served_agrees"]] for c in r.candidates] == want["cands"]
    # none of these configs carries a training record: only a config that names the trainer which wrote it
    # (speculators' speculators_version, with a rule that writes ids) settles the training layout, on the
    # evidence the engine guard reads too; a draft's own num_hidden_layers (1) is never the target's depth
    if r.evidence == "config":
        assert r.training_layout and "named by the config (speculators_version" in r.training_source
        assert not r.verdict.startswith("UNKNOWN")
    else:
        # the format's writers give a prior at most (``evidence.Basis.FORMAT``), never a training layout
        # a release that feeds the draft nothing cannot serve it whatever it was trained on: BLOCKED
        assert r.evidence in ("none", "format") and r.training_layout is None
        assert r.verdict.startswith("BLOCKED" if r.cannot_serve else "UNKNOWN")
        assert (r.answer.prior is not None) == (r.evidence == "format")
    target = json.loads((HEADS / "targets" / f"{MANIFEST['drafts'][draft]['target']}.json").read_text())
    assert r.num_layers == (target.get("text_config") or target)["num_hidden_layers"] > 1


def test_a_config_that_names_its_trainer_is_judged_on_that_trainers_rule(tmp_path):
    """speculators 0.8 writes speculators_version and its ids (layer outputs, the verifier's state appended
    and dropped): check and the guard settle the training layout from that rule, (2, 46, 91, 93) on this
    94-layer Qwen3-MoE; SGLang serves three of them, so it is a mismatch there, not an unknown."""
    r = _run(tmp_path, "speculators-issue-1065--qwen3moe-4ids", "sglang==0.5.23")
    assert r.evidence == "config" and r.training_layout == (2, 46, 91, 93)
    assert "layout-mismatch" in {p.kind for p in r.problems} and r.verdict.startswith("MISMATCH")


def test_no_ids_specforge_config_lists_specforge_and_torchspec(tmp_path):
    """SpecForge ships configs/*.json without ids and trains on [1, N//2-1, N-4] (layer outputs), i.e.
    boundaries (2, N//2, N-3): SGLang's default for Llama, so every candidate agrees on 0.5.9."""
    r = _run(tmp_path, "specforge--llama3-8B-eagle3", "sglang==0.5.9")
    assert r.num_layers == 32 and r.served_layout == (2, 16, 29)
    assert [c["trainer"] for c in r.candidates] == ["specforge-hf", "specforge-sglang==0.5.9", "torchspec",
                                                     "eagle", "trtllm"]
    assert all(c["training_layout"] == [2, 16, 29] and c["served_agrees"] for c in r.candidates)


def test_kimi_mla_head_drifts_and_names_torchspec_vllm(tmp_path):
    """TorchSpec's Kimi-K2.5 MLA draft (ids [1, 29, 57], model_type kimi_k2): SGLang 0.5.9 has neither the
    wrapper's setter nor the MLA draft class; the +1 DeepSeek rule serves (2, 30, 58) from 0.5.10."""
    r = _run(tmp_path, "torchspec--kimi_k25_eagle3_mla", "sglang==0.5.9")
    assert {"engine-cannot-capture", "draft-class"} <= {p.kind for p in r.problems}
    assert r.served_across_releases[-1]["first"] == "0.5.10"
    assert r.served_across_releases[-1]["served_layout"] == [2, 30, 58]
    tv = next(c for c in r.candidates if c["trainer"] == "torchspec-vllm")
    assert tv["training_layout"] == [1, 29, 57] and tv["served_agrees"] is False


def test_speculators_four_ids_head_on_vllm(tmp_path):
    """speculators issue #1065: four top-level ids on a 94-layer Qwen3-MoE verifier; vLLM 0.33.0 serves
    all four as boundaries, and the release the config names (0.8.0.dev0, boundary numbering) trained on
    the same: the config's own trainer settles it, as it does for the engine guard."""
    r = _run(tmp_path, "speculators-issue-1065--qwen3moe-4ids", "vllm==0.33.0")
    assert r.served_layout == (2, 46, 91, 93)
    assert r.evidence == "config" and r.training_layout == (2, 46, 91, 93) and r.agree


def test_aq_medai_kimi_k25_head_drifts_across_sglang_releases(tmp_path):
    """AQ-MedAI/Kimi-K25-eagle3 (eagle_config ids [2, 30, 58], 61-layer Kimi-K2.5): SGLang 0.5.9 has no
    setter on the wrapper, 0.5.10-0.5.12 serve the DeepSeek +1 rule (3, 31, 59), 0.5.13 on serve the ids
    as boundaries (SGLang PR #25454). With nothing captured on 0.5.9, no candidate agrees there."""
    old = _run(tmp_path, "hf--AQ-MedAI--Kimi-K25-eagle3", "sglang==0.5.9")
    assert "engine-cannot-capture" in {p.kind for p in old.problems if p.blocking}
    assert old.candidates and not any(c["served_agrees"] for c in old.candidates)
    assert all("captures nothing" in c["note"] for c in old.candidates)
    new = _run(tmp_path, "hf--AQ-MedAI--Kimi-K25-eagle3", "sglang==0.5.23")
    assert new.served_layout == (2, 30, 58)
    assert [(x["first"], x["served_layout"]) for x in new.served_across_releases][-2:] == [
        ("0.5.10", [3, 31, 59]), ("0.5.13", [2, 30, 58])]
    got = {c["trainer"]: (c["training_layout"], c["served_agrees"]) for c in new.candidates}
    assert got == {"specforge-hf": ([3, 31, 59], False), "specforge-sglang==0.5.23": ([2, 30, 58], True),
                   "torchspec": ([3, 31, 59], False), "modelopt": ([3, 31, 59], False)}


def test_converted_speculators_head_names_the_converter_and_its_source(tmp_path):
    """nm-testing/EAGLE3-LLaMA3.1-Instruct-8B-converted was written by speculators 0.1.0.dev14, a release
    that only converts: the weights came from the EAGLE reference code, whose boundaries are fixed at
    (2, N//2, N-3), so the default vLLM serves agrees; the converter itself gives no layout."""
    r = _run(tmp_path, "hf--nm-testing--EAGLE3-LLaMA3.1-Instruct-8B-converted", "vllm==0.33.0")
    assert [(c["trainer"], c["training_layout"], c["served_agrees"]) for c in r.candidates] == [
        ("speculators==0.1.0.dev14", None, None), ("eagle", [2, 16, 29], True)]
