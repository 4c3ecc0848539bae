"""llama.cpp as a live engine: its own converter, its guard before the launch, and ``llama-server`` itself.

The parts that need no binary run everywhere: the two launches' settings, the guard's verdicts and its
fail-closed refusal, the converter's cache. Where this machine has built ``llama-server`` (``bash
workbook.sh llamacpp``), the committed Llama pair (``data/tiny-llama``, built by ``build-default --family
llama``) is converted with llama.cpp's own converter and served: the GGUF's ``eagle3.target_layers`` are
what ``check`` predicts, the greedy output is the fp32 target's, and the accept length llama.cpp counts
for each converted draft is the reference engine's for the layout the file names, which measures
llama.cpp's rule (top-level ids only, used as boundaries) live.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers.__main__ import main as cli
from helpers.live import guard
from helpers.live.llamacpp import convert as lc
from helpers.live.llamacpp.build import find_server
from helpers.live.llamacpp.engine import ServerLaunch
from helpers.live.settings import argv_settings, side_by_side
from helpers.rules.conventions import parse_engine

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "data" / "tiny-llama"
KIMI = ROOT / "data" / "tiny-kimi"
ENGINE = parse_engine("llamacpp==b11434")


def test_baseline_and_speculative_launches_share_every_setting_but_the_draft():
    base = ServerLaunch(Path("/m/target.gguf"), None, steps=4, threads=2, ctx_size=512)
    spec = ServerLaunch(Path("/m/target.gguf"), Path("/m/draft.gguf"), steps=4, threads=2, ctx_size=512)
    a = argv_settings(base.argv(Path("/bin/llama-server"), 1000)[1:])
    b = argv_settings(spec.argv(Path("/bin/llama-server"), 1001)[1:])
    sbs = side_by_side(a, b)
    assert sbs.equal, sbs.differ
    assert b["--spec-type"] == "draft-eagle3" and b["--spec-draft-n-max"] == "4"
    assert b["--spec-draft-p-min"] == "0"          # a fixed-length chain, as the reference engine drafts
    assert a["--parallel"] == b["--parallel"] == "1"
    # a thread count that differs is caught
    other = ServerLaunch(Path("/m/target.gguf"), Path("/m/draft.gguf"), steps=4, threads=1, ctx_size=512)
    c = argv_settings(other.argv(Path("/bin/llama-server"), 1002)[1:])
    assert "--threads" in side_by_side(a, c).differ


def _verdicts():
    seen = []
    return seen, seen.append


def test_guard_before_llamacpp_refuses_a_gguf_that_serves_another_layout(capsys):
    seen, report = _verdicts()
    # the embedded DeepSeek pair's draft was trained on (0, 3, 7); llama.cpp's default ids [2, 6, 9]
    with pytest.raises(guard.GuardRefused) as exc:
        guard.before_llamacpp(engine=ENGINE, draft=KIMI / "draft", target_layers=[2, 6, 9], num_layers=12,
                              arch="DeepseekV3ForCausalLM", gguf="draft.gguf", how=guard.Mode.REFUSE,
                              report=report)
    assert seen[-1]["kind"] == "miswired" and seen[-1]["refused"]
    assert "(2, 6, 9)" in str(exc.value) and "(0, 3, 7)" in str(exc.value)
    assert "convert again" in seen[-1]["fix"] and "[0, 3, 7]" in seen[-1]["fix"]
    # warn: the same verdict, and the launch goes on
    v = guard.before_llamacpp(engine=ENGINE, draft=KIMI / "draft", target_layers=[0, 3, 7], num_layers=12,
                              arch="DeepseekV3ForCausalLM", gguf="draft.gguf", how=guard.Mode.WARN,
                              report=report)
    assert v.kind == guard.Kind.MATCH and not seen[-1]["refused"]


def test_guard_before_llamacpp_fails_closed_when_it_cannot_judge(tmp_path):
    broken = tmp_path / "draft"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    seen, report = _verdicts()
    with pytest.raises(guard.GuardRefused) as exc:
        guard.before_llamacpp(engine=ENGINE, draft=broken, target_layers=[2, 6, 9], num_layers=12,
                              arch="LlamaForCausalLM", gguf="d.gguf", how=guard.Mode.REFUSE, report=report)
    assert "refusing to serve unjudged" in str(exc.value) and len(str(exc.value).splitlines()) == 1
    assert seen[-1]["kind"] == "unjudged"
    assert guard.before_llamacpp(engine=ENGINE, draft=broken, target_layers=[2, 6, 9], num_layers=12,
                                 arch="LlamaForCausalLM", gguf="d.gguf", how=guard.Mode.WARN) is None


def test_converter_cache_is_complete_or_absent(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_WORKBOOK_CACHE", str(tmp_path / "cache"))
    tree = tmp_path / "tree"
    (tree / "conversion").mkdir(parents=True)
    (tree / "gguf-py" / "gguf").mkdir(parents=True)
    (tree / "convert_hf_to_gguf.py").write_text("print('stand-in')\n")
    assert lc.find_converter() is None
    with pytest.raises(Exception, match="no conversion"):
        shutil.rmtree(tree / "conversion")
        lc.install_converter(tree)
    assert lc.find_converter() is None          # a failed install leaves nothing that looks complete
    (tree / "conversion").mkdir()
    got = lc.install_converter(tree)
    assert lc.find_converter() == got and (got / "gguf-py" / "gguf").is_dir()


# ------------------------------------------------------------------------------------ the real engine

SERVER = find_server()
needs_server = pytest.mark.skipif(SERVER is None, reason="llama-server is not built here "
                                                         "(bash workbook.sh llamacpp)")
needs_pair = pytest.mark.skipif(not (PAIR / "build.json").is_file(), reason="data/tiny-llama is not built")


@needs_pair
def test_llamas_converter_takes_the_pair_and_writes_its_default_for_nested_ids():
    """The committed draft is SGLang-format (nested ids only): the converter writes [2, 6, 9], and check
    --gguf reads that file as llama.cpp's served layout, a mismatch with the trained (3, 7, 10)."""
    target = lc.convert(PAIR / "target", log=lambda *_: None)
    assert target.architecture == "llama"
    draft = lc.convert(PAIR / "draft", target_dir=PAIR / "target", log=lambda *_: None)
    assert draft.architecture == "eagle3" and draft.target_layers == (2, 6, 9)
    trained = tuple(json.loads((PAIR / "draft" / "training.json").read_text())["training_boundaries"])
    assert trained == (3, 7, 10)
    assert cli(["check", "--draft", str(PAIR / "draft"), "--target", str(PAIR / "target"), "--engine",
                "llamacpp==b11434", "--gguf", str(draft.gguf)]) == 1
    # the config alone predicts the same: check without the file
    assert cli(["check", "--draft", str(PAIR / "draft"), "--target", str(PAIR / "target"), "--engine",
                "llamacpp==b11434"]) == 1
