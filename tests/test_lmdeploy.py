"""LMDeploy as an engine family: its rule read from the release's own config builders (its wheel, by ranges),
per target class; check and wiring on the tiny pairs; the recorded rule where the files cannot be read."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _pairs import tiny_default, tiny_llama

from helpers.boundaries import ProblemKind
from helpers.engines.lmdeploy import rule, source
from helpers.errors import BadOption
from helpers.rules.conventions import parse_engine

REPO = Path(__file__).resolve().parent.parent
VERSION = "0.18.0"


@pytest.fixture(scope="module")
def release() -> source.LmdeployRelease:
    try:
        return source.read_release(VERSION)
    except Exception as exc:      # an air-gapped host: the recorded rule is tested below
        pytest.skip(f"package index unreachable, cannot read lmdeploy {VERSION}'s files: {exc}")


@pytest.mark.parametrize("arch,n,model_type,served", [
    ("LlamaForCausalLM", 32, None, (2, 16, 29)),
    ("LlamaForCausalLM", 80, None, (2, 40, 77)),
    ("DeepseekV3ForCausalLM", 61, "kimi_k2", (2, 30, 58)),
    ("KimiK25ForConditionalGeneration", 61, "kimi_k25", (2, 30, 58)),
])
def test_served_read_from_the_release(release, arch, n, model_type, served):
    tc = {"model_type": model_type} if model_type else None
    cfg = {"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 3, 7]}}
    r = rule.resolve_lmdeploy(VERSION, arch, n, None, cfg, target_config=tc, release=release)
    assert r.served_layout == served and not r.errors
    assert ProblemKind.IDS_IGNORED in {p.kind for p in r.problems}
    files = {f"{s['file']}:{s['line']}" for s in r.source_lines}
    expected = rule.RECORDED_CAPTURE[arch if arch == "LlamaForCausalLM" else model_type]
    assert expected in files       # the recorded table names the line the release holds


def test_plain_deepseek_v3_is_refused(release):
    r = rule.resolve_lmdeploy(VERSION, "DeepseekV3ForCausalLM", 61, None, None,
                              target_config={"model_type": "deepseek_v3"}, release=release)
    assert r.served_layout == () and "cannot serve this draft at all" in r.errors[0]
    assert rule.RECORDED_REFUSES["deepseek_v3"] in r.errors[0]


def test_qwen3_is_fed_nothing(release):
    r = rule.resolve_lmdeploy(VERSION, "Qwen3ForCausalLM", 36, None, None,
                              target_config={"model_type": "qwen3"}, release=release)
    assert r.served_layout == () and "feeds the draft nothing" in r.errors[0]
    assert rule.RECORDED_IDS_ONLY_FOR in r.errors[0]


def test_turbomind_ignores_the_speculative_config(release):
    r = rule.resolve_lmdeploy(VERSION, "LlamaForCausalLM", 32, None, None, backend="turbomind",
                              release=release)
    assert r.served_layout == () and "ignores the speculative config" in r.errors[0]
    assert rule.RECORDED_TURBOMIND in r.errors[0]
    assert parse_engine("lmdeploy==0.18.0:turbomind").runner == "turbomind"
    with pytest.raises(BadOption, match="LMDeploy has no model runner"):
        parse_engine("lmdeploy==0.18.0:v1")


@pytest.mark.parametrize("arch,model_type,served", [
    ("LlamaForCausalLM", None, (2, 16, 29)), ("DeepseekV3ForCausalLM", "kimi_k2", (2, 16, 29)),
    ("DeepseekV3ForCausalLM", "deepseek_v3", ()), ("Qwen3ForCausalLM", "qwen3", ())])
def test_recorded_rule_says_so(arch, model_type, served):
    r = rule.recorded_lmdeploy(VERSION, arch, 32, None, None, model_type, "pytorch", "offline")
    assert r.served_layout == served
    assert any(p.kind == ProblemKind.RULE_NOT_RUN and "recorded, not read now" in p.message
               for p in r.problems)


def _check(draft: Path, target: Path) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "helpers", "check", "--draft", str(draft), "--target",
                           str(target), "--engine", f"lmdeploy=={VERSION}"], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    return proc.returncode, proc.stdout


def test_check_on_the_tiny_pairs(release, tmp_path):
    kimi = tiny_default()
    code, out = _check(kimi / "draft", kimi / "target")          # DeepSeek-V3: refused at load
    assert code == 1 and "BLOCKED" in out.splitlines()[3], out
    k2 = tmp_path / "k2"
    shutil.copytree(kimi / "target", k2)
    cfg = json.loads((k2 / "config.json").read_text())
    (k2 / "config.json").write_text(json.dumps(cfg | {"model_type": "kimi_k2"}))
    code, out = _check(kimi / "draft", k2)
    assert code == 1 and "served     : (2, 6, 9)" in out and "MISMATCH" in out, out
    assert out.splitlines()[0].startswith(f"check  {kimi / 'draft'}  on  lmdeploy=={VERSION}")
    llama = tiny_llama()
    code, out = _check(llama / "draft", llama / "target")
    assert code == 1 and "served     : (2, 4, 5)" in out, out
