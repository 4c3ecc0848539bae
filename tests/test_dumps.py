"""Dumps in each trainer's layout, and the draft diagnosed from them without a target forward."""
from __future__ import annotations

import functools
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _pairs import assert_in_front, tiny_default, tiny_dump
from conftest import scaled
from safetensors.torch import save_file

from helpers.rules.conventions import parse_engine

REPO = Path(__file__).resolve().parent.parent
BOUNDS = (0, 3, 7, 10, 12)          # the trained (0, 3, 7) and the served (3, 7, 10) are both inside


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "helpers", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=scaled(600))


def tree_hash(path: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(p for p in Path(path).rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def diagnosis(fmt: str, run_target: str = "auto") -> dict:
    base = tiny_default()
    r = cli("diagnose", "--draft", base / "draft", "--data", tiny_dump(fmt), "--target", base / "target",
            "--run-target", run_target, "--engine", "sglang==0.5.9", "--json")    # the case: (b3, b7, b10)
    assert r.returncode in (0, 1, 3), r.stderr     # the one convention: OK, a problem, undecided
    out = json.loads(r.stdout)
    assert out.get("exit_code", r.returncode) == r.returncode
    return out


# --------------------------------------------------------------------------------------
# formats


@pytest.mark.parametrize("fmt", ["speculators", "speculators-legacy", "specforge"])
def test_write_then_read_each_format(fmt):
    from helpers.investigation.dumps import open_dump
    from helpers.model.target import load_target

    dump = open_dump(tiny_dump(fmt))
    assert dump.format == fmt
    aux = BOUNDS[:-1] if fmt == "specforge" else BOUNDS
    assert dump.num_slots == len(aux) and len(dump.files) == 6
    recs = list(dump.records())
    assert all(r.tokens == 128 for r in recs)
    target, _ = load_target(tiny_default() / "target")
    ids = recs[0].token_ids[None]
    emb = target.get_input_embeddings()(ids)[0]
    # boundary 0 is the embedding, exactly
    assert torch.equal(recs[0].slots[:, 0], emb.to(recs[0].slots.dtype))
    if fmt == "speculators-legacy":
        cfg = json.loads((dump.root / "data_config.json").read_text())
        assert cfg["hidden_states"]["layer_ids"] == [b - 1 for b in BOUNDS]   # output-of-layer ids
        assert dump.recorded_boundaries == BOUNDS
    if fmt == "specforge":
        assert recs[0].final_normed is not None and dump.trained_slots == (0, 1, 2, 3)
        raw = torch.load(dump.files[0], weights_only=True)
        assert tuple(raw["aux_hidden_state"].shape) == (1, 128, 4 * dump.hidden)
        assert tuple(raw["hidden_state"].shape) == (1, 128, dump.hidden)
    if fmt == "speculators":
        assert dump.recorded_boundaries is None and dump.final_slot_by_format == len(BOUNDS) - 1


def test_max_records_and_tokens_bound_the_stream():
    from helpers.investigation.dumps import open_dump

    dump = open_dump(tiny_dump("speculators"))
    assert len(list(dump.records(max_records=2))) == 2
    assert sum(r.tokens for r in dump.records(max_tokens=200)) == 200


# --------------------------------------------------------------------------------------
# the diagnosis


@pytest.mark.parametrize("fmt", ["speculators", "speculators-legacy", "specforge"])
def test_diagnose_names_training_layout_and_served_far_below(fmt):
    out = diagnosis(fmt)
    assert out["data_format"] == fmt and out["records"] == 6 and out["tokens"] > 500
    assert out["slot_boundaries"][:4] == [0, 3, 7, 10]
    # the dump's ranking and confidence set are in slots: (0, 3, 7) is slots (0, 1, 2) of this dump
    assert out["trained_slots"] == [0, 1, 2] and out["trained_layout"] == [0, 3, 7]
    assert_in_front((0, 1, 2), out["best_slots"], out["confident_set"], [r["slots"] for r in out["ranking"]])
    assert out["best_layout"] == [out["slot_boundaries"][s] for s in out["best_slots"]]
    assert out["served_layout"] == [3, 7, 10] and out["served_slots"] == [1, 2, 3]
    assert out["served_acc"] < out["best_acc"] - 0.1
    assert out["mismatch"] is True and out["exit_code"] == 1
    assert out["verdict"].startswith("MISMATCH: served (3, 7, 10) ≠ trained (0, 3, 7)")
    assert out["significant"] is True and out["cost"]["difference"] > 0.1
    assert out["labels"].startswith("target distribution")
    for key in ("data_format", "records", "tokens", "slot_boundaries", "best_slots", "best_layout",
                "best_acc", "trained_acc", "served_layout", "served_acc", "ranking", "confident_set", "cost",
                "significant", "ranked_by", "best_accept_length"):
        assert key in out


def test_formats_agree_with_each_other_and_the_capture_path():
    from helpers.investigation.dumps import open_dump
    from helpers.investigation.evaluate import attach_draft_probs, capture_text
    from helpers.investigation.pair import load_pair

    outs = {f: diagnosis(f) for f in ("speculators", "speculators-legacy", "specforge")}
    for key in ("best_acc", "served_acc"):
        vals = [o[key] for o in outs.values()]
        assert max(vals) - min(vals) <= 0.01, (key, vals)
    pair = load_pair(tiny_default() / "target", tiny_default() / "draft")
    windows = torch.stack([r.token_ids for r in open_dump(tiny_dump("speculators")).records()])
    caps = capture_text(pair.target, windows)
    attach_draft_probs(pair.target, caps, pair.draft.draft_token_ids)
    from helpers.investigation.evaluate import evaluate_layout

    for key, lay in (("best_acc", (0, 3, 7)), ("served_acc", (3, 7, 10))):
        direct = evaluate_layout(pair.draft, caps, lay, 3).acc0
        assert abs(direct - outs["speculators"][key]) <= 0.01, (key, direct, outs["speculators"][key])


def test_slots_named_from_the_heads_alone():
    """Without running the target: boundary 0 by equality with the embedding, the last speculators
    slot by the format, the SpecForge final by its post-norm copy; the rest stay unknown."""
    spec = diagnosis("speculators", "no")
    assert spec["slot_boundaries"] == [0, None, None, None, 12]
    assert "embed_tokens" in spec["slot_sources"][0] and spec["slot_sources"][4].startswith("format")
    assert any("stayed unknown" in n for n in spec["notes"])
    assert spec["best_slots"] == [0, 1, 2] and spec["served_acc"] is None and spec["best_layout"] is None
    sf = diagnosis("specforge", "no")
    assert sf["slot_boundaries"] == [0, None, None, None]
    legacy = diagnosis("speculators-legacy", "no")
    assert legacy["slot_boundaries"] == list(BOUNDS) and legacy["served_acc"] is not None


def test_stated_slot_boundaries_and_next_token_labels(tmp_path):
    """A config-only target: the served layout still resolves, labels are the dump's next tokens."""
    from helpers.investigation.dump_diagnose import diagnose_dump
    from helpers.investigation.dumps import open_dump
    from helpers.investigation.pair import load_pair

    pair = load_pair(tiny_default() / "target", tiny_default() / "draft")
    d = diagnose_dump(pair.draft, open_dump(tiny_dump("speculators")), stated=list(BOUNDS),
                      engine=parse_engine("sglang==0.5.9"), draft_config=pair.draft_config, arch=pair.arch,
                      num_layers=12, progress=False)
    assert d.labels == "the dump's next tokens" and d.slots[1].how == "stated"
    assert d.served_slots == (1, 2, 3)
    # next tokens are a noisier label than the target's own distribution: the trained layout is among the
    # best, and the served one is still told apart from them
    assert (0, 1, 2) in d.confident_set and d.mismatch is True


def test_served_within_noise_is_still_a_mismatch(tmp_path):
    """Neighbouring boundaries that are nearly interchangeable: the paired test cannot tell the served
    layout from the trained one, and the verdict still says they differ, what that costs (within
    noise) and the fix. tests/test_ranking.py holds the same case end to end."""
    from helpers.investigation.dump_diagnose import diagnose_dump
    from helpers.investigation.dumps import open_dump
    from helpers.investigation.pair import load_pair

    src = open_dump(tiny_dump("speculators"))
    out = tmp_path / "near"
    out.mkdir()
    g = torch.Generator().manual_seed(0)
    for i, rec in enumerate(src.records()):
        s = rec.slots.float()
        twin = s[:, 2] * (1 + 1e-4 * torch.randn(s[:, 2].shape, generator=g))     # a near-copy of boundary 7
        hs = torch.cat([s[:, :3], twin[:, None], s[:, 3:]], 1).to(torch.bfloat16)
        save_file({"hidden_states": hs.contiguous(), "token_ids": rec.token_ids},
                  str(out / f"hs_{i}.safetensors"))
    pair = load_pair(tiny_default() / "target", tiny_default() / "draft")
    cfg = {**pair.draft_config, "eagle_aux_hidden_state_layer_ids": [0, 3, 8]}
    cfg.pop("eagle_config", None)
    # resolved as a Llama target: vLLM's Llama capture serves boundary 0, while its DeepSeek capture adds a
    # residual that is still None there (docs/conventions.md), which is not what this test is about
    d = diagnose_dump(pair.draft, open_dump(out), stated=[0, 3, 7, 8, 10, 12], engine=parse_engine("vllm"),
                      draft_config=cfg, arch="LlamaForCausalLM", num_layers=12, progress=False,
                      recorded=pair.recorded_layout)
    assert d.served_layout == (0, 3, 8) and d.served_slots == (0, 1, 3)
    assert len(d.confident_set) >= 2 and d.served_slots in d.confident_set
    assert d.mismatch is True and d.wiring.significant is False and "consistent" not in d.verdict
    assert d.verdict.startswith("MISMATCH, NEGLIGIBLE COST: served (0, 3, 8) ≠ trained (0, 3, 7) (training "
                                "record)")


# --------------------------------------------------------------------------------------
# bad dumps: one line naming the file, nothing written


def _copy_speculators(tmp_path: Path, n: int = 3) -> Path:
    import shutil

    out = tmp_path / "dump"
    out.mkdir()
    for f in open_files(n):
        shutil.copy(f, out / f.name)
    return out


def open_files(n: int) -> list[Path]:
    from helpers.investigation.dumps import open_dump

    return open_dump(tiny_dump("speculators")).files[:n]


def _bad_mixed_width(d: Path) -> str:
    save_file({"hidden_states": torch.zeros(16, 5, 32, dtype=torch.bfloat16), "token_ids": torch.arange(16)},
              str(d / "hs_1.safetensors"))
    return "hs_1.safetensors"


def _bad_nan(d: Path) -> str:
    t = torch.zeros(16, 5, 64, dtype=torch.bfloat16)
    t[3, 2, 5] = float("nan")
    save_file({"hidden_states": t, "token_ids": torch.arange(16)}, str(d / "hs_2.safetensors"))
    return "hs_2.safetensors"


def _bad_truncated(d: Path) -> str:
    f = d / "hs_1.safetensors"
    f.write_bytes(f.read_bytes()[:1000])
    return "hs_1.safetensors"


def _bad_unknown(d: Path) -> str:
    for f in d.iterdir():
        f.rename(f.with_suffix(".npy"))
    return "not a hidden-state dump"


def _bad_too_few_slots(d: Path) -> str:
    for f in d.iterdir():
        f.unlink()
    save_file({"hidden_states": torch.zeros(16, 2, 64, dtype=torch.bfloat16), "token_ids": torch.arange(16)},
              str(d / "hs_0.safetensors"))
    return "2 slot(s)"


def _bad_legacy_truncated(d: Path) -> str:
    for f in d.iterdir():
        f.unlink()
    torch.save({"input_ids": torch.arange(16), "hidden_states": [torch.zeros(16, 64)] * 4}, d / "data_0.pt")
    raw = (d / "data_0.pt").read_bytes()
    (d / "data_0.pt").write_bytes(raw[: len(raw) // 2])
    return "data_0.pt"


@pytest.mark.parametrize("breaker", [_bad_mixed_width, _bad_nan, _bad_truncated, _bad_unknown,
                                     _bad_too_few_slots, _bad_legacy_truncated])
def test_bad_dumps_fail_in_one_line_and_write_nothing(tmp_path, breaker):
    d = _copy_speculators(tmp_path)
    expect = breaker(d)
    before = tree_hash(tmp_path)
    base = tiny_default()
    r = cli("diagnose", "--draft", base / "draft", "--data", d, "--target", base / "target", "--run-target",
            "no", "--json")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [l for l in r.stderr.splitlines() if l.strip() and "it/s" not in l and "record/s" not in l]
    assert len(lines) == 1 and lines[0].startswith("error: ") and expect in lines[0], r.stderr
    # with --json the error is a JSON document on stdout too, the same line
    assert json.loads(r.stdout) == {"error": lines[0][len("error: "):], "exit_code": 2}
    assert tree_hash(tmp_path) == before


def test_dump_cli_refuses_a_nonempty_out_and_bad_boundaries(tmp_path):
    base = tiny_default()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    before = tree_hash(tmp_path)
    r = cli("dump", "--target", base / "target", "--boundaries", "0,3,7,12", "--format", "speculators",
            "--out", tmp_path / "full")
    assert r.returncode == 2 and "not an empty folder" in r.stderr
    r = cli("dump", "--target", base / "target", "--boundaries", "7,3,12", "--format", "speculators",
            "--out", tmp_path / "new")
    assert r.returncode == 2 and "ascending" in r.stderr
    r = cli("dump", "--target", base / "target", "--boundaries", "0,3,7", "--format", "specforge",
            "--out", tmp_path / "new")
    assert r.returncode == 2 and "final state" in r.stderr
    assert tree_hash(tmp_path) == before and not (tmp_path / "new").exists()


def test_scale_check_runs_small():
    """The Kimi-width cost check, at a width that runs in seconds: it measures, it does not assert speed."""
    from helpers.investigation.scale import scale_check

    out = scale_check(hidden=128, vocab=500, intermediate=256, tokens=32, records=1)
    assert out["layouts"] == 24 and out["tokens"] == 32 and out["peak_rss_bytes"] > out["baseline_rss_bytes"]
    assert out["draft_params"] > 0 and out["s_per_1000_tokens_per_layout"] > 0
