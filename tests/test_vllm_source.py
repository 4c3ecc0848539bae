"""Checking vLLM's recorded rule against a release's own files (a synthetic release here; no 370 MB wheel)."""
from __future__ import annotations

from pathlib import Path

from helpers.engines.vllm import source as vllm_source
from helpers.engines.vllm.source import disagreements, expected_capture, read_facts
from helpers.rules import wiring
from helpers.rules.conventions import parse_engine

IDS = "eagle_aux_hidden_state_layer_ids"


def _release(root: Path, *, top: bool, nested: bool, capture: str) -> Path:
    worker = root / "vllm" / "v1" / "worker"
    models = root / "vllm" / "model_executor" / "models"
    worker.mkdir(parents=True)
    models.mkdir(parents=True)
    runner = ["def _get_eagle3_aux_layers_from_config(hf_config):"]
    if top:
        runner.append(f'    layer_ids = getattr(hf_config, "{IDS}", None)')
    if nested:
        runner.append(f'    layer_ids = eagle_config.get("{IDS}")')
    (worker / "gpu_model_runner.py").write_text("\n".join(runner) + "\n")
    (models / "registry.py").write_text('_MODELS = {\n'
                                        '    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),\n'
                                        '    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),\n}\n')
    loop = {"before": "        if idx in self.aux_hidden_state_layers:\n            aux.append(h + r)\n",
            "after": "        self._maybe_add_hidden_state(aux, idx + 1, h, r)\n"}[capture]
    (models / "llama.py").write_text("class LlamaModel:\n    def forward(self):\n"
                                     "        for idx, layer in enumerate(self.layers):\n" + loop)
    (models / "qwen3.py").write_text("from .llama import LlamaModel\n\n"
                                     "class Qwen3Model(LlamaModel):\n    pass\n")
    return root


def test_facts_and_agreement(tmp_path):
    release = _release(tmp_path / "a", top=True, nested=True, capture="after")
    new = read_facts(release, "0.22.0", "LlamaForCausalLM")
    assert [r["line"] for r in new.reads_top_level] == [2] and [r["line"] for r in new.reads_nested] == [3]
    assert new.capture == "after" and new.model_file == "vllm/model_executor/models/llama.py"
    assert disagreements(new) == []
    # Qwen3 runs the loop of the model it imports
    assert read_facts(tmp_path / "a", "0.22.0", "Qwen3ForCausalLM").capture == "after"
    old = read_facts(_release(tmp_path / "b", top=False, nested=False, capture="before"), "0.10.2",
                     "LlamaForCausalLM")
    assert disagreements(old) == [] and expected_capture("0.10.2", "LlamaForCausalLM") == "before"


def test_a_release_that_contradicts_the_rule_is_named(tmp_path):
    release = _release(tmp_path, top=True, nested=False, capture="before")
    facts = read_facts(release, "0.22.0", "LlamaForCausalLM")
    found = disagreements(facts)
    assert len(found) == 2 and "eagle_config's ids" in found[0] and "'after'" in found[1]


def test_wiring_cites_the_source(tmp_path, monkeypatch):
    root = _release(tmp_path, top=True, nested=True, capture="after")
    monkeypatch.setattr(vllm_source, "release_files", lambda version, whole=False: root)
    r = wiring.resolve(parse_engine("vllm==0.22.0"), "LlamaForCausalLM", 12, ids=[2, 6, 12],
                       read_vllm_source=True)
    assert r.served_layout == (2, 6, 12) and any("the rule holds" in w for w in r.warnings)
    assert {s["file"] for s in r.source_lines} >= {"vllm/v1/worker/gpu_model_runner.py",
                                                  "vllm/model_executor/models/llama.py"}
