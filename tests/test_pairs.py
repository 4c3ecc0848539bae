"""The test pairs: committed ones are used only while the build code is the code that built them, and
the build itself still runs end to end in every session (on a micro scale, in seconds)."""
from __future__ import annotations

import dataclasses
import json
import shutil

import _architecture
import _pairs
import pytest


def _fingerprint_of(monkeypatch, tmp_path, edit=None) -> str:
    """The build fingerprint of a copy of helpers/, after ``edit(copy_root)``."""
    repo = tmp_path / "repo"
    shutil.copytree(_architecture.HELPERS, repo / "helpers")
    if edit:
        edit(repo)
    monkeypatch.setattr(_architecture, "REPO", repo)
    monkeypatch.setattr(_architecture, "HELPERS", repo / "helpers")
    _pairs.build_fingerprint.cache_clear()
    try:
        return _pairs.build_fingerprint()
    finally:
        _pairs.build_fingerprint.cache_clear()


def test_the_fingerprint_follows_the_build_code_not_its_comments(monkeypatch, tmp_path):
    now = _fingerprint_of(monkeypatch, tmp_path / "a")

    def comment(repo):
        f = repo / "helpers/model/checkpoint.py"      # imported by the builders at any depth
        f.write_text(f.read_text().replace("\n\n\n", "\n\n\n# a comment changes no pair\n", 1))

    def code(repo):
        f = repo / "helpers/model/checkpoint.py"
        f.write_text(f.read_text() + "\nSOMETHING_NEW = 1\n")

    def elsewhere(repo):
        f = repo / "helpers/commands/bench.py"          # a command the builders never import
        f.write_text(f.read_text() + "\nSOMETHING_NEW = 1\n")

    assert _fingerprint_of(monkeypatch, tmp_path / "b", comment) == now
    assert _fingerprint_of(monkeypatch, tmp_path / "c", elsewhere) == now
    assert _fingerprint_of(monkeypatch, tmp_path / "d", code) != now


def test_committed_pairs_are_copied_only_while_current(monkeypatch, tmp_path):
    committed, root = tmp_path / "committed", tmp_path / "root"
    (committed / "tiny-x").mkdir(parents=True)
    (committed / "tiny-x" / "build.json").write_text("{}")
    root.mkdir()
    monkeypatch.setattr(_pairs, "COMMITTED", committed)
    monkeypatch.setattr(_pairs, "build_fingerprint", lambda: "current")
    for stamp, used in (("stale", False), ("current", True)):
        (committed / "fingerprint.txt").write_text(stamp + "\n")
        _pairs._committed_current.cache_clear()
        if used:
            assert _pairs.ready(root / "tiny-x", "build.json")
        else:
            with pytest.warns(UserWarning, match="built by other build code"):
                assert not _pairs.ready(root / "tiny-x", "build.json")
        assert (root / "tiny-x" / "build.json").exists() == used
    _pairs._committed_current.cache_clear()
    # the copy is the session's own: changing it leaves the committed pair as it was
    (root / "tiny-x" / "build.json").write_text('{"changed": 1}')
    assert (committed / "tiny-x" / "build.json").read_text() == "{}"
    # a copied pair is stamped like a build of this code: refreshing keeps it beside a newly built one
    (root / "draft-new").mkdir()
    _pairs.built(root / "draft-new")
    assert _pairs.commit(root) == ["draft-new", "tiny-x"]
    assert (committed / "fingerprint.txt").read_text().strip() == "current"


def test_the_build_runs_end_to_end_on_a_micro_scale(monkeypatch, tmp_path):
    """The committed pairs spare the suite the tiny build's minutes; the build code still runs whole here:
    corpus, tokenizer, target, a draft in SGLang's format, the build record."""
    from helpers.factory import embedded_pair

    micro = dataclasses.replace(embedded_pair.TINY, corpus_chars=40_000, vocab=300, hidden=32, target_steps=3,
                                target_batch=2, draft_vocab=64, train_samples=4, val_samples=2, seq_len=32,
                                draft_steps=3, prompts=2)
    monkeypatch.setattr(embedded_pair, "TINY", micro)
    out = tmp_path / "pair"
    summary = embedded_pair.build_default(out, layers=6, training_boundaries=(0, 2, 4), seed=0, tiny=True,
                                          log=lambda *_: None)
    assert summary["scale"] == "tiny" and summary["layers"] == 6
    for rel in ("target/config.json", "target/model.safetensors", "target/tokenizer.json",
                "draft/config.json", "draft/model.safetensors", "draft/training.json", "prompts.jsonl",
                "heldout.txt", "build.json"):
        assert (out / rel).is_file(), rel
    cfg = json.loads((out / "draft/config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == summary["deployed_eagle_ids"]
    rec = json.loads((out / "draft/training.json").read_text())
    assert rec["training_boundaries"] == [0, 2, 4] and rec["captured_boundaries"] == [0, 2, 4, 6]
    assert json.loads((out / "build.json").read_text())["sizes_bytes"]["draft/model.safetensors"] > 0
