"""TensorRT-LLM's rule as read from its own code (helpers/engines/trtllm/rule.py, docs/conventions.md):
the ids come from its launch options only, id k is boundary k + 1, the default is (1, N//2-1, N-4), given
ids are sorted, -1 is the post-norm final state (first one-model, last two-model), and an id at or beyond N
leaves its slot uninitialised. The end-to-end cases run the tiny pair's committed files (the static check
reads only configs, the training record and weight shapes, so no pair is built)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.boundaries import ProblemKind as K
from helpers.engines.trtllm import source as trtllm_source
from helpers.engines.trtllm.options import OPTIONS_FILE, read_options
from helpers.engines.trtllm.rule import EAGLE3, RECORDED, capture, resolve_trtllm
from helpers.errors import BadConfig

REPO = Path(__file__).resolve().parent.parent
PAIRS = REPO / "tests" / "pairs"
TARGET = PAIRS / "tiny-kimi" / "target"              # tiny_default()'s target: DeepSeek-V3, 12 layers
DRAFT_037 = PAIRS / "tiny-kimi" / "draft"             # tiny_default()'s draft, trained on (0, 3, 7)
DRAFT_3710 = PAIRS / "draft-3-7-10-sglang"            # tiny_draft((3, 7, 10))


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "helpers", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def _options(tmp_path: Path, body: str, name: str = "opts.yaml") -> Path:
    path = tmp_path / name
    path.write_text(body, encoding="utf-8")
    return path


def _blocking(r) -> set:
    return {p.kind for p in r.problems if p.blocking}


def test_default_is_one_n_half_n_minus_four_as_boundaries():
    r = resolve_trtllm(None, "DeepseekV3ForCausalLM", 61, None, None)
    assert r.layers_to_capture == [1, 29, 57] and r.served_layout == (2, 30, 58) and not r.errors
    assert any("no launch options given" in w and "(1, N//2-1, N-4)" in w for w in r.warnings)
    assert {ln["file"] for ln in r.source_lines} >= {EAGLE3} and all("line" in ln for ln in r.source_lines)


def test_explicit_ids_are_sorted_layer_outputs():
    r = resolve_trtllm(None, "LlamaForCausalLM", 32, [28, 1, 15], None)
    assert r.layers_to_capture == [1, 15, 28] and r.served_layout == (2, 16, 29) and not r.errors


def test_minus_one_is_post_norm_first_one_model_last_two_model():
    one, two = capture([-1, 5, 2], 12, one_model=True), capture([-1, 5, 2], 12, one_model=False)
    assert one.order == (-1, 2, 5) and one.served == (12, 3, 6)
    assert two.order == (2, 5, -1) and two.served == (3, 6, 12)
    r = resolve_trtllm(None, "LlamaForCausalLM", 12, [2, 5, -1], None)
    post = [p for p in r.problems if p.kind == K.POST_NORM_STATE]
    assert post and not post[0].blocking and "after the norm" in post[0].message and not r.errors


def test_out_of_range_ids_are_a_finding_naming_the_slots():
    r = resolve_trtllm(None, "LlamaForCausalLM", 9, [1, 5, 15], None)
    assert r.served_layout == (2, 6) and _blocking(r) == {K.NEVER_CAPTURED}
    msg = next(p.message for p in r.problems if p.kind == K.NEVER_CAPTURED)
    assert "slot 3 of 3 (id 15)" in msg and "uninitialised" in msg


def test_draft_config_ids_are_ignored_and_said():
    cfg = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 6, 9]}}
    r = resolve_trtllm(None, "DeepseekV3ForCausalLM", 12, None, cfg)
    assert r.served_layout == (2, 6, 9)
    assert any("ignores the draft's config.json ids" in w for w in r.warnings)


def test_options_file_read_and_bad_ones(tmp_path):
    ok = read_options(_options(tmp_path, "speculative_config:\n  decoding_type: Eagle\n  eagle3_one_model: "
                               "false\n  max_draft_len: 3\n  eagle3_layers_to_capture: [9, 2]\n"))
    assert ok.ids == (9, 2) and not ok.one_model and ok.max_draft_len == 3
    as_json = read_options(_options(tmp_path, json.dumps({"speculative_config": {"decoding_type": "Eagle3"}}),
                                    "o.json"))
    assert as_json.ids is None and as_json.one_model
    for body in ("speculative_config: [\n", "max_batch_size: 8\n",
                 "speculative_config:\n  decoding_type: MTP\n",
                 "speculative_config:\n  decoding_type: Eagle3\n  eagle3_layers_to_capture: [a]\n"):
        with pytest.raises(BadConfig):
            read_options(_options(tmp_path, body, "bad.yaml"))


def test_check_with_an_options_file_end_to_end(tmp_path):
    opts = _options(tmp_path, "speculative_config:\n  decoding_type: Eagle3\n  max_draft_len: 3\n"
                              "  eagle3_layers_to_capture: [9, 2, 6]\n")
    proc = _run("check", "--draft", str(DRAFT_037), "--target", str(TARGET), "--engine", "trtllm",
                "--trtllm-options", str(opts), "--json")
    assert proc.returncode == 1, proc.stderr
    rep = json.loads(proc.stdout)
    assert rep["served_layout"] == [3, 7, 10] and rep["training_layout"] == [0, 3, 7]
    assert rep["rule_basis"] == "recorded, not read now"
    far = _options(tmp_path, "speculative_config:\n  decoding_type: Eagle3\n  eagle3_layers_to_capture: "
                             "[2, 6, 15]\n", "far.yaml")
    out = _run("check", "--draft", str(DRAFT_3710), "--target", str(TARGET), "--engine", "trtllm",
               "--trtllm-options", str(far))
    assert out.returncode == 1 and "slot 3 of 3 (id 15)" in out.stdout and "uninitialised" in out.stdout


def test_check_without_options_says_the_default_is_served():
    out = _run("check", "--draft", str(DRAFT_3710), "--target", str(TARGET), "--engine", "trtllm")
    assert out.returncode == 1 and "no launch options given" in out.stdout
    assert "ignores the draft's config.json ids [2, 6, 9]" in out.stdout and "(2, 6, 9)" in out.stdout


def test_bad_options_file_is_bad_input(tmp_path):
    bad = _options(tmp_path, "speculative_config: [\n", "bad.yaml")
    for cmd in (["check", "--draft", str(DRAFT_037), "--target", str(TARGET)],
                ["wiring", "--target", str(TARGET)]):
        out = _run(*cmd, "--engine", "trtllm", "--trtllm-options", str(bad))
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    missing = _run("check", "--draft", str(DRAFT_037), "--target", str(TARGET), "--engine", "trtllm",
                   "--trtllm-options", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2


def test_fixes_deploy_writes_options_whose_check_matches(tmp_path):
    out_dir = tmp_path / "dep"
    dep = _run("fixes", "deploy", "--draft", str(DRAFT_3710), "--target", str(TARGET), "--engine", "trtllm",
               "--out", str(out_dir))
    assert dep.returncode == 0, dep.stdout + dep.stderr
    opts = out_dir / OPTIONS_FILE
    assert read_options(opts).ids == (2, 6, 9)
    steps = json.loads((DRAFT_3710 / "training.json").read_text()).get("ttt_steps")
    assert read_options(opts).max_draft_len == (steps or 3)       # the draft's own depth where it says one
    same = json.loads((DRAFT_3710 / "config.json").read_text())
    assert json.loads((out_dir / "config.json").read_text()) == same      # the draft as it is
    line = next(ln for ln in (dep.stdout + dep.stderr).splitlines() if "check it:" in ln)
    cmd = line.split("check it: python -m helpers ", 1)[1].split()
    assert _run(*cmd).returncode == 0
    zero = _run("fixes", "deploy", "--draft", str(DRAFT_037), "--target", str(TARGET), "--engine", "trtllm",
                "--out", str(tmp_path / "dep0"))
    assert zero.returncode == 1 and "boundary 0 (the embedding output) cannot be expressed" in \
        zero.stdout + zero.stderr and not (tmp_path / "dep0").exists()


def test_the_wheel_is_read_where_it_can_be(tmp_path):
    """Where a release's eagle3.py is at hand, the recorded facts are looked for in it and cited by line; a
    release whose file lacks them disagrees, and says so (text made up here, not TensorRT-LLM's)."""
    agrees = ("x = 0\nself.layers_to_capture = (1, self.num_layers // 2 - 1,\n    self.num_layers - 4)\n"
              "self.layers_to_capture = sorted(list(self.layers_to_capture))\n"
              "if self.layers_to_capture[0] == -1:\n")
    read = trtllm_source.read_text("9.9.9", agrees)
    assert {ln["fact"]: ln["line"] for ln in read.lines} == {"default": 2, "sort": 4, "minus_one_last": 5}
    assert [p.kind for p in read.problems] == [K.SOURCE_CHECKED]
    r = resolve_trtllm("9.9.9", "LlamaForCausalLM", 61, None, None, read=read)
    assert r.served_layout == (2, 30, 58) and r.source_lines == read.lines
    other = trtllm_source.read_text("9.9.9", "self.layers_to_capture = (2, self.num_layers // 2)\n")
    assert other.problems[0].kind == K.SOURCE_DISAGREES and "disagrees with the release" in \
        other.problems[0].message
    assert RECORDED["default_two_model"]["line"] and RECORDED["sort_one_model"]["line"]


def test_a_stub_wheel_is_source_unavailable_and_a_real_one_is_read(tmp_path):
    """The index here carries a stub of tensorrt-llm: a cached release without eagle3.py is not a source."""
    from helpers.rules.wheels import COMPLETE_MARKER, PackageSourceError

    stub = tmp_path / "cache" / "9.9.8"
    stub.mkdir(parents=True)
    (stub / COMPLETE_MARKER).write_text("")
    with pytest.raises(PackageSourceError, match="stub"):
        trtllm_source.read_release("9.9.8", cache=tmp_path / "cache")
    real = tmp_path / "cache" / "9.9.9"
    (real / EAGLE3).parent.mkdir(parents=True)
    (real / EAGLE3).write_text("layers_to_capture = (1, self.num_layers // 2 - 1, self.num_layers - 4)\n"
                               "layers_to_capture = sorted(list(self.layers_to_capture))\n"
                               "if layers_to_capture[0] == -1:\n")
    (real / COMPLETE_MARKER).write_text("")
    read = trtllm_source.read_release("9.9.9", cache=tmp_path / "cache")
    assert [p.kind for p in read.problems] == [K.SOURCE_CHECKED] and len(read.lines) == 3


def test_max_draft_len_is_the_drafts_own(tmp_path):
    """A speculators config's speculative_tokens, else the record's ttt_steps, else 3; the file says which."""
    from helpers.engines.trtllm.options import options_text

    d = tmp_path / "d"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"speculators_config": {"proposal_methods": [
        {"proposal_type": "greedy", "speculative_tokens": 5}]}}))
    text = options_text([1, 5, 8], d)
    assert "max_draft_len: 5" in text and "speculators_config" in text
    (d / "config.json").write_text("{}")
    (d / "training.json").write_text(json.dumps({"training_boundaries": [2, 6, 9], "ttt_steps": 4}))
    assert "max_draft_len: 4" in options_text([1, 5, 8], d)
    (d / "training.json").unlink()
    text = options_text([1, 5, 8], d)
    assert "max_draft_len: 3" in text and "names no depth" in text
