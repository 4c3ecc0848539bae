"""Real draft configs as tests (issue 19, item 8): each fixture under tests/heads/drafts/ is a draft
config.json copied byte for byte from where it is published or vendored (tests/heads/manifest.json names
the repo, path and commit, or the URL), checked against its target's public config (trimmed to the keys
the workbook reads, as the manifest says). No weights: ``check`` reads the config only.

``tests/heads/expected.json`` holds, per case and release, the exit status, the served layout, the
blocking problem kinds, the served layout per release group and the candidates; the hand-written tests
below pin the cases whose answer follows from a rule docs/conventions.md states.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers.check import check

HEADS = Path(__file__).resolve().parent / "heads"
MANIFEST = json.loads((HEADS / "manifest.json").read_text())
EXPECTED = json.loads((HEADS / "expected.json").read_text())
CASES = [(d, eng) for d in MANIFEST["drafts"] for eng in EXPECTED[d]]


def _run(tmp: Path, draft: str, engine: str):
    folder = tmp / draft
    folder.mkdir(exist_ok=True)
    shutil.copy(HEADS / "drafts" / f"{draft}.json", folder / "config.json")
    target = HEADS / "targets" / f"{MANIFEST['drafts'][draft]['target']}.json"
    return check(folder, engine, target_config=target)


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
    # none of these configs carries a training record, and a draft's own num_hidden_layers (1) is never
    # read as the target's depth
    assert r.training_layout is None and r.verdict.startswith("UNKNOWN")
    target = json.loads((HEADS / "targets" / f"{MANIFEST['drafts'][draft]['target']}.json").read_text())
    assert r.num_layers == (target.get("text_config") or target)["num_hidden_layers"] > 1


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
    all four as boundaries, and speculators>=0.5 (boundary numbering) trained on the same."""
    r = _run(tmp_path, "speculators-issue-1065--qwen3moe-4ids", "vllm==0.33.0")
    assert r.served_layout == (2, 46, 91, 93)
    assert r.candidates == [{"trainer": "speculators==0.9.0", "training_layout": [2, 46, 91, 93],
                             "served_agrees": True, "note": r.candidates[0]["note"]}]
