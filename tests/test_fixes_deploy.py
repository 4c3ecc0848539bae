"""``fixes deploy``: one copy every engine named serves at the trained layout, proven by their own rules
before it is written; the ids translated by each engine's rule, never copied; nothing written otherwise."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from helpers.__main__ import main as cli
from helpers.investigation.fixes import deploy
from helpers.investigation.gate import check
from helpers.model.checkpoint import canonical_state, load_draft, read_draft_weights, save_draft
from helpers.rules.conventions import parse_engine

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "data" / "tiny-llama"
ENGINES = ["sglang==0.5.23", "vllm==0.34.0", "llamacpp==b11434"]


def _digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.is_file()}


def _state(folder: Path) -> dict:
    raw, source = read_draft_weights(folder)
    return canonical_state(raw, source)


@pytest.fixture(scope="module")
def speculators_draft(tmp_path_factory) -> Path:
    """The committed Llama draft (trained on (0, 3, 7)) as speculators publishes one: top-level ids that
    are its boundaries, weights under layers.0.*, the trainer's record beside it."""
    from helpers.model.target import load_target

    out = tmp_path_factory.mktemp("speculators") / "draft"
    target = load_target(PAIR / "target")[0]
    d = load_draft(PAIR / "draft", target=target)
    d.cfg.eagle_ids = [0, 3, 7]
    save_draft(d, out, "speculators")
    shutil.copy(PAIR / "draft" / "training.json", out / "training.json")
    return out


def test_one_copy_serves_sglang_vllm_and_llamacpp_each_by_its_own_ids(tmp_path, capsys):
    before = _digest(PAIR / "draft")
    out = tmp_path / "deployed"
    rc = cli(["fixes", "deploy", "--draft", str(PAIR / "draft"), "--target", str(PAIR / "target"),
              "--out", str(out), *sum((["--engine", e] for e in ENGINES), [])])
    text = capsys.readouterr().err
    assert rc == 0, text
    assert "one copy every engine named serves" in text
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 2, 6]   # SGLang adds one
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [0, 3, 7]       # vLLM, llama.cpp: boundaries
    for e in ENGINES:          # the user's own check on the result agrees
        report = check(out, parse_engine(e), target=PAIR / "target", across_releases=False)
        assert report.ok, (e, report.verdict)
    rec = json.loads((out / "training.json").read_text())
    assert rec["training_boundaries"] == [0, 3, 7] and rec["deployed_from"] == str(PAIR / "draft")
    assert set(rec["deployed_for"]) == set(ENGINES)
    assert "captured_boundaries" in rec                 # the trainer's provenance travels with the copy
    assert _digest(PAIR / "draft") == before
    assert (out / "model.safetensors").read_bytes() == (PAIR / "draft" / "model.safetensors").read_bytes()


def test_a_speculators_draft_is_converted_for_sglang_with_its_ids_translated(speculators_draft, tmp_path):
    """The issue's trap: the top-level ids copied under eagle_config are served one layer late by SGLang."""
    d = deploy(speculators_draft, tmp_path / "out", [parse_engine(e) for e in ENGINES],
               target=PAIR / "target")
    assert d.ok and d.shared and d.converted and d.fmt == "sglang", d.to_dict()
    cfg = json.loads((d.out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [-1, 2, 6]
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [0, 3, 7]
    raw, _ = read_draft_weights(d.out)
    assert any(k.startswith("midlayer.") for k in raw) and not any(k.startswith("layers.0.") for k in raw)
    a, b = _state(speculators_draft), _state(d.out)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for e in ENGINES:
        assert check(d.out, parse_engine(e), target=PAIR / "target", across_releases=False).ok


def test_check_and_its_advice_name_the_command_not_a_copy_of_the_ids(speculators_draft):
    report = check(speculators_draft, parse_engine("sglang==0.5.23"), target=PAIR / "target",
                   across_releases=False)
    fixes = {p.kind: p.fix for p in report.problems}
    assert "fixes deploy --draft" in fixes["layout-mismatch"]
    assert "move them into" not in fixes["ids-key"] and "numbering" in fixes["ids-key"]
    assert "save_draft" not in fixes["speculators-format"]


def test_releases_that_need_different_ids_get_one_copy_each(tmp_path):
    """SGLang changed DeepSeek's rule in 0.5.13: 0.5.12 and 0.5.23 read the same key differently."""
    kimi = ROOT / "data" / "tiny-kimi"
    engines = [parse_engine(e) for e in ("sglang==0.5.12", "sglang==0.5.23", "vllm==0.34.0")]
    d = deploy(kimi / "draft", tmp_path / "out", engines, target=kimi / "target", layout=(3, 7, 10))
    assert d.ok and not d.shared, d.to_dict()
    ids = {f.engine: (f.key, f.ids) for f in d.fixes}
    assert ids["sglang==0.5.12"] == ("eagle_config", (2, 6, 9))
    assert ids["sglang==0.5.23"] == ("eagle_config", (3, 7, 10))
    assert ids["vllm==0.34.0"] == ("top-level", (3, 7, 10))
    for f, e in zip(d.fixes, engines):
        assert f.folder.parent == d.out
        assert check(f.folder, e, target=kimi / "target", across_releases=False).ok
        assert json.loads((f.folder / "training.json").read_text())["training_boundaries"] == [3, 7, 10]


def test_an_engine_no_ids_can_serve_writes_nothing_and_names_the_way_out(tmp_path, capsys):
    kimi = ROOT / "data" / "tiny-kimi"
    out = tmp_path / "out"
    rc = cli(["fixes", "deploy", "--draft", str(kimi / "draft"), "--target", str(kimi / "target"), "--out",
              str(out), "--engine", "sglang==0.5.9", "--engine", "sglang==0.5.23", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert rc == 1 and d["exit_code"] == 1 and not d["ok"]
    assert not out.exists() and not list(tmp_path.glob(".out-*"))
    blocked = next(e for e in d["engines"] if e["engine"] == "sglang==0.5.9")
    assert blocked["ids"] is None and "patch-sglang apply --version 0.5.9" in blocked["verdict"]


def test_a_non_ascending_layout_is_permuted_into_the_fc(tmp_path):
    d = deploy(PAIR / "draft", tmp_path / "out", [parse_engine("vllm==0.34.0")], target=PAIR / "target",
               layout=(7, 0, 3))
    assert d.ok and d.reordered
    rec = json.loads((d.out / "training.json").read_text())
    assert rec["training_boundaries"] == [0, 3, 7]
    assert rec["fc_reordered"] == {"from": [7, 0, 3], "to": [0, 3, 7]}
    old, new = _state(PAIR / "draft")["fc.weight"], _state(d.out)["fc.weight"]
    h = old.shape[1] // 3
    assert torch.equal(new[:, :h], old[:, h:2 * h]) and torch.equal(new[:, 2 * h:], old[:, :h])


@pytest.mark.parametrize("occupied, argv, expect", [
    (True, ["--engine", "vllm==0.34.0"], "exists and is not empty"),
    (False, ["--engine", "vllm==0.34.0", "--layout", "0,3,99"], "past the target's last"),
    (False, ["--engine", "vllm==0.34.0", "--layout", "0,3"], "fc takes 3"),
    (False, ["--engine", "nosuch==1"], "nosuch"),
])
def test_bad_input_is_one_line_exit_2_and_changes_nothing(tmp_path, capsys, occupied, argv, expect):
    out = tmp_path / "out"
    out.mkdir()
    if occupied:
        (out / "keep.txt").write_text("mine")
    rc = cli(["fixes", "deploy", "--draft", str(PAIR / "draft"), "--target", str(PAIR / "target"),
              "--out", str(out), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and expect in err and len(err.strip().splitlines()) == 1, err
    assert [p.name for p in out.iterdir()] == (["keep.txt"] if occupied else [])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_llamacpps_own_converter_writes_the_trained_layout_from_the_copy(tmp_path):
    from helpers.engines.llamacpp import convert as lc

    if lc.find_converter() is None:
        pytest.skip("llama.cpp's converter is not installed here (bash workbook.sh llamacpp)")
    d = deploy(PAIR / "draft", tmp_path / "out", [parse_engine("llamacpp==b11434")], target=PAIR / "target")
    assert d.ok
    got = lc.convert(d.out, target_dir=PAIR / "target", log=lambda *_: None)
    assert got.target_layers == (0, 3, 7)
