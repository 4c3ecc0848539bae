"""Fix A's config copy and fix C's fc reordering: new directories, exact, original untouched."""
from __future__ import annotations

import hashlib
import json

import pytest
from _pairs import tiny_default

from helpers.boundaries import WiringError
from helpers.investigation.evaluate import evaluate_layout
from helpers.investigation.fixes import reorder_fc, with_engine_ids
from helpers.investigation.pair import eval_captures, load_pair
from helpers.model.checkpoint import load_draft
from helpers.rules.conventions import parse_engine


def _digest(folder):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.is_file()}


def test_with_engine_ids_writes_a_copy(tmp_path):
    src = tiny_default() / "draft"
    before = _digest(src)
    out = with_engine_ids(src, tmp_path / "fixA", [-1, 2, 6])
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 2, 6]
    assert _digest(src) == before
    with pytest.raises(ValueError, match="new directory"):
        with_engine_ids(src, src, [0, 1, 2])


def test_with_engine_ids_keeps_both_keys_meaning_one_layout(tmp_path):
    """A draft carrying both keys: SGLang's nested ids and vLLM's top-level boundaries must agree."""
    from helpers.rules.wiring import resolve

    src = tmp_path / "both"
    import shutil
    shutil.copytree(tiny_default() / "draft", src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [3, 7, 10]
    (src / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="pass the layout"):
        with_engine_ids(src, tmp_path / "nolayout", [-1, 2, 6])
    assert not (tmp_path / "nolayout").exists()
    for engine, ids in (("sglang==0.5.9", [1, 3, 4]), ("vllm", [2, 4, 5])):
        out = with_engine_ids(src, tmp_path / engine, ids, parse_engine(engine), layout=(2, 4, 5))
        for reader in ("sglang==0.5.9", "vllm"):
            assert resolve(parse_engine(reader), "LlamaForCausalLM", 6, draft=out).served_layout == (2,
                                                                                                     4, 5), (
                engine, reader)


def test_reorder_fc_is_exact(tmp_path):
    pair = load_pair(tiny_default() / "target", tiny_default() / "draft")
    caps = eval_captures(pair, max_windows=2)
    out = reorder_fc(pair.draft_dir, tmp_path / "reordered", (0, 3, 7), (7, 0, 3))
    moved = load_draft(out, target=pair.target)
    a = evaluate_layout(pair.draft, caps, (0, 3, 7), steps=2)
    b = evaluate_layout(moved, caps, (7, 0, 3), steps=2)
    assert a.full_acc == b.full_acc and a.ce == pytest.approx(b.ce, abs=1e-4)
    assert json.loads((out / "training.json").read_text())["training_boundaries"] == [7, 0, 3]


def test_reorder_fc_rejects_different_sets(tmp_path):
    with pytest.raises(WiringError, match="same distinct boundaries"):
        reorder_fc(tiny_default() / "draft", tmp_path / "x", (0, 3, 7), (0, 3, 8))
    assert not (tmp_path / "x").exists()
