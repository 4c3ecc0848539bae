"""The build command and the artifacts it writes, in the formats real drafts use."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from _pairs import tiny_default, tiny_llama


def test_tiny_default_artifacts():
    d = tiny_default()
    for rel in ["target/config.json", "target/model.safetensors", "target/tokenizer.json",
                "draft/config.json", "draft/model.safetensors", "draft/training.json", "prompts.jsonl",
                "heldout.txt", "corpus.json", "build.json"]:
        assert (d / rel).is_file(), rel
    cfg = json.loads((d / "draft/config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 6, 9]
    assert "eagle_aux_hidden_state_layer_ids" not in cfg
    rec = json.loads((d / "draft/training.json").read_text())
    assert rec["training_boundaries"] == [0, 3, 7] and rec["captured_boundaries"] == [0, 3, 7, 12]
    hist = rec["log"]["history"]
    assert hist and all(len(h["full_acc"]) == rec["ttt_steps"] == len(h["cond_acc"]) for h in hist)
    corpus = json.loads((d / "corpus.json").read_text())
    assert corpus["python"] and corpus["train_files"] > 0 and corpus["heldout_files"] > 0


def test_target_loads_with_auto_classes():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d = tiny_default() / "target"
    model = AutoModelForCausalLM.from_pretrained(d)
    tok = AutoTokenizer.from_pretrained(d)
    assert type(model).__name__ == "DeepseekV3ForCausalLM" and model.config.num_hidden_layers == 12
    assert model.config.first_k_dense_replace == 1 and model.config.n_shared_experts == 1
    ids = tok("def add(a, b):\n    return a + b")["input_ids"]
    assert tok.decode(ids) == "def add(a, b):\n    return a + b"


def test_draft_weights_are_sglang_layout():
    from safetensors.torch import load_file

    w = load_file(str(tiny_default() / "draft/model.safetensors"))
    h = json.loads((tiny_default() / "target/config.json").read_text())["hidden_size"]
    assert w["fc.weight"].shape == (h, 3 * h)
    assert any(k.startswith("midlayer.self_attn.q_proj") for k in w)
    assert w["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * h
    assert w["d2t"].dtype == torch.int64 and w["t2d"].dtype == torch.bool
    assert int(w["t2d"].sum()) == w["lm_head.weight"].shape[0] == w["d2t"].numel()


def test_samples_follow_standardize_data_v1():
    from helpers.factory.draft_training import generate_samples, standardize_data_v1
    from helpers.model.target import load_target

    target, tok = load_target(tiny_default() / "target")
    stream = torch.tensor(tok((tiny_default() / "heldout.txt").read_text()[:20000])["input_ids"])
    data = generate_samples(target, stream, 3, 32, (0, 3, 7, 12), regen_fraction=0.34, seed=0, batch=2)
    s = data.sample(0)
    assert set(s) == {"input_ids", "loss_mask", "hidden_states"} and len(s["hidden_states"]) == 4
    std = standardize_data_v1(s)
    h = target.config.hidden_size
    assert std["hidden_states"].shape == (32, 3 * h) and std["verifier_last_hidden_states"].shape == (32, h)
    assert torch.equal(std["hidden_states"][:, :h], s["hidden_states"][0])


def test_second_family_speculators_format():
    d = tiny_llama()
    cfg = json.loads((d / "draft/config.json").read_text())
    assert cfg["architectures"] == ["Eagle3Speculator"] and cfg["speculators_model_type"] == "eagle3"
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5] and "eagle_config" not in cfg
    from safetensors.torch import load_file

    assert any(k.startswith("layers.0.") for k in load_file(str(d / "draft/model.safetensors")))
    tcfg = json.loads((d / "target/config.json").read_text())
    assert tcfg["architectures"] == ["LlamaForCausalLM"] and tcfg["num_hidden_layers"] == 8


def test_target_training_is_deterministic():
    from transformers import AutoModelForCausalLM

    from helpers.factory.target_training import train_target
    from helpers.model.target import target_config

    ids = torch.arange(4000) % 97
    losses = []
    for _ in range(2):
        torch.manual_seed(3)
        m = AutoModelForCausalLM.from_config(target_config("deepseek_v3", 128, 2, hidden=32))
        rep = train_target(m, ids, ids, steps=4, batch=2, seq=32, seed=3)
        losses.append([c[1] for c in rep.curve] + [rep.val_loss])
    assert losses[0] == losses[1]


@pytest.mark.parametrize("args,msg", [
    (["--layers", "2"], "at least 4"),
    (["--training-boundaries", "0,3,20"], "outside 0..12"),
    (["--training-boundaries", "a,b"], "cannot read a layout"),
    (["--training-boundaries", ""], "three distinct boundaries"),
    (["--training-boundaries", "0,3,7,9"], "three distinct boundaries"),
    (["--training-boundaries", "3,3,7"], "three distinct boundaries"),
])
def test_build_rejects_bad_input(tmp_path, capsys, args, msg):
    from helpers.commands.build import main

    out = tmp_path / "out"
    try:
        rc = main(["--out", str(out), "--tiny", *args])
    except SystemExit as exc:
        rc = exc.code
    assert rc == 2
    assert msg in capsys.readouterr().err
    assert not out.exists()


def test_a_draft_is_not_taken_for_a_target():
    from helpers.model.target import load_target

    draft = Path(__file__).resolve().parent.parent / "data" / "tiny-kimi" / "draft"
    with pytest.raises(ValueError, match="holds an EAGLE-3 draft"):
        load_target(draft)
