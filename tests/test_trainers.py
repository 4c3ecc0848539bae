"""The trainer's side: which boundaries each trainer's ids captured, read from the releases' own wheels."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers.commands.wiring import main as wiring_main
from helpers.errors import BadOption
from helpers.rules.conventions import IdsAt, parse_engine
from helpers.rules.trainers import (
    POST_NORM,
    capture_after_layer,
    default_ids_from_function,
    default_ids_in,
    parse_trainer,
    trainer_layout,
    training_ids_from_config,
    writers_of,
)
from helpers.rules.wiring import resolve

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


# --------------------------------------------------------------------------------------
# ModelOpt and TorchSpec (docs/conventions.md, "Trainers").


def test_modelopt_hooks_layer_outputs_in_layer_order():
    r = trainer_layout("modelopt", 36, read_source=False)
    assert r.ids == [1, 17, 32] and r.training_layout == (2, 18, 33) and r.written_ids == [1, 17, 32]
    # hooks are registered walking the layers, so the listed order does not matter
    assert trainer_layout("modelopt", 36, [32, 1, 17], read_source=False).training_layout == (2, 18, 33)
    # gpt-oss-120b's long-context head: ids [1, 17, 32] are layer outputs, boundaries 2, 18, 33
    assert trainer_layout("modelopt", 36, [1, 17, 32], read_source=False).label == "(b2, b18, b33)"


def test_modelopt_default_is_evaluated_from_the_release_function(tmp_path: Path):
    f = tmp_path / "hf_eagle.py"
    f.write_text("def default_eagle_aux_layer_ids(num_layers: int) -> list[int]:\n"
                 "    return sorted({1, max(0, num_layers // 2 - 1), max(0, num_layers - 4)})\n")
    assert default_ids_from_function(f, "default_eagle_aux_layer_ids", 61) == (
        [1, 29, 57], 2, "return sorted({1, max(0, num_layers // 2 - 1), max(0, num_layers - 4)})")
    f.write_text("import os\ndef default_eagle_aux_layer_ids(n):\n    return os.listdir('.')\n")
    assert default_ids_from_function(f, "default_eagle_aux_layer_ids", 61) is None   # no builtins, no imports


def test_torchspec_keeps_id_order_and_its_vllm_export_adds_one_for_kimi():
    assert trainer_layout("torchspec", 61, [57, 1, 29]).training_layout == (58, 2, 30)
    r = trainer_layout("torchspec-vllm", 61, [1, 29, 57], model_type="kimi_k2")
    assert r.training_layout == (2, 30, 58) and r.written_ids == [2, 30, 58]
    # the exported ids are vLLM boundaries, and they are the training layout
    served = resolve(parse_engine("vllm==0.33.0"), "DeepseekV3ForCausalLM", 61, ids=r.written_ids)
    assert served.served_layout == r.training_layout
    assert training_ids_from_config("torchspec-vllm", [2, 30, 58], "kimi_k2") == [1, 29, 57]
    # other model types are exported as trained
    assert trainer_layout("torchspec-vllm", 36, [1, 17, 32], model_type="llama").written_ids == [1, 17, 32]
    assert training_ids_from_config("torchspec-vllm", [1, 17, 32], "llama") == [1, 17, 32]


def test_writers_of_a_config_format():
    sglang_fmt = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
                  "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 17, 32]}}
    assert writers_of(sglang_fmt) == ["specforge-hf", "torchspec", "modelopt"]
    assert writers_of(sglang_fmt, "0.5.9") == ["specforge-hf", "specforge-sglang==0.5.9", "torchspec",
                                                "modelopt"]
    mla = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2",
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 30, 58]}}
    assert "torchspec-vllm" in writers_of(mla)
    spec = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3"}
    assert writers_of(spec) == ["speculators==0.4.0"]
    assert writers_of({**spec, "eagle_aux_hidden_state_layer_ids": [2, 18, 33]}) == ["speculators==0.9.0"]
    assert writers_of({"architectures": ["LlamaForCausalLMEagle3"]}) == ["specforge-hf", "torchspec", "eagle",
                                                                         "trtllm"]
