"""The reference engine: greedy equivalence, losslessness, rollback, metrics, the bench CLI."""
from __future__ import annotations

import json
import math
import statistics

import pytest
import torch
from _pairs import tiny_default

from helpers.boundaries import CapturePlan
from helpers.investigation.pair import load_pair, read_prompts
from helpers.live.reference import BenchResult, encode_prompts, run_bench
from helpers.model.engine import (
    TargetRunner,
    accept,
    acceptance_histogram,
    baseline_generate,
    position_acceptance,
    speculative_generate,
)


@pytest.fixture(scope="module")
def pair():
    return load_pair(tiny_default() / "target", tiny_default() / "draft")


@pytest.fixture(scope="module")
def prompts(pair):
    return encode_prompts(pair.tokenizer, read_prompts(tiny_default() / "prompts.jsonl")[:3])


def test_baseline_equals_hf_generate(pair, prompts):
    """The KV-cached loop must be plain greedy decoding: same tokens as transformers' generate."""
    for ids in prompts:
        ours = baseline_generate(pair.target, ids, 20).tokens
        ref = pair.target.generate(input_ids=ids[None], attention_mask=torch.ones_like(ids[None]),
                                   max_new_tokens=20, do_sample=False,
                                   pad_token_id=2)[0, ids.numel():].tolist()
        assert ours == ref


@pytest.mark.parametrize("layout", [(0, 3, 7), (3, 7, 10), (12, 0, 5)])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_speculative_is_lossless(pair, prompts, layout, k):
    plan = CapturePlan(layout, 12)
    for ids in prompts:
        base = baseline_generate(pair.target, ids, 40)
        spec = speculative_generate(pair.target, pair.draft, plan, ids, 40, k)
        assert spec.tokens == base.tokens
        assert len(spec.tokens) == 40
        assert all(0 <= n <= k for n in spec.accepted)
        assert 1.0 <= spec.tau <= k + 1


def test_trained_layout_accepts_more_than_a_wrong_one(pair, prompts):
    taus = {}
    for layout in [(0, 3, 7), (12, 11, 10)]:
        plan = CapturePlan(layout, 12)
        runs = [speculative_generate(pair.target, pair.draft, plan, ids, 48, 4) for ids in prompts]
        taus[layout] = sum(sum(r.accepted) + r.verify_steps for r in runs) / sum(r.verify_steps for r in runs)
    assert taus[(0, 3, 7)] > taus[(12, 11, 10)]


def test_rollback_restores_cache_length(pair, prompts):
    runner = TargetRunner(pair.target, CapturePlan((0, 3, 7), 12))
    logits, fused = runner.forward(prompts[0][None])
    n = runner.length
    assert fused.shape == (prompts[0].numel(), 3 * pair.target.config.hidden_size)
    runner.forward(torch.tensor([[5, 6, 7, 8]]))
    assert runner.length == n + 4
    runner.rollback(n + 1)
    assert runner.length == n + 1


def test_accept_and_histograms():
    assert accept([1, 2, 3], [1, 2, 9, 4]) == 2
    assert accept([7, 2], [1, 2, 3]) == 0
    assert accept([1, 2], [1, 2, 3]) == 2
    from helpers.model.engine import GenerationResult

    r = GenerationResult([0] * 9, 1.0, 4, [0, 2, 3, 0], k=3)
    assert r.tau == pytest.approx((5 + 4) / 4)
    assert acceptance_histogram([r]) == [2, 0, 1, 1]
    assert position_acceptance([r]) == [0.5, 0.5, 0.25]


def test_plan_width_must_match_draft(pair, prompts):
    with pytest.raises(ValueError, match="slots"):
        speculative_generate(pair.target, pair.draft, CapturePlan((0, 3), 12), prompts[0], 8, 3)


def test_run_bench_reports_paired_speedup_and_lossless(pair, prompts):

    res = run_bench(pair.target, pair.draft, CapturePlan((0, 3, 7), 12), prompts[:2], steps=3,
                    max_new_tokens=16, repeats=2, progress=False)
    d = res.to_dict()
    assert d["lossless"] is True and len(d["baseline_runs"]) == 2
    # the speedup is the geometric mean of the 4 paired ratios (2 prompts x 2 repeats, prompts weighted
    # alike), inside its own interval
    t = res.timing
    assert t.pairs == 4 and d["speedup"] == pytest.approx(t.speedup, abs=1e-3)
    by_prompt: dict[int, list[float]] = {}
    for p, r in zip(t.prompt_of, t.ratios):
        by_prompt.setdefault(p, []).append(math.log(r))
    geo = math.exp(statistics.fmean(statistics.fmean(v) for v in by_prompt.values()))
    assert t.speedup == pytest.approx(geo)
    lo, hi = d["speedup_interval"]
    assert lo <= d["speedup"] <= hi and d["timing"] in ("ok", "noisy", "unusable")
    assert sum(d["histogram"]) == d["verify_steps"]
    assert d["decode_ms"] > 0 and d["verify_ms"] > 0 and d["draft_step_ms"] > 0
    assert d["predicted_speedup"] == pytest.approx(
        res.tau * res.decode_ms / (res.verify_ms + 3 * res.draft_step_ms), rel=1e-3)
    # break-even: speculation ties the baseline when tau equals one round's cost in decodes
    assert d["break_even_tau"] == pytest.approx(res.tau / res.speedup, rel=1e-3)
    assert [p["prompt"] for p in d["per_prompt"]] == [0, 1]
    assert all(p["lossless"] for p in d["per_prompt"]) and all(p["tau"] >= 1.0 for p in d["per_prompt"])
    assert d["slower_prompts"] == sum(p["speedup"] < 1.0 for p in d["per_prompt"])
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        run_bench(pair.target, pair.draft, CapturePlan((0, 3, 7), 12), prompts[:1], repeats=0, progress=False)
    # the record rebuilds the result: notebook 06 reuses notebook 01's deployed row from its JSON, and every
    # figure, the interval and the verdict included, is computed again from the recorded pairs
    back = BenchResult.from_dict(json.loads(json.dumps(d)))
    assert back.to_dict() == d and back.row("deployed") == res.row("deployed")
    assert back.timing.interval == res.timing.interval and back.timing.verdict == res.timing.verdict


def test_bench_cli_json(capsys):
    from helpers.commands.bench import main

    d = tiny_default()
    rc = main(["--target", str(d / "target"), "--draft", str(d / "draft"), "--layout", "trained", "--steps",
               "3", "--max-new-tokens", "12", "--repeats", "1", "--num-prompts", "2", "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0
    for key in ("baseline_tok_s", "spec_tok_s", "speedup", "tau", "accept_rate", "lossless", "layout",
                "steps"):
        assert key in out
    assert out["layout"] == [0, 3, 7] and out["steps"] == 3 and out["lossless"] is True


def test_bench_cli_bad_input(capsys, tmp_path):
    from helpers.commands.bench import main

    d = tiny_default()
    assert main(["--target", str(tmp_path / "nope"), "--draft", str(d / "draft")]) == 2
    assert "no target model" in capsys.readouterr().err
    assert main(["--target", str(d / "target"), "--draft", str(d / "draft"), "--layout", "0,3,99"]) == 2
    assert "outside 0..12" in capsys.readouterr().err
    assert main(["--target", str(d / "target"), "--draft", str(d / "draft"), "--layout", "0,3"]) == 2
    assert "slots" in capsys.readouterr().err
    base = ["--target", str(d / "target"), "--draft", str(d / "draft")]
    for flag, value in (("--num-prompts", "0"), ("--num-prompts", "-1"), ("--max-new-tokens", "0"),
                        ("--repeats", "0")):
        with pytest.raises(SystemExit):
            main(base + [flag, value])
        assert "at least 1" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "def f():"}\n{"text": "no prompt key"}\n')
    assert main(base + ["--prompts", str(bad)]) == 2
    assert "bad.jsonl:2" in capsys.readouterr().err
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    assert main(base + ["--prompts", str(empty)]) == 2
    assert "holds no prompts" in capsys.readouterr().err


def test_read_prompts_decides_format_by_content(tmp_path):
    from helpers.investigation.pair import read_prompts

    f = tmp_path / "prompts.json"
    f.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    assert read_prompts(f) == ["a", "b"]
    g = tmp_path / "plain.txt"
    g.write_text("def f():\n\nclass A:\n")
    assert read_prompts(g) == ["def f():", "class A:"]
    h = tmp_path / "broken.jsonl"
    h.write_text('{"prompt": "a"\n')
    with pytest.raises(ValueError, match="broken.jsonl:1: not a JSON line"):
        read_prompts(h)


def test_engine_follows_the_patched_source(tmp_path, monkeypatch, capsys):
    """Patching the cached SGLang and giving a draft copy ids [-1, 2, 6] is what turns the
    reference engine's wiring from (3, 7, 10) into (0, 3, 7); unpatched, it refuses."""
    import shutil

    from helpers.commands.bench import main
    from helpers.engines.sglang.patch import apply_patch
    from helpers.engines.sglang.source import fetch_sglang
    from helpers.investigation.fixes import with_engine_ids

    pristine = fetch_sglang("0.5.9")
    cache = tmp_path / "cache"
    shutil.copytree(pristine.root, cache / "sglang" / "0.5.9", symlinks=True)
    monkeypatch.setenv("EAGLE3_WORKBOOK_CACHE", str(cache))
    d = tiny_default()
    fixed = with_engine_ids(d / "draft", tmp_path / "draft-fixA", [-1, 2, 6])
    args = ["--target", str(d / "target"), "--draft", str(fixed), "--engine", "sglang==0.5.9",   # the case
            "--layout", "served", "--steps", "2",
            "--max-new-tokens", "8", "--repeats", "1", "--num-prompts", "1", "--json"]
    assert main(args) == 2
    assert "residual" in capsys.readouterr().err
    assert apply_patch("0.5.9").patched
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["layout"] == [0, 3, 7] and out["lossless"]
