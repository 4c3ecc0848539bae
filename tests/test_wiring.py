"""The resolver runs each SGLang version's own set_eagle3_layers_to_capture; expectations here
were derived by reading that source (cited in the comments) for a 12-layer target."""
from __future__ import annotations

import json
import shutil
import textwrap

import pandas as pd
import pytest

from helpers.boundaries import CapturePlan, WiringError
from helpers.commands import wiring as wiring_cli
from helpers.engines.sglang import patch as patch_sglang
from helpers.engines.sglang import source as ss
from helpers.engines.sglang.inspect import inspect_model
from helpers.engines.sglang.stub import exec_capture_site
from helpers.errors import BadOption
from helpers.rules import wiring
from helpers.rules.conventions import DraftConfigError, Engine, parse_engine

L = 12
ARCHS = ("LlamaForCausalLM", "DeepseekV3ForCausalLM")


def _pristine(version, tmp_path_factory) -> ss.SglangSource:
    """The cached tree, or a reverted private copy if someone patched the shared cache."""
    try:
        src = ss.fetch_sglang(version)
    except ss.IndexUnreachableError as exc:
        pytest.skip(f"PyPI unreachable, cannot fetch sglang {version}: {exc}")
    if patch_sglang.patch_status(version, root=src.root).state not in ("patched", "partial"):
        return src
    copy = tmp_path_factory.mktemp(f"sglang-{version}")
    shutil.copytree(src.root, copy, dirs_exist_ok=True)
    patch_sglang.revert_patch(version, root=copy)
    return ss.source_at(copy, version)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return {v: _pristine(v, tmp_path_factory) for v in ("0.5.9", "0.5.23")}


def _resolve(src, version, arch, ids=None, draft=None):
    return wiring.resolve(parse_engine(f"sglang=={version}"), arch, L, ids=ids, draft=draft,
                          source=src[version])


# --------------------------------------------------------------------------------------
# The must-show table: 2 versions x 2 archs x 4 id lists.
# 0.5.9 llama.py / deepseek_v2.py: `layers_to_capture = [val + 1 for val in layer_ids]`;
# 0.5.23 llama.py: the same; 0.5.23 deepseek_v2.py: `+1` only `if layer_ids and layer_ids[0] == 1`,
# else `list(layer_ids)`. No ids: `[2, num_layers // 2, num_layers - 3]` everywhere.
# Capture: 0.5.9 evaluates `hidden_states + residual` in the loop (residual None before layer 0);
# 0.5.23 passes a collector to the layer, whose boundary code handles the missing residual.
# The loop is `range(start_layer, end_layer)` = 0..11, so an index of -1 is never visited.

EXPECTED = {
    # (version, arch, ids): (layers_to_capture, served_layout, error substring or None)
    ("0.5.9", "LlamaForCausalLM", (2, 6, 9)): ([3, 7, 10], (3, 7, 10), None),
    ("0.5.9", "LlamaForCausalLM", (1, 5, 8)): ([2, 6, 9], (2, 6, 9), None),
    ("0.5.9", "LlamaForCausalLM", (-1, 2, 6)): ([0, 3, 7], (0, 3, 7), "residual` is None"),
    ("0.5.9", "LlamaForCausalLM", None): ([2, 6, 9], (2, 6, 9), None),
    ("0.5.9", "DeepseekV3ForCausalLM", (2, 6, 9)): ([3, 7, 10], (3, 7, 10), None),
    ("0.5.9", "DeepseekV3ForCausalLM", (1, 5, 8)): ([2, 6, 9], (2, 6, 9), None),
    ("0.5.9", "DeepseekV3ForCausalLM", (-1, 2, 6)): ([0, 3, 7], (0, 3, 7), "residual` is None"),
    ("0.5.9", "DeepseekV3ForCausalLM", None): ([2, 6, 9], (2, 6, 9), None),
    ("0.5.23", "LlamaForCausalLM", (2, 6, 9)): ([3, 7, 10], (3, 7, 10), None),
    ("0.5.23", "LlamaForCausalLM", (1, 5, 8)): ([2, 6, 9], (2, 6, 9), None),
    ("0.5.23", "LlamaForCausalLM", (-1, 2, 6)): ([0, 3, 7], (0, 3, 7), None),
    ("0.5.23", "LlamaForCausalLM", None): ([2, 6, 9], (2, 6, 9), None),
    ("0.5.23", "DeepseekV3ForCausalLM", (2, 6, 9)): ([2, 6, 9], (2, 6, 9), None),
    ("0.5.23", "DeepseekV3ForCausalLM", (1, 5, 8)): ([2, 6, 9], (2, 6, 9), None),
    ("0.5.23", "DeepseekV3ForCausalLM", (-1, 2, 6)): ([-1, 2, 6], (2, 6), "capture index -1"),
    ("0.5.23", "DeepseekV3ForCausalLM", None): ([2, 6, 9], (2, 6, 9), None),
}


@pytest.mark.parametrize("version, arch, ids", list(EXPECTED))
def test_must_show_table(src, version, arch, ids):
    ltc, served, error = EXPECTED[(version, arch, ids)]
    r = _resolve(src, version, arch, ids=list(ids) if ids is not None else None)
    assert r.layers_to_capture == ltc
    assert r.served_layout == served
    assert r.ids_source == ("explicit" if ids is not None else "none")
    if error is None:
        assert r.errors == [] and r.capturable
    else:
        assert any(error in e for e in r.errors), r.errors
        assert not r.capturable
    # every cited line is really that line of that version's file
    for line in r.source_lines:
        text = src[version].path(line["file"]).read_text(encoding="utf-8").splitlines()[line["line"] - 1]
        assert text.strip() == line["text"]


def test_executed_setter_lines_show_the_0523_deepseek_rule(src):
    plus_one = _resolve(src, "0.5.23", "DeepseekV3ForCausalLM", ids=[1, 5, 8])
    as_is = _resolve(src, "0.5.23", "DeepseekV3ForCausalLM", ids=[2, 6, 9])
    texts = lambda r: [s["text"] for s in r.source_lines]  # noqa: E731
    assert "if layer_ids and layer_ids[0] == 1:" in texts(plus_one)
    assert "self.model.layers_to_capture = [val + 1 for val in layer_ids]" in texts(plus_one)
    assert "self.model.layers_to_capture = list(layer_ids)" in texts(as_is)
    assert "self.model.layers_to_capture = [val + 1 for val in layer_ids]" not in texts(as_is)


def test_0523_deepseek_missing_capture_names_the_packer(src):
    r = _resolve(src, "0.5.23", "DeepseekV3ForCausalLM", ids=[-1, 2, 6])
    assert any("captured 2 of 3" in e for e in r.errors)


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
def test_final_boundary_is_never_captured(src, version):
    r = _resolve(src, version, "LlamaForCausalLM", ids=[2, 6, 11])  # +1 -> capture index 12 = L
    assert r.layers_to_capture == [3, 7, 12]
    assert r.served_layout == (3, 7)
    assert any("boundary 12" in e and "never" in e for e in r.errors)


def test_gpt_oss_0523_captures_the_final_boundary(src):
    # gpt_oss.py 0.5.23: ids as-is when max(ids) == num_layers, and a capture after the loop
    # `if self.end_layer in self.layers_to_capture`
    r = _resolve(src, "0.5.23", "GptOssForCausalLM", ids=[2, 6, 12])
    assert r.layers_to_capture == [2, 6, 12] and r.served_layout == (2, 6, 12) and r.errors == []
    assert _resolve(src, "0.5.23", "GptOssForCausalLM", ids=[1, 5, 8]).served_layout == (2, 6, 9)


def test_source_version_must_match_engine(src):
    with pytest.raises(WiringError, match="source given is sglang 0.5.9"):
        wiring.resolve(parse_engine("sglang==0.5.23"), "LlamaForCausalLM", L, source=src["0.5.9"])


def test_qwen_059_already_guards_the_residual(src):
    for arch in ("Qwen2ForCausalLM", "Qwen3ForCausalLM"):
        r = _resolve(src, "0.5.9", arch, ids=[-1, 2, 6])
        assert r.served_layout == (0, 3, 7) and r.errors == []


# --------------------------------------------------------------------------------------
# The inspector.


@pytest.mark.parametrize("arch", ARCHS)
def test_inspector_059_flags_residual_none(src, arch):
    w = inspect_model(arch, source=src["0.5.9"])
    c = w.capture
    assert c.style == "inline-add" and c.boundary0_hazard and not w.boundary0_capturable
    lines = src["0.5.9"].path(c.file).read_text().splitlines()
    assert "hidden_states + residual" in lines[c.unguarded_add.line - 1]
    assert lines[c.residual_none.line - 1].strip() == "residual = None"
    assert lines[c.first_rank.line - 1].strip() == "if self.pp_group.is_first_rank:"
    assert "in self.layers_to_capture" in lines[c.line - 1]
    assert lines[c.loop_line - 1].strip().startswith("for i in range(")
    assert w.setters[0].last_rank_only


def test_inspector_deepseek_loop_and_tbo_note(src):
    c = inspect_model("DeepseekV3ForCausalLM", source=src["0.5.9"]).capture
    assert c.loop_range == ("normal_start_layer", "normal_end_layer")
    assert any("two-batch overlap" in n for n in c.notes)
    assert c.file == "sglang/srt/models/deepseek_v2.py"


@pytest.mark.parametrize("arch", ARCHS + ("Qwen2ForCausalLM", "Qwen3ForCausalLM"))
def test_inspector_0523_delegates_capture(src, arch):
    w = inspect_model(arch, source=src["0.5.23"])
    assert w.capture.style == "delegated" and w.boundary0_capturable
    assert any(h.file.endswith("layer_boundary/stage.py") and "residual is None" in h.text
               for h in w.capture.handler)


def test_inspector_follows_kimi_wrapper(src):
    w = inspect_model("KimiK25ForConditionalGeneration", source=src["0.5.23"])
    assert w.chain == ["KimiK25ForConditionalGeneration", "language_model:DeepseekV3ForCausalLM"]
    assert [s.cls for s in w.setters] == ["KimiK25ForConditionalGeneration", "DeepseekV2ForCausalLM"]
    assert w.owner == "DeepseekV2Model"
    r = _resolve(src, "0.5.23", "KimiK25ForConditionalGeneration", ids=[1, 5, 8])
    assert r.served_layout == (2, 6, 9) and r.errors == []


def test_kimi_059_has_no_setter(src):
    r = _resolve(src, "0.5.9", "KimiK25ForConditionalGeneration", ids=[2, 6, 9])
    assert any("defines no set_eagle3_layers_to_capture" in e for e in r.errors)


def test_capture_statement_raises_at_boundary0_in_059(src):
    c = inspect_model("DeepseekV3ForCausalLM", source=src["0.5.9"]).capture
    assert exec_capture_site(c, 3, 1.0, 2.0, [3]) == [3.0]
    with pytest.raises(TypeError):
        exec_capture_site(c, 0, 1.0, None, [0])


# --------------------------------------------------------------------------------------
# Capture styles beyond Llama/DeepSeek, read from the real wheels (L = 48 as in Qwen3-30B-A3B).
# 0.5.9 qwen2_moe.py: the setter does `setattr(self.layers[k], "_is_layer_to_capture", True)`,
# the loop passes `captured_last_layer_outputs=aux_hidden_states if getattr(layer, ...)`, and the
# layer calls LayerCommunicator.prepare_attn_and_capture_last_layer_outputs (layers/communicator.py),
# which runs prepare_attn (`if residual is None: residual = hidden_states`, else the fused add) and
# then appends that residual: boundary k, the embedding at k = 0, in layer order.
# 0.5.23 qwen2_moe.py: same flag, collector handed to `attn_boundary.prepare(capture_gathered=...)`.

LM = 48


def _resolve48(src, version, arch, ids):
    return wiring.resolve(parse_engine(f"sglang=={version}"), arch, LM, ids=ids, source=src[version])


def _cited_lines_are_real(src, version, r):
    for line in r.source_lines:
        text = src[version].path(line["file"]).read_text(encoding="utf-8").splitlines()[line["line"] - 1]
        assert text.strip() == line["text"]


@pytest.mark.parametrize("version", ["0.5.9", "0.5.23"])
@pytest.mark.parametrize("arch", ["Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM", "Qwen3NextForCausalLM"])
def test_qwen_moe_flag_capture_is_resolved(src, version, arch):
    # the audit's command:
    # `wiring --engine sglang==0.5.9 --arch Qwen3MoeForCausalLM --layers 48 --ids 1,23,44`
    r = _resolve48(src, version, arch, [1, 23, 44])
    assert (r.layers_to_capture, r.served_layout, r.errors) == ([2, 24, 45], (2, 24, 45), [])
    # boundary 0 works without a patch: the communicator / layer boundary starts the residual
    r0 = _resolve48(src, version, arch, [-1, 23, 44])
    assert (r0.served_layout, r0.errors) == ((0, 24, 45), [])
    _cited_lines_are_real(src, version, r0)
    c = inspect_model(arch, source=src[version]).capture
    assert (c.style, c.flag) == ("delegated", "_is_layer_to_capture")
    # Qwen2MoeModel.forward runs the capture loop only when `forward_batch.can_run_tbo` is false
    assert any("two-batch overlap" in n for n in c.notes) == (arch != "Qwen3NextForCausalLM")


def test_qwen_moe_059_handler_is_the_communicator(src):
    c = inspect_model("Qwen3MoeForCausalLM", source=src["0.5.9"]).capture
    assert c.layer_call.file == "sglang/srt/models/qwen3_moe.py"  # the arch's own decoder layer
    assert "captured_last_layer_outputs=captured_last_layer_outputs" in c.layer_call.text
    handler = {h.text for h in c.handler if h.file == "sglang/srt/layers/communicator.py"}
    assert "captured_last_layer_outputs.append(gathered_last_layer_output)" in handler
    assert "if residual is None:" in handler
    assert any("prepare_attn" in n and "embedding" in n for n in c.notes)


def test_qwen_moe_capture_order_is_layer_order(src):
    r = _resolve48(src, "0.5.9", "Qwen3MoeForCausalLM", [44, -1, 23])
    assert r.layers_to_capture == [45, 0, 24] and r.served_layout == (0, 24, 45) and r.errors == []


def test_qwen_moe_index_past_the_last_layer_fails_at_load(src):
    # id 47 -> capture index 48: `setattr(self.layers[48], ...)` raises IndexError in SGLang too
    r = _resolve48(src, "0.5.9", "Qwen2MoeForCausalLM", [1, 23, 47])
    assert r.served_layout == () and len(r.errors) == 1
    assert "IndexError" in r.errors[0] and "capture index 48 (from id 47)" in r.errors[0]


def test_flag_on_a_negative_index_is_python_indexing(tmp_path):
    """A setter that flags `self.layers[k]` as given makes k = -1 the last layer, not the embedding."""
    models, layers = tmp_path / "sglang/srt/models", tmp_path / "sglang/srt/layers"
    models.mkdir(parents=True)
    layers.mkdir(parents=True)
    (layers / "communicator.py").write_text(textwrap.dedent('''
        class Comm:
            def start(self, hidden_states, residual):
                if residual is None:
                    residual = hidden_states
                return hidden_states, residual

            def start_and_keep(self, hidden_states, residual, sink=None):
                hidden_states, residual = self.start(hidden_states, residual)
                if sink is not None:
                    sink.append(residual)
                return hidden_states, residual
    '''))
    (models / "toy.py").write_text(textwrap.dedent('''
        from sglang.srt.layers.communicator import Comm

        class ToyLayer:
            def forward(self, hidden_states, residual, sink=None):
                return self.comm.start_and_keep(hidden_states, residual, sink=sink)

        class ToyModel:
            def set_eagle3_layers_to_capture(self, ids):
                self.layers_to_capture = ids
                for k in ids:
                    setattr(self.layers[k], "_is_layer_to_capture", True)

            def forward(self, x):
                residual, aux = None, []
                for i in range(self.start_layer, self.end_layer):
                    layer = self.layers[i]
                    x, residual = layer(x, residual,
                                        sink=aux if getattr(layer, "_is_layer_to_capture", False) else None)
                return x, aux

        class ToyForCausalLM:
            def __init__(self, config):
                self.model = ToyModel()

            def set_eagle3_layers_to_capture(self, layer_ids=None):
                self.model.set_eagle3_layers_to_capture(list(layer_ids))

        EntryClass = ToyForCausalLM
    '''))
    toy = ss.source_at(tmp_path, "9.9.9")
    c = inspect_model("ToyForCausalLM", source=toy).capture
    assert (c.style, c.flag) == ("delegated", "_is_layer_to_capture") and c.handler
    r = wiring.resolve(parse_engine("sglang==9.9.9"), "ToyForCausalLM", L, ids=[-1, 3, 7], source=toy)
    assert r.layers_to_capture == [-1, 3, 7] and r.served_layout == (3, 7, 11)
    assert any("self.layers[-1], which Python reads as layer 11" in e for e in r.errors), r.errors


def test_gemma3_0523_captures_branches_not_boundaries(src):
    # gemma3_causal.py 0.5.23: `if i in self.layers_to_capture: aux_hidden_states.append(hidden_states)`
    # while the loop does `hidden_states, residual = layer(...)`: past layer 0 that is the MLP branch
    c = inspect_model("Gemma3ForCausalLM", source=src["0.5.23"]).capture
    assert (c.style == "inline-hidden-only"
            and c.split_residual.text.startswith("hidden_states, residual = layer("))
    r = _resolve48(src, "0.5.23", "Gemma3ForCausalLM", [-1, 23, 44])
    assert r.served_layout == (0, 24, 45)
    assert any("capture indices [24, 45] are not boundaries" in e for e in r.errors), r.errors
    assert _resolve48(src, "0.5.23", "Gemma3ForCausalLM", [-1]).errors == []  # the embedding alone is fine
    _cited_lines_are_real(src, "0.5.23", r)


def test_super_forward_is_followed(src):
    # teleflm.py: TeleFLMModel.forward scales the embedding and returns super().forward(...)
    w = inspect_model("TeleFLMForCausalLM", source=src["0.5.9"])
    assert w.capture.cls == "LlamaModel" and w.capture.style == "inline-add"
    r = _resolve48(src, "0.5.9", "TeleFLMForCausalLM", [-1, 23, 44])
    assert any("--arch TeleFLMForCausalLM" in e for e in r.errors), r.errors


@pytest.mark.parametrize("arch", ["Qwen3VLForConditionalGeneration", "Qwen3_5ForCausalLM",
                                  "MiniMaxM3SparseForCausalLM", "MellumForCausalLM",
                                  "Gemma4ForConditionalGeneration"])
def test_0523_builders_and_wrappers_resolve(src, arch):
    # the inner model comes from an __init__ default (language_model_cls=), a class attribute
    # (body_cls = qwen3_5.Qwen3_5ForCausalLM), or the setter reads config.text_config (gemma4_mm)
    r = _resolve48(src, "0.5.23", arch, [-1, 23, 44])
    assert (r.served_layout, r.errors) == ((0, 24, 45), []), r.errors
    assert not any("recognise" in w for w in r.warnings)


@pytest.mark.parametrize("version, arch", [("0.5.9", "LlamaForCausalLMEagle3"),
                                           ("0.5.23", "DeepseekV3ForCausalLMNextN")])
def test_draft_heads_say_they_are_not_targets(src, version, arch):
    r = _resolve48(src, version, arch, [1, 23, 44])
    assert r.served_layout == () and len(r.errors) == 1
    assert "never captures" in r.errors[0] and "draft/MTP head" in r.errors[0]


@pytest.mark.parametrize("version, arch", [("0.5.9", "MixtralForCausalLM"),
                                           ("0.5.23", "MindSporeForCausalLM")])
def test_no_setter_or_no_owner_is_one_error(src, version, arch):
    r = _resolve48(src, version, arch, [1, 23, 44])
    assert r.served_layout == () and r.layers_to_capture == []
    assert len(r.errors) == 1 and r.warnings == [], (r.errors, r.warnings)


# --------------------------------------------------------------------------------------
# Draft configs.


def test_top_level_ids_are_ignored_by_sglang(src):
    cfg = {"eagle_aux_hidden_state_layer_ids": [-1, 2, 6]}
    for version in ("0.5.9", "0.5.23"):
        r = _resolve(src, version, "DeepseekV3ForCausalLM", draft=cfg)
        assert r.ids_source == "none" and r.ids_used is None
        assert r.served_layout == (2, 6, 9)
        assert any("ignores them" in w for w in r.warnings)
        assert any("eagle_config" in s["text"] for s in r.source_lines
                   if "model_executor" in s["file"])


def test_nested_ids_from_a_draft_folder(src, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(
        {"architectures": ["LlamaForCausalLMEagle3"],
         "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 6, 9]}}))
    r = _resolve(src, "0.5.9", "DeepseekV3ForCausalLM", draft=tmp_path)
    assert (r.ids_source, r.ids_used, r.served_layout) == ("eagle_config", [2, 6, 9], (3, 7, 10))


def test_config_order_does_not_matter(src):
    r = _resolve(src, "0.5.9", "LlamaForCausalLM", ids=[6, 2, 9])
    assert r.layers_to_capture == [7, 3, 10] and r.served_layout == (3, 7, 10)


def test_use_aux_hidden_state_false_is_an_error(src):
    r = _resolve(src, "0.5.9", "LlamaForCausalLM", draft={"eagle_config": {"use_aux_hidden_state": False}})
    assert r.errors and not r.capturable


def test_speculators_draft_and_norm_flag_are_flagged_for_sglang(src):
    """Neither shows up as an error in SGLang: the checkpoint's names are skipped, the flag ignored."""
    cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
           "eagle_aux_hidden_state_layer_ids": [0, 3, 7], "norm_before_residual": True}
    r = _resolve(src, "0.5.9", "LlamaForCausalLM", draft=cfg)
    text = " ".join(r.warnings)
    assert "registers no such architecture" in text and "midlayer" in text
    assert "norm_before_residual" in text and "ignores them" in text
    plain = _resolve(src, "0.5.9", "LlamaForCausalLM",
                     draft={"architectures": ["LlamaForCausalLMEagle3"],
                            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 6, 9]}})
    assert not any("speculators" in w or "norm_before" in w for w in plain.warnings)


def test_vllm_rule():
    both = {"eagle_aux_hidden_state_layer_ids": [7, 0, 3],
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 2, 3]}}
    top = wiring.resolve(parse_engine("vllm==0.33.0"), "LlamaForCausalLM", L, draft=both)
    assert (top.ids_source, top.served_layout, top.errors) == ("top-level", (0, 3, 7), [])
    nested = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 6, 12]}}
    # the V1 runner reads eagle_config's ids from 0.22.0;
    # Llama moved to the V2 runner (which never does) in 0.23.0
    v1 = wiring.resolve(parse_engine("vllm==0.22.0"), "LlamaForCausalLM", L, draft=nested)
    assert (v1.ids_source, v1.served_layout, v1.errors) == ("eagle_config", (2, 6, 12), [])
    v2 = wiring.resolve(parse_engine("vllm==0.23.0"), "LlamaForCausalLM", L, draft=nested)
    assert ((v2.ids_source, v2.served_layout) == ("none", (2, 6, 9))
            and any("ignores" in w for w in v2.warnings))
    # before 0.11.1 no release reads draft ids at all
    old = wiring.resolve(parse_engine("vllm==0.10.2"), "LlamaForCausalLM", L, draft=both)
    assert (old.ids_source, old.served_layout) == ("none", (2, 6, 9))
    # boundary N: before-layer capture cannot reach it (Llama until 0.18.0, DeepSeek until 0.25.0)
    assert wiring.resolve(parse_engine("vllm==0.17.1"), "LlamaForCausalLM", L, ids=[2, 6, 12]).errors
    assert not wiring.resolve(parse_engine("vllm==0.18.0"), "LlamaForCausalLM", L, ids=[2, 6, 12]).errors
    assert wiring.resolve(parse_engine("vllm==0.24.0"), "DeepseekV3ForCausalLM", L, ids=[2, 6, 12]).errors
    # id 0 still fails
    assert wiring.resolve(parse_engine("vllm==0.25.0"), "DeepseekV3ForCausalLM", L, ids=[0, 6, 12]).errors
    # no EAGLE-3 at all
    assert wiring.resolve(parse_engine("vllm==0.33.0"), "Glm4MoeForCausalLM", L).errors
    default = wiring.resolve(parse_engine("vllm"), "LlamaForCausalLM", L)
    assert (default.ids_source, default.served_layout) == ("none", (2, 6, 9))
    assert wiring.resolve(parse_engine("vllm"), "X", L, ids=[-1, 2, 6]).errors
    with pytest.raises(BadOption, match="first appears in 0.8.5"):    # refused where it is named
        parse_engine("vllm==0.8.4")
    with pytest.raises(WiringError, match="first appears in 0.8.5"):  # and by the rule, typed past the edge
        wiring.resolve(Engine("vllm", "0.8.4"), "LlamaForCausalLM", L)


# --------------------------------------------------------------------------------------
# Bad input.


def test_bad_input_raises_clear_errors(src, tmp_path):
    with pytest.raises(WiringError, match="did you mean DeepseekV3ForCausalLM"):
        _resolve(src, "0.5.9", "DeepseekV3ForCausalLm", ids=[2, 6, 9])
    with pytest.raises(WiringError, match="layer id 40 is outside -1..12"):
        _resolve(src, "0.5.9", "LlamaForCausalLM", ids=[2, 6, 40])
    with pytest.raises(DraftConfigError, match="not found"):
        _resolve(src, "0.5.9", "LlamaForCausalLM", draft=tmp_path / "missing")
    with pytest.raises(DraftConfigError, match="no config.json"):
        _resolve(src, "0.5.9", "LlamaForCausalLM", draft=tmp_path)
    with pytest.raises(WiringError, match="num_layers"):
        wiring.resolve(parse_engine("vllm"), "LlamaForCausalLM", 0, ids=[1])
    with pytest.raises(ValueError, match="unknown engine"):
        wiring.resolve(parse_engine("tgi==1.0"), "LlamaForCausalLM", L)


# --------------------------------------------------------------------------------------
# Conveniences.


def test_served_plan(src):
    cfg = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [-1, 2, 6]}}
    plan = wiring.served_plan(cfg, L, "DeepseekV3ForCausalLM", engine=parse_engine("sglang==0.5.9"),
                              root=src["0.5.9"].root)
    assert isinstance(plan, CapturePlan) and plan.layout == (0, 3, 7)
    assert "layers_to_capture [0, 3, 7]" in plan.source
    assert any(e.startswith("boundary 0") for e in plan.errors) and plan.notes == ()
    with pytest.raises(WiringError):
        wiring.served_plan(cfg, L, "DeepseekV3ForCausalLM", engine=parse_engine("sglang==0.5.9"),
                           root=src["0.5.9"].root,
                           strict=True)
    ok = wiring.served_plan([1, 5, 8], L, "DeepseekV3ForCausalLM", engine=parse_engine("sglang==0.5.23"),
                            root=src["0.5.23"].root)
    assert ok.layout == (2, 6, 9) and ok.errors == () and ok.warnings == ()


def test_conventions_table(src, monkeypatch):
    monkeypatch.setattr(wiring, "source_for", lambda version, root: src[version])
    df = wiring.conventions_table([2, 6, 9], L)
    assert isinstance(df, pd.DataFrame) and len(df) == 6
    served = {(r.engine, r.arch): r.served_layout for r in df.itertuples()}
    assert served[("sglang==0.5.9", "DeepseekV3ForCausalLM")] == (3, 7, 10)
    assert served[("sglang==0.5.23", "DeepseekV3ForCausalLM")] == (2, 6, 9)
    assert served[("sglang==0.5.23", "LlamaForCausalLM")] == (3, 7, 10)
    assert served[("vllm", "LlamaForCausalLM")] == (2, 6, 9)


def test_ids_for_layout(src, monkeypatch):
    monkeypatch.setattr(wiring, "source_for", lambda version, root: src[version])
    assert wiring.ids_for_layout((0, 3, 7), "DeepseekV3ForCausalLM", L,
                                 parse_engine("sglang==0.5.23")) == [0, 3, 7]
    assert wiring.ids_for_layout((0, 3, 7), "LlamaForCausalLM", L,
                                 parse_engine("sglang==0.5.23")) == [-1, 2, 6]
    assert wiring.ids_for_layout((0, 3, 7), "LlamaForCausalLM", L,
                                 parse_engine("sglang==0.5.9")) is None  # unpatched


# --------------------------------------------------------------------------------------
# CLI.


def _cli(capsys, *argv):
    code = wiring_cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_json_and_exit_codes(src, capsys, tmp_path):
    root = str(src["0.5.9"].root)
    code, out, _ = _cli(capsys, "--engine", "sglang==0.5.9", "--arch", "DeepseekV3ForCausalLM",
                        "--layers", "12", "--ids", "-1,2,6", "--json", "--sglang-root", root)
    d = json.loads(out)
    assert code == 1 and d["served_layout"] == [0, 3, 7] and d["errors"] and d["source_lines"]
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                      "num_hidden_layers": 12}))
    code, out, _ = _cli(capsys, "--engine", "sglang==0.5.9", "--target", str(tmp_path), "--ids", "2,6,9",
                        "--json", "--sglang-root", root)
    d = json.loads(out)
    assert (code == 0 and d["arch"] == "LlamaForCausalLM" and d["served_layout"] == [3, 7, 10]
            and d["errors"] == [])
    code, out, _ = _cli(capsys, "--engine", "sglang==0.5.9", "--arch", "LlamaForCausalLM", "--layers", "12",
                        "--sglang-root", root)
    assert code == 0 and "served layout     : (2, 6, 9)" in out


@pytest.mark.parametrize("argv, message", [
    (["--engine", "vllm", "--arch", "X"], "need --arch and --layers"),
    (["--engine", "vllm", "--arch", "X", "--layers", "12", "--ids", "a,b"], "cannot read --ids"),
    (["--engine", "vllm", "--arch", "X", "--layers", "12", "--ids", "1,2", "--draft", "d"], "not allowed"),
    (["--engine", "vllm", "--arch", "X", "--layers", "12", "--draft", "/nonexistent/draft"], "not found"),
    (["--bogus"], "unrecognized"),
    # an empty or gappy id list is a typo, never a request for the defaults
    (["--engine", "vllm", "--arch", "X", "--layers", "12", "--ids", ""],
     "omit --ids to use the engine's default"),
    (["--engine", "vllm", "--arch", "X", "--layers", "12", "--ids="],
     "omit --ids to use the engine's default"),
    (["--engine", "vllm", "--arch", "X", "--layers", "12", "--ids", "1,,2"], "'1,,2' has an empty field"),
    (["--engine", "vllm", "--arch", "X", "--layers", "12", "--ids", "1,2,"], "'1,2,' has an empty field"),
    (["--engine", "vllm", "--arch", "X", "--layers", "12", "--ids", "1,x,2"], "'x' is not an integer"),
])
def test_cli_bad_input(capsys, argv, message):
    code, out, err = _cli(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("extra, message", [
    (["--layers", "48"], "--layers 48 contradicts"),
    (["--arch", "Qwen3MoeForCausalLM"], "--arch Qwen3MoeForCausalLM contradicts"),
])
def test_cli_target_disagreeing_with_flags(capsys, tmp_path, extra, message):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                      "num_hidden_layers": 32}))
    code, out, err = _cli(capsys, "--engine", "vllm", "--target", str(tmp_path), *extra)
    assert code == 2 and out == "" and err.count("\n") == 1
    assert message in err and str(tmp_path / "config.json") in err
    assert ("num_hidden_layers = 32" if "layers" in message else "['LlamaForCausalLM']") in err


def test_cli_family_name_suggests_architectures(src, capsys):
    code, out, err = _cli(capsys, "--engine", "sglang==0.5.9", "--arch", "llama", "--layers", "32",
                          "--sglang-root", str(src["0.5.9"].root))
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "no model class registered for architecture 'llama'; did you mean LlamaForCausalLM, " in err


def test_cli_arch_without_setter_is_one_error(src, capsys):
    code, out, _ = _cli(capsys, "--engine", "sglang==0.5.9", "--arch", "MixtralForCausalLM", "--layers", "32",
                        "--ids", "1,15,28", "--sglang-root", str(src["0.5.9"].root))
    assert code == 1
    assert out.count("error:") == 1 and "warning:" not in out
    assert "neither MixtralForCausalLM" in out and "MixtralModel" in out


def _offline(monkeypatch, tmp_path):
    """A dead index and an empty cache: what a machine without network sees."""
    monkeypatch.setenv(ss.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # no extra indexes or find-links from pip.conf
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "3")
    for var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)


def test_cli_offline_judges_by_the_recorded_rule_and_says_unreachable(capsys, monkeypatch, tmp_path):
    _offline(monkeypatch, tmp_path)
    code, out, err = _cli(capsys, "--engine", "sglang==0.5.23", "--arch", "DeepseekV3ForCausalLM",
                          "--layers", "61", "--ids", "2,30,58")
    assert code == 0 and out.splitlines()[0].endswith("(its rule recorded, not read now)")
    assert "unreachable" in out and "does not exist" not in out and "nothing is cached" in out
    assert "served layout     : (2, 30, 58)" in out       # the recorded DeepSeek rule of 0.5.23: as given
    assert not (tmp_path / "cache" / "sglang" / "0.5.23").exists()


def test_offline_falls_back_to_the_documented_rule(monkeypatch, tmp_path):
    _offline(monkeypatch, tmp_path)
    cfg = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 5, 8]}}
    plan = wiring.served_plan(cfg, L, "LlamaForCausalLM", parse_engine("sglang==0.5.23"))
    assert plan.layout == (2, 6, 9) and plan.source.endswith("(rule)")
    assert any("documented rule used" in w and "unreachable" in w for w in plan.warnings)
