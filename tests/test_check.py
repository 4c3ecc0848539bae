"""``check``: the pre-deployment gate, on cases drawn from public reports (docs/conventions.md cites them).

Each case builds a draft folder (config.json and a safetensors file with an fc of the right width; no
real weights: check reads headers only) and a target config with the real model's layer count, then
asserts the verdict, the exit status and the problem kinds. The SGLang releases named are resolved
from their own source, as in use.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from helpers.__main__ import main as cli
from helpers.errors import InputError
from helpers.investigation.draft_file import safetensors_shapes
from helpers.investigation.gate import check
from helpers.rules.conventions import parse_engine

H = 16                      # a narrow hidden size: the checks depend on ids, depths and versions, not width
IDS = "eagle_aux_hidden_state_layer_ids"
REPO = Path(__file__).resolve().parent.parent


def _target(tmp: Path, arch: str, layers: int, vocab: int = 1000) -> Path:
    path = tmp / f"target-{arch}-{layers}"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": [arch], "num_hidden_layers": layers,
                                                  "hidden_size": H, "vocab_size": vocab}))
    return path


def _draft(tmp: Path, name: str, *, slots: int = 3, nested=None, top=None, record=None, speculators=False,
           d2t: bool = True, draft_vocab: int = 200, extra: dict | None = None) -> Path:
    path = tmp / name
    path.mkdir()
    cfg = ({"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
            "transformer_layer_config": {"hidden_size": H}} if speculators else
           {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": H})
    cfg["draft_vocab_size"] = draft_vocab
    if nested is not None:
        cfg["eagle_config"] = {IDS: nested, "use_aux_hidden_state": True}
    if top is not None:
        cfg[IDS] = top
    cfg.update(extra or {})
    (path / "config.json").write_text(json.dumps(cfg))
    tensors = {"fc.weight": torch.zeros(H, slots * H)}
    if d2t:
        tensors["d2t"] = torch.zeros(draft_vocab, dtype=torch.long)
    save_file(tensors, str(path / "model.safetensors"))
    if record is not None:
        (path / "training.json").write_text(json.dumps({"training_boundaries": list(record)}))
    return path


def _kinds(report) -> set[str]:
    return {p.kind for p in report.problems if p.blocking}


# -- the cases ------------------------------------------------------------------------------------


def test_original_case_kimi_on_sglang_0_5_9(tmp_path):
    """The investigation this workbook retells: a Kimi-K2.5 draft (61 layers) trained on (0, 3, 31),
    deployed with ids [2, 30, 58], which SGLang 0.5.9 serves as (3, 31, 59)."""
    r = check(_draft(tmp_path, "d", nested=[2, 30, 58], record=(0, 3, 31)), parse_engine("sglang==0.5.9"),
              target=_target(tmp_path, "DeepseekV3ForCausalLM", 61))
    assert r.exit_code == 1 and r.served_layout == (3, 31, 59) and "layout-mismatch" in _kinds(r)
    fix = next(p.fix for p in r.problems if p.kind == "layout-mismatch")
    assert "patch-sglang apply --version 0.5.9" in fix and "[-1, 2, 30]" in fix and "retrain" in fix


@pytest.mark.parametrize("version, served, code", [("0.5.12", (3, 31, 59), 1), ("0.5.13", (2, 30, 58), 0)])
def test_sglang_pr_25454_deepseek_plus_one_only_when_first_id_is_1(tmp_path, version, served, code):
    """kimi-k2.5-eagle3-mla writes input-to-layer ids (first id 2): 0.5.12 still adds one to them."""
    r = check(_draft(tmp_path, "d", nested=[2, 30, 58]), parse_engine(f"sglang=={version}"),
              target=_target(tmp_path, "DeepseekV3ForCausalLM", 61),
              trainer="speculators==0.9.0", train_ids=[2, 30, 58])
    assert (r.served_layout, r.training_layout, r.exit_code) == (served, (2, 30, 58), code)


@pytest.mark.parametrize("version, code", [("0.5.16", 1), ("0.5.17", 0)])
def test_sglang_pr_32334_gpt_oss_ids_naming_the_final_boundary(tmp_path, version, code):
    """gpt-oss-120b-Eagle3-v3 was trained on boundaries (24, 30, 36) of a 36-layer target: before
    0.5.17 SGLang adds one (37 is no layer); from 0.5.17 ids ending at N are used as given."""
    r = check(_draft(tmp_path, "d", nested=[24, 30, 36], record=(24, 30, 36)),
              parse_engine(f"sglang=={version}"),
              target=_target(tmp_path, "GptOssForCausalLM", 36))
    assert r.exit_code == code
    assert (r.served_layout == (24, 30, 36)) == (code == 0)


def test_vllm_pr_50170_no_ids_falls_back_silently(tmp_path):
    """A speculators <= 0.4 draft (its config carries no ids) on an 80-layer Llama: vLLM serves its
    default (2, 40, 77); the features were layer outputs (3, 41, 78)."""
    r = check(_draft(tmp_path, "d", speculators=True), parse_engine("vllm"),
              target=_target(tmp_path, "LlamaForCausalLM", 80), trainer="speculators==0.4.0")
    assert r.training_layout == (3, 41, 78) and r.served_layout == (2, 40, 77) and r.exit_code == 1
    assert "ids-missing" in {p.kind for p in r.problems}


def test_vllm_pr_43671_sglang_trained_draft_on_vllm(tmp_path):
    """Trained through SGLang's +1 (SpecForge's SGLang backend, ids [1, 15, 28] -> boundaries
    (2, 16, 29)), then served by vLLM with the same numbers written top-level: off by one."""
    r = check(_draft(tmp_path, "d", top=[1, 15, 28]), parse_engine("vllm"),
              target=_target(tmp_path, "LlamaForCausalLM", 32), trainer="specforge-sglang==0.5.9",
              train_ids=[1, 15, 28])
    assert r.training_layout == (2, 16, 29) and r.served_layout == (1, 15, 28) and r.exit_code == 1
    assert "[2, 16, 29] in top-level" in next(p.fix for p in r.problems if p.kind == "layout-mismatch")


def test_vllm_pr_54598_four_top_level_ids_crash_fc_loading(tmp_path):
    """speculators issue #1065: 4 top-level ids [2, 46, 91, 93] on a 94-layer Qwen3-MoE, no
    num_aux_hidden_states: vLLM sizes fc for 3 states and the 4-slot weights fail to load."""
    r = check(_draft(tmp_path, "d", slots=4, top=[2, 46, 91, 93], speculators=True), parse_engine("vllm"),
              target=_target(tmp_path, "Qwen3MoeForCausalLM", 94), trainer="speculators==0.8.0")
    assert r.training_layout == (2, 46, 91, 93) and r.agree and r.exit_code == 1
    assert "fc-width" in _kinds(r)
    assert "num_aux_hidden_states = 4" in next(p.fix for p in r.problems if p.kind == "fc-width")


def test_speculators_0_4_features_are_layer_outputs(tmp_path):
    """speculators <= 0.4 captured after each layer: its default [2, 16, 29, 31] on a 32-layer Llama
    is boundaries (3, 17, 30) + the verifier's 32. SGLang serves its default (2, 16, 29); writing
    [2, 16, 29] under eagle_config makes it serve (3, 17, 30) without a patch."""
    r = check(_draft(tmp_path, "d"), parse_engine("sglang==0.5.9"), target=_target(tmp_path,
                                                                                   "LlamaForCausalLM", 32),
              trainer="speculators==0.4.0")
    assert r.training_layout == (3, 17, 30) and r.served_layout == (2, 16, 29) and r.exit_code == 1
    assert "write ids [2, 16, 29] in eagle_config" in next(p.fix for p in r.problems
                                                           if p.kind == "layout-mismatch")


def test_specforge_middle_id_n_over_2(tmp_path):
    """SpecForge's HF path briefly used N//2 as the middle id (PR #239): trained on (2, 17, 29) while
    the config says the default [1, 15, 28], which SGLang serves as (2, 16, 29)."""
    r = check(_draft(tmp_path, "d", nested=[1, 15, 28]), parse_engine("sglang==0.5.9"),
              target=_target(tmp_path, "LlamaForCausalLM", 32), trainer="specforge-hf", train_ids=[1, 16, 28])
    assert r.training_layout == (2, 17, 29) and r.served_layout == (2, 16, 29) and r.exit_code == 1


def test_trtllm_minus_one_is_post_norm(tmp_path):
    """TRT-LLM's -1 is the final state after the norm: a draft trained with it in a slot cannot be
    served by any engine's boundaries."""
    r = check(_draft(tmp_path, "d", slots=4, nested=[1, 15, 28]), parse_engine("sglang==0.5.9"),
              target=_target(tmp_path, "LlamaForCausalLM", 32), trainer="trtllm", train_ids=[1, 15, 28, -1])
    assert r.training_layout is None and r.exit_code == 1 and "trainer" in _kinds(r)


def test_eagle_flag_with_an_eagle3_draft(tmp_path):
    """SGLang PR #21272: an EAGLE-3 draft under --speculative-algorithm EAGLE serves at accept length 1.00."""
    d = _draft(tmp_path, "d", nested=[2, 6, 9], record=(3, 7, 10))
    ok = check(d, parse_engine("sglang==0.5.9"), target=_target(tmp_path, "LlamaForCausalLM", 12))
    bad = check(d, parse_engine("sglang==0.5.9"), target=_target(tmp_path, "LlamaForCausalLM", 12),
                algorithm="EAGLE")
    assert ok.exit_code == 0 and bad.exit_code == 1 and "algorithm" in _kinds(bad) and bad.agree


def test_speculators_format_and_norm_before_residual_under_sglang(tmp_path):
    d = _draft(tmp_path, "d", speculators=True, top=[1, 3, 7], record=(1, 3, 7),
               extra={"norm_before_residual": True})
    r = check(d, parse_engine("sglang==0.5.9"), target=_target(tmp_path, "LlamaForCausalLM", 12))
    assert {"speculators-format", "norm-before-residual", "layout-mismatch"} <= _kinds(r)
    assert "ids-key" in {p.kind for p in r.problems}
    v = check(d, parse_engine("vllm"), target=_target(tmp_path, "LlamaForCausalLM", 12))
    assert v.exit_code == 0, v.problems


def test_reduced_vocabulary_without_d2t(tmp_path):
    d = _draft(tmp_path, "d", nested=[2, 6, 9], record=(3, 7, 10), d2t=False)
    r = check(d, parse_engine("sglang==0.5.9"), target=_target(tmp_path, "LlamaForCausalLM", 12))
    assert _kinds(r) == {"vocab"} and r.exit_code == 1


def test_unknown_training_layout_says_what_settles_it(tmp_path):
    r = check(_draft(tmp_path, "d", nested=[2, 6, 9]), parse_engine("sglang==0.5.9"),
              target=_target(tmp_path, "LlamaForCausalLM", 12))
    assert r.training_layout is None and r.exit_code == 3 and "UNKNOWN" in r.verdict
    assert "diagnose" in next(p.fix for p in r.problems if p.kind == "training-unknown")


# -- the embedded pair, the CLI and bad input ---------------------------------------------------------


def test_embedded_pair_names_the_bug_and_both_fixes(capsys):
    """The bug and both fixes named; how long it took is in the report (`seconds`), measured, not asserted."""
    code = cli(["check", "--draft", str(REPO / "data/tiny-kimi/draft"),
                "--target", str(REPO / "data/tiny-kimi/target"), "--engine", "sglang==0.5.9"])
    out = capsys.readouterr().out
    assert code == 1 and "MISMATCH" in out and "(3, 7, 10)" in out and "(0, 3, 7)" in out
    # each way out named by what it does, not by the story's shorthand
    assert "write ids [-1, 2, 6]" in out and "retrain the draft on the served layout (3, 7, 10)" in out
    assert "patch-sglang apply" in out and "fix A" not in out and "fix B" not in out
    assert cli(["check", "--draft", str(REPO / "data/tiny-kimi/draft-retrained"), "--target-config",
                str(REPO / "data/tiny-kimi/target/config.json"), "--engine", "sglang==0.5.9", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"].startswith("OK")


@pytest.mark.parametrize("argv, message", [
    (["--engine", "sglang==0.5.9"], "--draft DIR is required"),
    (["--draft", "D", "--engine", "sglang==0.5.9"], "--target DIR or --target-config"),
    (["--draft", "D", "--target", "T", "--engine", "tgi"], "unknown engine"),
    (["--draft", "D", "--target", "T", "--engine", "sglang==0.5.9", "--trainer", "axolotl"],
     "unknown trainer"),
    (["--draft", "D", "--target", "T", "--engine", "sglang==0.5.9", "--train-ids", "1,2"],
     "goes with --trainer"),
    (["--draft", "D", "--target", "T", "--engine", "sglang==0.5.9", "--algorithm", "MEDUSA"],
     "EAGLE3 or EAGLE"),
])
def test_bad_input_exit_2(tmp_path, capsys, argv, message):
    argv = [str(_target(tmp_path, "LlamaForCausalLM", 12)) if a == "T" else
            str(_draft(tmp_path, "d", nested=[2, 6, 9])) if a == "D" else a for a in argv]
    assert cli(["check", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_swapped_or_missing_folders(tmp_path):
    t = _target(tmp_path, "LlamaForCausalLM", 12)
    d = _draft(tmp_path, "d", nested=[2, 6, 9])
    with pytest.raises(InputError, match="swapped"):
        check(t, parse_engine("sglang==0.5.9"), target=d)
    with pytest.raises(InputError, match="not found"):
        check(tmp_path / "nope", parse_engine("sglang==0.5.9"), target=t)


def test_headers_only(tmp_path):
    d = _draft(tmp_path, "d", slots=4)
    assert safetensors_shapes(d) == {"fc.weight": [H, 4 * H], "d2t": [200]}
    (d / "model.safetensors").write_bytes(b"\xff" * 4)
    with pytest.raises(InputError, match="not a readable safetensors"):
        safetensors_shapes(d)


def test_header_whose_tensors_end_past_the_file_is_refused(tmp_path, monkeypatch):
    """A safetensors library that opens a truncated file whose header survived (older releases did) must
    not hand back its shapes: the tensors the header lists must end where the file ends."""
    import safetensors

    d = _draft(tmp_path, "d", slots=4)
    f = d / "model.safetensors"
    size, n = f.stat().st_size, int.from_bytes(f.read_bytes()[:8], "little")
    (tmp_path / "whole.safetensors").write_bytes(f.read_bytes())
    f.write_bytes(f.read_bytes()[: size - 16])          # 16 bytes of weights lost, the header whole
    real = safetensors.safe_open

    class Lenient:                                       # what a lenient library would give
        def __init__(self, path, framework):
            self.inner = real(str(tmp_path / "whole.safetensors"), framework)

        def __enter__(self):
            return self.inner.__enter__()

        def __exit__(self, *exc):
            return self.inner.__exit__(*exc)

    monkeypatch.setattr(safetensors, "safe_open", Lenient)
    with pytest.raises(InputError) as info:
        safetensors_shapes(d)
    msg = str(info.value)
    assert str(f) in msg and f"end at byte {size}, the file has {size - 16} bytes" in msg, msg
    assert f"header ({n} bytes)" in msg


@pytest.mark.parametrize("version, served, kinds", [
    ("0.5.9", (), {"engine-cannot-capture"}),   # the wrapper has no setter before 0.5.10: nothing is served
    ("0.5.10", (3, 31, 59), set()),
    ("0.5.13", (2, 30, 58), set()),
])
def test_kimi_k25_wrapper_reads_its_depth_from_text_config(tmp_path, version, served, kinds):
    target = tmp_path / "kimi-k2.5"
    target.mkdir()
    (target / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"],
        "text_config": {"num_hidden_layers": 61, "hidden_size": H, "vocab_size": 1000}}))
    r = check(_draft(tmp_path, "d", nested=[2, 30, 58], record=served or (3, 31, 59)),
              parse_engine(f"sglang=={version}"),
              target=target)
    assert r.num_layers == 61 and r.served_layout == served and kinds <= _kinds(r)
    assert r.exit_code == (1 if kinds else 0)


# --------------------------------------------------------------------------------------
# Release drift, trainer candidates, topology, llama.cpp (issue 19; docs/conventions.md).


def _kimi_k25(tmp: Path) -> Path:
    target = tmp / "kimi-k2.5-wrapper"
    target.mkdir(exist_ok=True)
    (target / "config.json").write_text(json.dumps({
        "architectures": ["KimiK25ForConditionalGeneration"],
        "text_config": {"num_hidden_layers": 61, "hidden_size": H, "vocab_size": 1000}}))
    return target


def test_release_drift_names_the_sglang_release_that_changes_the_layout(tmp_path):
    d = _draft(tmp_path, "d", nested=[2, 30, 58])
    r = check(d, parse_engine("sglang==0.5.9"), target=_target(tmp_path, "DeepseekV3ForCausalLM", 61))
    runs = [(e["first"], e["last"], e["served_layout"]) for e in r.served_across_releases]
    assert ("0.5.4.post2", "0.5.12.post1", [3, 31, 59]) in runs
    assert runs[-1] == ("0.5.13", "0.5.23", [2, 30, 58])
    assert r.release_drift == "SGLang: from 0.5.13 this draft is served (2, 30, 58)"
    assert "data/releases.json" in r.releases_from      # a cached architecture: one release per class
    newest = check(d, parse_engine("sglang==0.5.23"), target=_target(tmp_path, "DeepseekV3ForCausalLM", 61))
    assert newest.release_drift.startswith("SGLang: up to 0.5.12.post1 this draft was served (3, 31, 59)")
    last = json.loads(json.dumps(newest.to_dict()))["served_across_releases"][-1]
    assert last["served_layout"] == [2, 30, 58]


def test_release_drift_through_the_kimi_wrapper(tmp_path):
    r = check(_draft(tmp_path, "d", nested=[2, 30, 58]), parse_engine("sglang==0.5.9"),
              target=_kimi_k25(tmp_path))
    said = {e["first"]: e for e in r.served_across_releases}
    assert said["0.5.9"]["served_layout"] is None and "no EAGLE-3 capture" in said["0.5.9"]["note"]
    assert said["0.5.10"]["served_layout"] == [3, 31, 59] and said["0.5.13"]["served_layout"] == [2, 30, 58]
    assert "from 0.5.10 this draft is served (3, 31, 59)" in r.release_drift


def test_vllm_drift_from_the_runner_default(tmp_path):
    # nested ids only: V1 reads them from 0.22.0; the V2 runner (DeepSeek's default from 0.24.0) never does
    d = _draft(tmp_path, "d", nested=[1, 29, 57])
    r = check(d, parse_engine("vllm==0.22.0"), target=_target(tmp_path, "DeepseekV3ForCausalLM", 61))
    runs = [(e["first"], e["last"], e["served_layout"]) for e in r.served_across_releases]
    assert ("0.22.0", "0.23.0", [1, 29, 57]) in runs and runs[-1][2] == [2, 30, 58], runs
    assert r.release_drift == ("vllm: from 0.24.0 this draft is served (2, 30, 58) "
                               "(ids ignored, defaults served)")
    same = check(_draft(tmp_path, "e", nested=[2, 30, 58]), parse_engine("vllm==0.33.0"),
                 target=_target(tmp_path, "DeepseekV3ForCausalLM", 61))
    # the default is this same layout, so the runner change is no drift; DeepSeek's capture (0.18.0) is
    assert same.release_drift.startswith("vllm: up to 0.17.1 this draft was not served (no EAGLE-3 capture)")


def test_candidates_when_no_trainer_is_recorded(tmp_path):
    d = _draft(tmp_path, "d", nested=[2, 30, 58])
    r = check(d, parse_engine("sglang==0.5.9"), target=_target(tmp_path, "DeepseekV3ForCausalLM", 61))
    got = {c["trainer"]: (c["training_layout"], c["served_agrees"]) for c in r.candidates}
    assert got["specforge-hf"] == ([3, 31, 59], True) and got["modelopt"] == ([3, 31, 59], True)
    assert got["specforge-sglang==0.5.9"] == ([3, 31, 59], True)
    assert "torchspec-vllm" not in got                     # a llama-type draft: the export leaves its ids
    assert r.exit_code == 3 and r.verdict.startswith("UNKNOWN")
    mla = _draft(tmp_path, "mla", nested=[2, 30, 58], extra={"architectures": ["Eagle3DeepseekV2ForCausalLM"],
                                                              "model_type": "kimi_k2"})
    later = check(mla, parse_engine("sglang==0.5.23"), target=_target(tmp_path, "DeepseekV3ForCausalLM", 61))
    got = {c["trainer"]: (c["training_layout"], c["served_agrees"]) for c in later.candidates}
    assert got["torchspec-vllm"] == ([2, 30, 58], True) and got["torchspec"] == ([3, 31, 59], False)
    assert check(d, parse_engine("sglang==0.5.9"), target=_target(tmp_path, "DeepseekV3ForCausalLM", 61),
                 trainer="specforge-hf").candidates == []


def test_candidates_for_a_speculators_config(tmp_path):
    d = _draft(tmp_path, "s", speculators=True, top=[2, 16, 29])
    r = check(d, parse_engine("vllm==0.33.0"), target=_target(tmp_path, "LlamaForCausalLM", 32))
    assert [(c["trainer"], c["training_layout"], c["served_agrees"]) for c in r.candidates] == [
        ("speculators==0.9.0", [2, 16, 29], True)]


def test_pipeline_stages_drop_captures_with_the_fix(tmp_path):
    d = _draft(tmp_path, "d", nested=[1, 29, 57], record=(2, 30, 58))
    t = _target(tmp_path, "DeepseekV3ForCausalLM", 61)
    assert check(d, parse_engine("sglang==0.5.23"), target=t).ok
    r = check(d, parse_engine("sglang==0.5.23"), target=t, tp=4, pp=2)
    topo = [p for p in r.problems if p.kind == "topology"]
    assert topo and r.exit_code == 1 and r.topology["stages"] == [(0, 30), (30, 61)]
    assert "returns early unless pp_group.is_last_rank" in topo[0].message
    assert "SGLANG_PP_LAYER_PARTITION=1,60" in topo[0].fix and "--tp 8 --pp 1" in topo[0].fix
    # vLLM 0.32.0's V2 runner relays aux states for Llama; V1 drops them
    dl = _draft(tmp_path, "l", top=[2, 16, 29], record=(2, 16, 29))
    tl = _target(tmp_path, "LlamaForCausalLM", 32)
    assert not any(p.kind == "topology" for p in check(dl, parse_engine("vllm==0.32.0"), target=tl,
                                                       pp=2).problems)
    v1 = check(dl, parse_engine("vllm==0.32.0:v1"), target=tl, pp=2)
    assert any(p.kind == "topology" and "PR #45985" in p.message for p in v1.problems)
    with pytest.raises(InputError, match="--pp 0"):
        check(dl, parse_engine("vllm==0.32.0"), target=tl, pp=0)


def test_llamacpp_reads_the_top_level_key_from_its_builds(tmp_path):
    t = _target(tmp_path, "LlamaForCausalLM", 32)
    top = _draft(tmp_path, "top", top=[1, 15, 28], record=(1, 15, 28))
    new = check(top, parse_engine("llamacpp==11434"), target=t)
    assert new.ok
    old = check(top, parse_engine("llamacpp==10001"), target=t)
    assert old.served_layout == (2, 16, 29) and "layout-mismatch" in _kinds(old)
    nested = check(_draft(tmp_path, "n", nested=[1, 15, 28], record=(1, 15, 28)),
                   parse_engine("llamacpp==11434"), target=t)
    assert nested.served_layout == (2, 16, 29)
    assert any("ignores the draft's eagle_config" in n for n in nested.notes)
    runs = [(e["first"], e["served_layout"]) for e in new.to_dict()["served_across_releases"]]
    assert runs == [("9093", None), ("10001", [2, 16, 29]), ("10705", [1, 15, 28])]
    kimi = check(top, parse_engine("llamacpp"), target=_target(tmp_path, "DeepseekV3ForCausalLM", 61))
    assert kimi.served_layout == () and "engine-cannot-capture" in _kinds(kimi)


def test_eagle_reference_head_is_checked_not_refused(tmp_path):
    """The EAGLE reference code's own head (SafeAILab EAGLE eagle/traineagle3/config.json: a one-layer
    LlamaForCausalLM with draft_vocab_size, no eagle_config). vLLM renames the class and serves it;
    SGLang builds the plain Llama class and loads none of the head. Its only writer trains on the
    fixed (2, N//2, N-3)."""
    draft = _draft(tmp_path, "eagle-ref",
                   extra={"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1})
    target = _target(tmp_path, "LlamaForCausalLM", 32)
    sg = check(draft, parse_engine("sglang==0.5.9"), target=target, across_releases=False)
    assert "draft-class" in _kinds(sg)
    assert [(c["trainer"], c["training_layout"]) for c in sg.candidates] == [("eagle", [2, 16, 29])]
    assert "--trainer eagle" in next(p.fix for p in sg.problems if p.kind == "training-unknown")
    vl = check(draft, parse_engine("vllm==0.32.0"), target=target, across_releases=False)
    assert "draft-class" not in _kinds(vl) and vl.served_layout == (2, 16, 29)
    assert any("Eagle3LlamaForCausalLM" in n for n in vl.notes)
    full = tmp_path / "full"
    full.mkdir()
    (full / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"],
                                                  "num_hidden_layers": 32, "vocab_size": 200}))
    with pytest.raises(InputError, match="not an EAGLE-3 draft"):
        check(full, parse_engine("vllm==0.32.0"), target=target)


def test_sglang_refuses_a_draft_class_its_release_does_not_register(tmp_path):
    """vLLM's own name for the Llama head (Eagle3LlamaForCausalLM) is not in any SGLang EntryClass:
    read from the release's model files, not from a list kept here."""
    draft = _draft(tmp_path, "vllm-named", nested=[2, 16, 29],
                   extra={"architectures": ["Eagle3LlamaForCausalLM"]})
    target = _target(tmp_path, "LlamaForCausalLM", 32)
    r = check(draft, parse_engine("sglang==0.5.23"), target=target, across_releases=False)
    problem = next(p for p in r.problems if p.kind == "draft-class")
    assert "LlamaForCausalLMEagle3" in problem.message and "LlamaForCausalLMEagle3" in problem.fix
    ok = check(_draft(tmp_path, "sglang-named", nested=[2, 16, 29]), parse_engine("sglang==0.5.23"),
               target=_target(tmp_path, "LlamaForCausalLM", 32), across_releases=False)
    assert "draft-class" not in {p.kind for p in ok.problems}


def test_engine_that_sizes_fc_otherwise_than_it_feeds_it_is_blocking_without_weights(tmp_path):
    """vLLM sizes fc from num_aux_hidden_states, else the nested ids' count, and feeds what it captures:
    four nested ids on the V2 runner (which reads only the top level) build a 4-slot fc fed 3 states.
    No weights are needed to see it."""
    folder = tmp_path / "four"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "hidden_size": H, "draft_vocab_size": 200,
        "eagle_config": {IDS: [1, 10, 20, 28]}}))
    target = _target(tmp_path, "LlamaForCausalLM", 32)
    r = check(folder, parse_engine("vllm==0.33.0"), target=target, across_releases=False)
    assert "fc-width" in _kinds(r) and r.served_layout == (2, 16, 29)
    assert "fc-width" not in _kinds(check(folder, parse_engine("sglang==0.5.23"), target=target,
                                          across_releases=False))


# -- llama.cpp's converted draft: the GGUF decides ----------------------------------------------------


def _gguf(path: Path, meta: dict, version: int = 3, cut: int | None = None) -> Path:
    """A GGUF header as llama.cpp's converter lays it out (magic, version, counts, typed key/values), no
    tensors: what ``check --gguf`` reads. Ints are written as int32 (gguf-py's type for a Python int),
    ``np.uint32``-style values through ``("u32", v)``."""
    def text(s: str) -> bytes:
        raw = s.encode()
        return struct.pack("<Q", len(raw)) + raw

    def typed(v) -> tuple[int, bytes]:
        if isinstance(v, tuple):
            return 4, struct.pack("<I", v[1])
        if isinstance(v, bool):
            return 7, struct.pack("<?", v)
        if isinstance(v, int):
            return 5, struct.pack("<i", v)
        if isinstance(v, float):
            return 6, struct.pack("<f", v)
        if isinstance(v, str):
            return 8, text(v)
        kinds = [typed(x) for x in v]
        inner = kinds[0][0] if kinds else 5
        return 9, struct.pack("<IQ", inner, len(v)) + b"".join(b for _, b in kinds)

    body = b"".join(text(k) + struct.pack("<I", typed(v)[0]) + typed(v)[1] for k, v in meta.items())
    raw = b"GGUF" + struct.pack("<IQQ", version, 7, len(meta)) + body
    path.write_bytes(raw[:cut] if cut is not None else raw)
    return path


DRAFT_META = {"general.architecture": "eagle3", "general.name": "draft", "eagle3.target_hidden_size": H,
              "eagle3.norm_before_residual": False}


def test_the_gguf_reader_reads_every_value_type(tmp_path):
    from helpers.engines.llamacpp.gguf import read_metadata
    meta = {"a.str": "x", "a.i32": -3, "a.u32": ("u32", 7), "a.f32": 0.5, "a.bool": True,
            "a.arr": [1, 15, 28], "a.strs": ["q", "r"], "a.empty": []}
    got = read_metadata(_gguf(tmp_path / "m.gguf", meta, version=2))
    assert got == {"a.str": "x", "a.i32": -3, "a.u32": 7, "a.f32": 0.5, "a.bool": True, "a.arr": [1, 15, 28],
                   "a.strs": ["q", "r"], "a.empty": []}


def test_the_gguf_not_the_config_is_what_llamacpp_serves(tmp_path):
    t = _target(tmp_path, "LlamaForCausalLM", 32)
    d = _draft(tmp_path, "d", top=[1, 15, 28], record=(1, 15, 28))
    eng = parse_engine("llamacpp==b11434")
    same = check(d, eng, target=t, gguf=_gguf(tmp_path / "same.gguf", DRAFT_META | {
        "eagle3.target_layers": [1, 15, 28]}))
    assert same.ok and same.served_layout == (1, 15, 28)
    assert "eagle3.target_layers in same.gguf" in same.served_source
    assert any(n.startswith("gguf:") and "what llamacpp==b11434's converter writes" in n for n in same.notes)
    # converted without the ids (a build that ignored them, or an SGLang-format config): the default
    other = check(d, eng, target=t, gguf=_gguf(tmp_path / "dflt.gguf", DRAFT_META | {
        "eagle3.target_layers": [2, 16, 29]}))
    assert other.served_layout == (2, 16, 29) and "layout-mismatch" in _kinds(other) and not other.ok
    assert any("converted from another config or build" in n for n in other.notes)
    assert check(d, eng, target=t).ok                      # the config alone predicts (1, 15, 28)


def test_check_gguf_command_and_its_bad_input(tmp_path, capsys):
    t = _target(tmp_path, "LlamaForCausalLM", 32)
    d = _draft(tmp_path, "d", top=[1, 15, 28], record=(1, 15, 28))
    good = _gguf(tmp_path / "d.gguf", DRAFT_META | {"eagle3.target_layers": [2, 16, 29]})
    base = ["check", "--draft", str(d), "--target", str(t)]
    assert cli(base + ["--engine", "llamacpp==b11434", "--gguf", str(good)]) == 1
    out = capsys.readouterr().out
    assert "eagle3.target_layers in d.gguf" in out and "(2, 16, 29)" in out
    cases = [(["--engine", "sglang==0.5.23", "--gguf", str(good)], "a GGUF draft is llama.cpp's"),
             (["--engine", "llamacpp", "--gguf", str(tmp_path / "none.gguf")], "cannot read"),
             (["--engine", "llamacpp", "--gguf", str(d / "config.json")], "is not a GGUF file"),
             (["--engine", "llamacpp", "--gguf", str(_gguf(tmp_path / "nokey.gguf", DRAFT_META))],
              "has no eagle3.target_layers"),
             (["--engine", "llamacpp", "--gguf", str(_gguf(tmp_path / "cut.gguf", DRAFT_META | {
                 "eagle3.target_layers": [2, 16, 29]}, cut=60))], "truncated"),
             (["--engine", "llamacpp", "--gguf", str(_gguf(tmp_path / "v9.gguf", DRAFT_META, version=9))],
              "GGUF version 9")]
    for extra, said in cases:
        assert cli(base + extra) == 2, extra
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and said in err[0], (extra, err)


def test_gguf_ids_are_compared_even_where_the_graph_serves_nothing(tmp_path):
    """On a graph without layer inputs (DeepSeek-V3's deepseek2) both layouts are empty: the file's ids
    are still compared with what the converter writes, so a file converted elsewhere is named."""
    t = _target(tmp_path, "DeepseekV3ForCausalLM", 12)
    d = _draft(tmp_path, "d", nested=[2, 6, 9], record=(0, 3, 7))
    eng = parse_engine("llamacpp==b11434")
    default = check(d, eng, target=t, gguf=_gguf(tmp_path / "a.gguf", DRAFT_META | {
        "eagle3.target_layers": [2, 6, 9]}))
    other = check(d, eng, target=t, gguf=_gguf(tmp_path / "b.gguf", DRAFT_META | {
        "eagle3.target_layers": [1, 5, 8]}))
    assert default.served_layout == other.served_layout == ()
    assert any("its default [2, 6, 9]" in n and "what llamacpp==b11434's converter writes" in n
               for n in default.notes)
    assert any("converted from another config or build" in n for n in other.notes)
