"""The trainer's side: which boundaries each trainer's ids captured, read from the releases' own wheels."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers.conventions import IdsAt
from helpers.errors import BadOption
from helpers.trainers import (
    POST_NORM,
    capture_after_layer,
    default_ids_in,
    parse_trainer,
    trainer_layout,
)
from helpers.wiring_cli import main as wiring_main

N = 61   # Kimi-K2.5's depth


def test_speculators_0_4_captures_layer_outputs_read_from_its_wheel():
    r = trainer_layout("speculators==0.4.0", N)
    assert r.ids == [2, 30, 58, 60] and r.ids_source == IdsAt.NONE
    assert r.captured == [3, 31, 59, 61] and r.training_layout == (3, 31, 59)
    assert r.writes_ids == IdsAt.NONE and r.written_ids is None
    files = {s["file"] for s in r.source_lines}
    assert "speculators/data_generation/custom_worker.py" in files       # the append after the layer call
    assert "speculators/data_generation/vllm_hidden_states_generator.py" in files
    assert "wheel" in r.read_from and not r.errors


def test_speculators_0_5_uses_vllm_boundaries_and_keeps_n_as_verifier():
    r = trainer_layout("speculators==0.9.0", N)
    assert r.ids == [2, 30, 58, 61] and r.training_layout == (2, 30, 58)
    assert r.writes_ids == IdsAt.TOP_LEVEL and r.written_ids == [2, 30, 58]
    given = trainer_layout("speculators==0.9.0", 94, [2, 46, 91, 93])   # speculators issue #1065's 4 ids
    assert given.training_layout == (2, 46, 91, 93) and given.captured[-1] == 94


def test_specforge_hf_and_sglang_backends():
    hf = trainer_layout("specforge-hf", N)
    assert hf.ids == [1, 29, 57] and hf.training_layout == (2, 30, 58) and hf.writes_ids == IdsAt.EAGLE_CONFIG
    assert hf.source_lines and hf.source_lines[0]["file"] == "specforge/algorithms/model_providers.py"
    # through SGLang's own setter: 0.5.9 adds one; 0.5.23 DeepSeek adds one only when the first id is 1
    old = trainer_layout("specforge-sglang==0.5.9", 12, [2, 6, 9], arch="DeepseekV3ForCausalLM")
    new = trainer_layout("specforge-sglang==0.5.23", 12, [2, 6, 9], arch="DeepseekV3ForCausalLM")
    assert old.training_layout == (3, 7, 10) and new.training_layout == (2, 6, 9)


def test_eagle_reference_and_trtllm():
    assert trainer_layout("eagle", N).training_layout == (2, 30, 58)
    with pytest.raises(BadOption, match="hard-coded"):
        trainer_layout("eagle", N, [1, 2, 3])
    t = trainer_layout("trtllm", N)
    assert t.training_layout == (2, 30, 58)
    post = trainer_layout("trtllm", N, [1, 29, 57, -1])
    assert post.captured[-1] == POST_NORM and post.training_layout is None and post.errors


@pytest.mark.parametrize("spec, message", [
    ("axolotl", "unknown trainer"),
    ("speculators", "name the release"),
    ("specforge-sglang", "SGLang release it ran on"),
    ("speculators==0.2.0", "no hidden-state generation"),
])
def test_bad_trainer_specs(spec, message):
    with pytest.raises(BadOption, match=message):
        trainer_layout(spec, N)


def test_ids_out_of_range_are_refused():
    with pytest.raises(ValueError, match="layer outputs"):
        trainer_layout("specforge-hf", 12, [1, 5, 12])
    with pytest.raises(ValueError, match="boundaries 0..12"):
        trainer_layout("speculators==0.9.0", 12, [2, 6, 13])


def test_source_readers_on_synthetic_files(tmp_path: Path):
    src = tmp_path / "gen.py"
    src.write_text("def f(num_layers):\n    return [3, num_layers // 2 + 1, num_layers - 2]\n")
    assert default_ids_in(src, 40) == ([3, 21, 38], 2, "return [3, num_layers // 2 + 1, num_layers - 2]")
    loop = tmp_path / "worker.py"
    loop.write_text("for i, layer in enumerate(layers):\n    aux_hidden_states.append(h + r)\n"
                    "    h, r = layer(h, r)\n")
    assert capture_after_layer(loop)[0] == "before"
    assert parse_trainer("SpecForge-HF") == ("specforge-hf", None)


def test_cli_trainer(capsys):
    assert wiring_main(["--trainer", "speculators==0.4.0", "--layers", "12"]) == 0
    out = capsys.readouterr().out
    assert "trained fc on   : (3, 7, 10)" in out and "custom_worker.py" in out
    assert wiring_main(["--trainer", "trtllm", "--layers", "12", "--train-ids", "1,5,8,-1", "--json"]) == 1
    assert wiring_main(["--train-ids", "1,2", "--layers", "12", "--arch", "X"]) == 2
