"""Each engine's and trainer's rules, as docs/conventions.md records them (pure Python, no engine source)."""
from __future__ import annotations

import json

import pytest

from helpers.boundaries import WiringError
from helpers.engines.sglang.rule import sglang_documented_layout, sglang_format_warnings, sglang_plus_one
from helpers.engines.trtllm.rule import resolve_trtllm
from helpers.engines.vllm.rule import resolve_vllm, vllm_draft_class, vllm_ids_to_boundaries
from helpers.errors import BadOption, InputError
from helpers.rules.conventions import (
    DraftConfigError,
    Engine,
    IdsAt,
    TargetConfigError,
    check_ids,
    default_boundaries,
    default_ids,
    engine_ids,
    ids_in_config,
    is_final_release,
    is_version_string,
    layer_outputs_to_boundaries,
    parse_engine,
    read_draft_config,
    read_target_config,
    version_key,
)
from helpers.rules.flags import honours_norm_before_residual

L = 12
IDS_KEY = "eagle_aux_hidden_state_layer_ids"
E = parse_engine     # rule functions take an Engine: named as text only at the edge, parsed there


# -- defaults -----------------------------------------------------------------------------------


def test_default_boundaries():
    assert default_boundaries(12) == (2, 6, 9)
    assert default_boundaries(61) == (2, 30, 58)
    assert default_boundaries(8) == (2, 4, 5)


def test_default_ids():
    assert default_ids(12) == [2, 6, 9]


# -- conversions ----------------------------------------------------------------------------------


def test_sglang_plus_one():
    # The deployed tiny-kimi ids [2, 6, 9] are served as boundaries (3, 7, 10) (the embedded pair, README).
    assert sglang_plus_one([2, 6, 9]) == (3, 7, 10)
    # Fix A: id -1 is the embedding.
    assert sglang_plus_one([-1, 2, 6]) == (0, 3, 7)
    # Capture order is ascending layer index, whatever the config order.
    assert sglang_plus_one([9, 2, 6]) == (3, 7, 10)


def test_vllm_ids_are_boundaries_sorted():
    assert vllm_ids_to_boundaries([2, 6, 9]) == (2, 6, 9)
    assert vllm_ids_to_boundaries([9, 0, 6]) == (0, 6, 9)
    assert vllm_ids_to_boundaries([12, 3, 0]) == (0, 3, 12)


def test_layer_output_ids():
    # speculators <= 0.4 / SpecForge / TRT-LLM: "layer i" is the output of layer i = boundary i + 1
    assert layer_outputs_to_boundaries([-1, 2, 6, 11]) == (0, 3, 7, 12)
    # the concatenation order is kept: not sorted
    assert layer_outputs_to_boundaries([6, -1, 2]) == (7, 0, 3)
    # SpecForge's defaults [1, L//2-1, L-4] are the boundaries [2, L//2, L-3]
    assert layer_outputs_to_boundaries([1, L // 2 - 1, L - 4]) == default_boundaries(L)


def test_conversions_return_tuples():
    for fn in (sglang_plus_one, vllm_ids_to_boundaries, layer_outputs_to_boundaries):
        assert isinstance(fn([1, 2, 3]), tuple)



# -- where ids sit, and which key each engine reads ------------------------------------------------


NESTED = {"architectures": ["LlamaForCausalLMEagle3"], "eagle_config": {IDS_KEY: [2, 6, 9]}}
TOP = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", IDS_KEY: [-1, 2, 6]}
BOTH = {**NESTED, IDS_KEY: [0, 3, 7]}


@pytest.mark.parametrize("cfg, expected", [
    (NESTED, ([2, 6, 9], IdsAt.EAGLE_CONFIG)),
    (TOP, ([-1, 2, 6], IdsAt.TOP_LEVEL)),
    (BOTH, ([2, 6, 9], IdsAt.EAGLE_CONFIG)),
    ({"architectures": ["LlamaForCausalLMEagle3"]}, (None, IdsAt.NONE)),
])
def test_ids_in_config(cfg, expected):
    assert ids_in_config(cfg) == expected


def test_one_spelling_for_where_ids_sit():
    assert [str(v) for v in IdsAt] == ["eagle_config", "top-level", "none", "explicit"]
    assert json.dumps({"at": IdsAt.TOP_LEVEL}) == '{"at": "top-level"}'


def test_sglang_reads_only_the_nested_key():
    got = engine_ids(TOP, E("sglang==0.5.9"))
    assert (got.ids, got.source) == (None, IdsAt.NONE)
    assert any("ignores them" in w for w in got.warnings)
    assert engine_ids(TOP, E("sglang"), sglang_reads_top_level=True).ids == [-1, 2, 6]
    both = engine_ids(BOTH, E("sglang==0.5.9"))
    assert both.ids == [2, 6, 9] and any("differs" in w for w in both.warnings)


def test_vllm_reads_the_top_level_key_first():
    assert engine_ids(BOTH, E("vllm"), arch="LlamaForCausalLM").ids == [0, 3, 7]
    assert engine_ids(NESTED, E("vllm==0.22.0"), arch="LlamaForCausalLM").source == IdsAt.EAGLE_CONFIG
    # the V2 runner
    assert engine_ids(NESTED, E("vllm==0.22.0"), arch="Qwen3ForCausalLM").source == IdsAt.NONE
    assert engine_ids(NESTED, E("vllm==0.29.0"), arch="GptOssForCausalLM").source == IdsAt.NONE  # V2 for all
    assert engine_ids(BOTH, E("vllm==0.11.0"), arch="LlamaForCausalLM").source == IdsAt.NONE  # reads none yet
    assert engine_ids({"architectures": ["LlamaForCausalLMEagle3"]}, E("vllm")).source == IdsAt.NONE


def test_vllm_v2_runner_reads_eagle_config_layer_ids_and_an_empty_list_is_no_ids():
    other_key = {"eagle_config": {"layer_ids": [1, 5, 9]}}
    assert engine_ids(other_key, E("vllm==0.32.0"), arch="LlamaForCausalLM").ids == [1, 5, 9]  # V2 default
    assert engine_ids(other_key, E("vllm==0.26.0"), arch="LlamaForCausalLM").ids is None  # before 0.27
    assert engine_ids(other_key, E("vllm==0.32.0:v1"), arch="LlamaForCausalLM").ids is None        # V1 never
    empty_top = {IDS_KEY: [], "eagle_config": {IDS_KEY: [1, 5, 9]}}
    assert engine_ids(empty_top, E("vllm==0.32.0:v1"), arch="LlamaForCausalLM").ids == [1, 5, 9]


def test_ids_that_are_not_a_list_are_refused():
    with pytest.raises(DraftConfigError, match="expected a list"):
        ids_in_config({"eagle_config": {IDS_KEY: "2,6,9"}})


def test_check_ids():
    assert check_ids([-1, 2, 6], L) == [-1, 2, 6]
    for bad in ([13], [-2], [], [1.5]):
        with pytest.raises(WiringError):
            check_ids(bad, L)


# -- engines, versions and documented rules --------------------------------------------------------


def test_parse_engine():
    assert parse_engine("sglang==0.5.9") == Engine("sglang", "0.5.9")
    assert parse_engine(" VLLM ") == Engine("vllm")
    for bad in ("tensorrt", "sglang==latest"):
        with pytest.raises(BadOption):
            parse_engine(bad)


def test_sglang_documented_layout_by_version():
    assert (sglang_documented_layout("DeepseekV3ForCausalLM", "0.5.9", [2, 6, 9], IdsAt.EAGLE_CONFIG, L)[0]
            == (3, 7, 10))
    assert (sglang_documented_layout("DeepseekV3ForCausalLM", "0.5.23", [2, 6, 9], IdsAt.EAGLE_CONFIG, L)[0]
            == (2, 6, 9))
    assert (sglang_documented_layout("DeepseekV3ForCausalLM", "0.5.23", [1, 5, 8], IdsAt.EAGLE_CONFIG, L)[0]
            == (2, 6, 9))
    assert (sglang_documented_layout("LlamaForCausalLM", "0.5.23", [2, 6, 9], IdsAt.EAGLE_CONFIG, L)[0]
            == (3, 7, 10))
    assert (sglang_documented_layout("LlamaForCausalLM", "0.5.9", [0, 3, 7], IdsAt.TOP_LEVEL, L)[0]
            == (2, 6, 9))


def test_norm_before_residual_policy():
    assert not honours_norm_before_residual(E("sglang==0.5.9")) and honours_norm_before_residual(E("vllm"))
    warns = sglang_format_warnings({**TOP, "norm_before_residual": True})
    assert any("speculators-format" in w for w in warns) and any("norm_before_residual" in w for w in warns)
    assert sglang_format_warnings(NESTED) == []


# -- reading configs: one exception type each -------------------------------------------------------


def test_read_draft_config_errors(tmp_path):
    with pytest.raises(DraftConfigError, match="no draft at"):
        read_draft_config(tmp_path)
    (tmp_path / "config.json").write_text("[1]")
    with pytest.raises(DraftConfigError, match="holds a JSON list"):
        read_draft_config(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(DraftConfigError, match="swapped"):
        read_draft_config(tmp_path)
    # another drafter's head is named as such, not taken for a swapped target
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["DFlashDraftModel"],
                                                      "num_hidden_layers": 1}))
    with pytest.raises(DraftConfigError, match="another kind of draft head"):
        read_draft_config(tmp_path)
    assert issubclass(DraftConfigError, InputError)


def test_read_target_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["KimiK25ForConditionalGeneration"],
                                                      "text_config": {"num_hidden_layers": 61,
                                                                      "hidden_size": 7168}}))
    cfg = read_target_config(tmp_path)
    assert cfg["num_hidden_layers"] == 61 and cfg["hidden_size"] == 7168
    (tmp_path / "config.json").write_text(json.dumps(NESTED))
    with pytest.raises(TargetConfigError, match="swapped"):
        read_target_config(tmp_path)
    with pytest.raises(TargetConfigError, match="no target config"):
        read_target_config(tmp_path / "nope")


def test_trtllm_layer_outputs_and_the_post_norm_minus_one():
    default = resolve_trtllm(None, "LlamaForCausalLM", 32, None, None)
    assert default.layers_to_capture == [1, 15, 28] and default.served_layout == (2, 16, 29)
    post = resolve_trtllm(None, "LlamaForCausalLM", 32, [-1, 1, 15, 28], None)    # one-model: -1 stays first
    assert post.layers_to_capture == [-1, 1, 15, 28] and not post.errors
    assert post.served_layout == (32, 2, 16, 29)
    ignored = resolve_trtllm(None, "LlamaForCausalLM", 32, None, NESTED)
    assert ignored.ids_used is None and any("speculative config" in w for w in ignored.warnings)


def test_engine_is_parsed_once_and_pins_a_runner():
    e = parse_engine("vllm==0.32.0:v1")
    assert (e.name, e.version, e.runner, str(e)) == ("vllm", "0.32.0", "v1", "vllm==0.32.0:v1")
    assert parse_engine(e) is e                      # a parsed value passes through, never re-parsed
    with pytest.raises(BadOption, match="only vLLM has them"):
        parse_engine("sglang==0.5.9:v1")
    with pytest.raises(BadOption, match="vLLM has no model runner ':v3'"):
        parse_engine("vllm==0.32.0:v3")
    # the runner decides which key vLLM reads: V1 falls back to eagle_config's ids, V2 never does
    nested = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 6, 9]}}
    assert engine_ids(nested, E("vllm==0.32.0:v1"), arch="LlamaForCausalLM").ids == [2, 6, 9]
    assert engine_ids(nested, E("vllm==0.32.0:v2"), arch="LlamaForCausalLM").ids is None


def test_vllm_draft_class_by_release():
    """vLLM's EAGLEConfig prefixes Eagle3 to the draft's class and the registry must hold the result
    (docs/conventions.md, "Draft formats"): SGLang's class only from 0.10.2, MLA from 0.18.0."""
    sglang_fmt = {"architectures": ["LlamaForCausalLMEagle3"]}
    assert vllm_draft_class("0.10.1", sglang_fmt)[0] is False and vllm_draft_class("0.10.2", sglang_fmt)[0]
    mla = {"architectures": ["Eagle3DeepseekV2ForCausalLM"]}
    assert vllm_draft_class("0.17.1", mla)[0] is False and vllm_draft_class("0.18.0", mla)[0]
    reference = {"architectures": ["LlamaForCausalLM"], "draft_vocab_size": 32000}
    assert vllm_draft_class("0.9.0", reference)[0]
    qwen_reference = {"architectures": ["Qwen2ForCausalLM"], "draft_vocab_size": 8}
    assert vllm_draft_class("0.33.0", qwen_reference)[0] is False
    qwen3_reference = {"architectures": ["Qwen3ForCausalLM"], "draft_vocab_size": 8}   # qwen3_eagle3.py
    assert vllm_draft_class("0.23.0", qwen3_reference)[0] is False
    assert vllm_draft_class("0.24.0", qwen3_reference)[0]
    spec = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3"}
    assert vllm_draft_class("0.10.0", spec)[0] is False and vllm_draft_class("0.10.1", spec)[0]


@pytest.mark.parametrize("arch, before, first", [
    ("KimiK25ForConditionalGeneration", "0.17.1", "0.18.0"),
    ("Qwen3_5MoeForConditionalGeneration", "0.19.1", "0.20.0"),   # a setter from 0.17.0 that nothing reads
    ("Qwen2ForCausalLM", "0.10.1", "0.10.2"),
])
def test_vllm_capture_of_wrapped_and_other_targets_by_release(arch, before, first):
    assert resolve_vllm(before, arch, 48, None, None).errors
    ok = resolve_vllm(first, arch, 48, None, None)
    assert not ok.errors and ok.served_layout == (2, 24, 45)
    assert not any("is not among the classes read" in w for w in ok.warnings)


def test_flag_fix_names_the_releases_that_run_every_ignored_flag():
    from helpers.rules.flags import flag_fix
    assert flag_fix(["fc_norm", "norm_output"], "Eagle3DeepseekV2ForCausalLM") == (
        "serve with sglang>=0.5.13 or vllm>=0.23.0, or retrain without fc_norm, norm_output")
    assert flag_fix("norm_before_fc", "Eagle3DeepseekV2ForCausalLM").startswith(
        "serve with an engine that implements norm_before_fc (none read does")


@pytest.mark.parametrize("lower, higher", [
    ("0.34.0rc1", "0.34.0"),          # a release candidate comes before its release
    ("0.33.1.dev12", "0.33.1"),       # a dev build comes before its release
    ("0.5.13rc1", "0.5.13.post1"),    # and is not the post-release that follows it
    ("0.5.13", "0.5.13.post1"),       # a post-release comes after its release
    ("0.5.9", "0.5.10"),
    ("b9999", "b11434"),              # llama.cpp builds, as their numbers
])
def test_versions_are_ordered_as_pep_440_says(lower, higher):
    assert version_key(lower) < version_key(higher) and not version_key(higher) <= version_key(lower)
    assert sorted([higher, lower], key=version_key) == [lower, higher]


def test_only_final_releases_are_final():
    assert [v for v in ("0.34.0rc1", "0.33.1.dev12", "0.5.13.post1", "0.5.13", "1.0a1", "1.0b2", "x")
            if is_final_release(v)] == ["0.5.13.post1", "0.5.13"]
    assert is_version_string("0.5.13.post1") and not is_version_string("1!0.5") and not is_version_string(
        "0.5+local")
