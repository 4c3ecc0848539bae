"""Notebooks 01 and 06's chapter on llama.cpp's kernels (``helpers.notebook.kernels``), without a server.

``tests/kernels/llamacpp_x96_f16.json`` is a run the chapter recorded on llama.cpp b11434 (tiny-llama x96,
f16, 3 draft steps, 6 prompts x 64 tokens, 2 paired repeats; an Intel Xeon with AMX, 2 cores): its sentences,
its table and the summary's rows are built from it here. ``tests/test_llamacpp_live.py`` runs the chapter
itself, through the notebooks, where llama-server is built."""
from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.notebook import host_costs, kernels
from helpers.notebook.reports import Summary, kernel_rows
from helpers.notebook.runner import check_run_inputs

RUN = json.loads((Path(__file__).parent / "kernels" / "llamacpp_x96_f16.json").read_text())


def test_the_parameter_names_an_engine_a_factor_and_perhaps_a_weight_type():
    assert kernels.parse("llamacpp x96") == kernels.Chapter(96, None) and kernels.parse(None) is None
    assert kernels.parse("llamacpp x2 f16") == kernels.Chapter(2, "f16")
    for bad in ("llamacpp", "vllm x96", "llamacpp 96", "llamacpp x0", "llamacpp x96 q4_k",
                "llamacpp x9 f16 k"):
        with pytest.raises(ValueError, match="KERNELS must be None or 'llamacpp xFACTOR' with an optional"):
            kernels.parse(bad)
    assert any("KERNELS must be" in p for p in check_run_inputs({"KERNELS": "llamacpp"}, None))
    assert not any("KERNELS" in p for p in check_run_inputs({"KERNELS": None}, None))


def test_the_finding_says_each_side_of_one_from_the_whole_interval():
    run = kernels.KernelsRun.from_dict(RUN)
    text = kernels.finding(run)
    assert text.startswith("On the kernels of llama.cpp b11434 (llama-server, cpu), at a real target's cost "
                           "(tiny-llama x96 f16, 3 draft steps): ")
    dep, fix_a, fix_b = run.rows
    assert dep.speedup_interval[1] < 1 < fix_a.speedup_interval[0] and fix_b.speedup_interval[0] > 1
    assert (f"deployed (2, 6, 9) runs slower than no speculation, {dep.speedup:.2f}x "
            f"[{dep.speedup_interval[0]:.2f}, {dep.speedup_interval[1]:.2f}], at an accept length of "
            f"{dep.accept_length:.2f} against a break-even of {dep.costs['break_even_tau']:.2f}") in text
    assert "fix A (0, 3, 7) runs faster than no speculation" in text
    # an interval across 1 is said to be one
    across = SimpleNamespace(speedup=1.0, speedup_interval=[0.9, 1.1], timing_verdict="noisy")
    assert kernels._ratio(across) == "not separable from no speculation, 1.00x [0.90, 1.10], timing noisy"
    assert kernels.finding(kernels.KernelsRun(unavailable="no server")).startswith(
        "Not measured on llama.cpp's kernels: no server")


def test_the_regime_is_said_from_the_runs_own_costs():
    run = kernels.KernelsRun.from_dict(RUN)
    c = run.rows[0].costs
    text = kernels.regime(run)
    assert text.startswith("The target is tiny-llama/target with its feed-forward blocks zero-padded to 96x")
    assert f"decodes a token in {c['decode']:.1f} ms" in text
    assert f"verifies 4 in {c['verify']:.1f} ms ({c['verify_over_decode']:.2f} decode steps" in text
    assert f"breaks even at an accept length of {c['break_even_tau']:.2f}" in text
    rate = RUN["target"]["bytes_per_token"] / c["decode"] / 1e6
    assert f"({rate:.1f} GB/s of weights" in text


def test_a_draft_step_below_zero_is_said_not_derivable_never_printed():
    """The draft step is derived, (round - verify) / k. Where the verify measured alone costs more than a
    whole round as served (an AMD EPYC host, bf16: verify of 6 40.5 ms, round 30.3 ms), the derivation
    fails: the regime, the shortfall sentence and the table say so or leave it out; the break-even (round /
    decode) stands."""
    run = kernels.KernelsRun.from_dict(RUN)
    for r in run.rows:
        r.costs = dict(r.costs, verify=40.5, round=30.3, draft_step=(30.3 - 40.5) / r.steps)
    text = kernels.regime(run)
    assert "a draft step's cost cannot be derived here (a round as served, 30.3 ms" in text
    assert "-3." not in text and "costs -" not in text
    assert all(r["draft_step_ms"] is None for r in kernels.table(run))
    short = [SimpleNamespace(wiring=r.wiring, costs=r.costs, speedup=1.2, accept_length=r.accept_length,
                             steps=r.steps) for r in run.rows]
    said = kernels.short_of_goal(kernels.KernelsRun(rows=short))
    assert said.startswith("fix A and fix B") and "a draft step" not in said


def test_the_table_puts_the_prediction_beside_the_measured_ratio():
    run = kernels.KernelsRun.from_dict(RUN)
    rows = kernels.table(run)
    assert [r["wiring"] for r in rows] == ["deployed", "fix A", "fix B"]
    for r, row in zip(rows, run.rows):
        assert r["predicted_speedup"] == round(row.accept_length / row.costs["break_even_tau"], 3)
        assert r["break_even_tau"] == row.costs["break_even_tau"] and r["ref_tau"] == row.reference["tau"]
        assert r["verify_decodes"] == row.costs["verify_over_decode"]


def test_the_summary_leads_with_the_kernels_rows_naming_their_engine():
    rows = kernel_rows(RUN)
    assert rows == kernels.summary_rows(kernels.KernelsRun.from_dict(RUN))
    assert {r["engine"] for r in rows} == {"llama.cpp b11434 (llama-server, cpu), tiny-llama x96 f16"}
    summary = Summary(headline="", engine="sglang==0.5.9", draft_steps=3, max_new_tokens=64, prompts=6,
                      repeats=2, target="t", draft="d", rows=[{"wiring": "deployed", "engine": "reference",
                                                                "tau": 1.6, "speedup": 1.1}],
                      costs=[], details={}, kernels=RUN)
    table = summary.table()
    assert [r["engine"] for r in table] == [rows[0]["engine"]] * 3 + ["reference"]
    assert summary.finding().startswith("On llama.cpp b11434 (llama-server, cpu), tiny-llama x96 f16, "
                                        "against no speculation: deployed 1.08 tokens per step at 0.76x")


def test_the_index_page_groups_the_rows_by_pair(tmp_path):
    """The run's pair and the kernels chapter's pair each get their own line in the header, their own
    finding and figure, and their own rows under a heading in the table; no sentence about one pair sits
    under the other's name."""
    from helpers.notebook.reports import write_summary
    from helpers.notebook.runner import RunRecord, index_page

    summary = Summary(headline="h", engine="sglang==0.5.9", draft_steps=3, max_new_tokens=64, prompts=6,
                      repeats=2, target="data/tiny-kimi/target", draft="data/tiny-kimi/draft",
                      rows=[{"wiring": "deployed", "engine": "reference", "tau": 1.6, "speedup": 1.1,
                             "speedup_interval": [1.0, 1.2]}], costs=[], details={}, kernels=RUN)
    groups = summary.by_pair()
    assert [label for label, _ in groups] == [
        "tiny-llama (its target widened x96, f16), the kernels chapter's pair", "tiny-kimi"]
    assert [len(rows) for _, rows in groups] == [3, 1]
    write_summary(tmp_path, summary)
    page = index_page(tmp_path, [RunRecord("06_rebenchmark", 1.0, True)],
                      {"TARGET": "data/tiny-kimi/target", "DRAFT": "data/tiny-kimi/draft"}).read_text()
    header = page[page.index("This run measured 2 pairs"):page.index("</ul>")]
    assert "<b>tiny-kimi</b>: target: <code>data/tiny-kimi/target</code>" in header
    assert "<b>tiny-llama (its target widened x96, f16)" in header and "llama.cpp b11434" in header
    kimi, llama = page.index("<h2>tiny-kimi</h2>"), page.index("<h2>tiny-llama")
    assert llama < page.index("On llama.cpp b11434") < kimi < page.index("On the reference engine")
    assert page.count("<img class='finding-figure'") == 2
    assert page.count("<th class='pair'") == 2


def test_a_fix_short_of_one_and_a_half_is_said_why_from_the_hosts_costs():
    """On the recorded Intel run both fixes clear 1.5x and nothing is added; on a host where a verify of 4
    costs 1.8 decode steps (the AMD host of docs/timing.md) the round breaks even near 2 tokens, and the best
    accept length measured bounds what any fix can give: the regime says so in one sentence."""
    run = kernels.KernelsRun.from_dict(RUN)
    assert kernels.short_of_goal(run) == "" and "cannot clear" not in kernels.regime(run)
    costs = {"decode": 10.0, "verify": 18.0, "verify_over_decode": 1.8, "draft_step": 0.5,
             "break_even_tau": 1.95}
    rows = [SimpleNamespace(wiring=w, costs=costs, speedup=s, accept_length=a, steps=3)
            for w, s, a in (("deployed", 0.55, 1.08), ("fix A", 1.31, 2.75), ("fix B", 1.24, 2.62))]
    text = kernels.short_of_goal(kernels.KernelsRun(rows=rows))
    assert text == ("fix A and fix B cannot clear 1.5x on this CPU: a verify of 4 tokens costs 1.80 decode "
                    "steps and a draft step 0.05, so a round of 3 breaks even at 1.95 tokens, and the best "
                    "accept length measured (2.75, fix A) predicts at most 1.41x")
    rows[1].speedup = 1.6            # one fix clears it: only the other is named, and why it fell short
    costs2 = dict(costs, break_even_tau=1.5)
    for r in rows:
        r.costs = costs2
    assert kernels.short_of_goal(kernels.KernelsRun(rows=rows)).startswith("fix B measured under 1.5x here")


def test_the_round_length_is_the_one_its_costs_and_acceptance_favour():
    """A verify that stays cheap up to 3 tokens and then climbs makes k=2 the best round; the chosen k, every
    option's prediction and the acceptance are said in one sentence, and a notebook-06 run reuses them."""
    acc = [0.76, 0.48, 0.38, 0.26, 0.19]
    options = kernels.steps_options(acc, {1: 1.16, 2: 1.17, 3: 1.42, 4: 1.87, 5: 2.19})
    assert [o["tau"] for o in options] == [1.76, 2.24, 2.62, 2.88, 3.07]
    best = max(options, key=lambda o: (o["predicted"], -o["k"]))
    assert best["k"] == 2 and best["predicted"] == pytest.approx(2.24 / 1.17, abs=1e-3)
    choice = kernels.RegimeChoice(2, "f16", "llamacpp==b11434", 19.3, tuple(acc), tuple(options))
    said = choice.sentence()
    assert said.startswith("f16 weights and 2 draft tokens per round, chosen from this host's costs: a "
                           "verify of 3 tokens costs 1.17 decode steps on llamacpp==b11434")
    assert f"k=2 predicts {round(2.24 / 1.17, 3):.2f}x (accept length 2.24)" in said and "k=5 1.40x" in said
    assert "also tried" not in said
    run = kernels.KernelsRun(settings={"steps": 2, "outtype": "f16"}, choice=choice.to_dict())
    assert kernels.KernelsRun.from_dict(run.to_dict()).choice == choice.to_dict()
    # a flat verify curve: the longest round wins; equal predictions: the shorter one
    flat = kernels.steps_options(acc, {k: 1.0 for k in range(1, 6)})
    assert max(flat, key=lambda o: (o["predicted"], -o["k"]))["k"] == 5


def test_the_weight_type_is_tried_in_order_until_one_predicts_enough(monkeypatch):
    """Each weight type's own verify curve, measured on its own server: f16 predicting too little sends the
    choice on to bf16 and f32, one that cannot be served is said, and the one predicting the most is kept;
    a type predicting ENOUGH ends the search."""
    from types import SimpleNamespace

    from helpers.engines.llamacpp.costs import VerifyCurve
    from helpers.engines.llamacpp.engine import LlamacppEngineError
    acc = [0.76, 0.48, 0.38, 0.26, 0.19]
    ratios = {"f16": 2.05, "bf16": None, "f32": 1.9, "q8_0": 1.05}   # verify over decode, flat per type
    asked = []

    def curve(found, wide, outtype, ids):
        asked.append(outtype)
        if ratios[outtype] is None:
            raise LlamacppEngineError("llama-server exited with code -11 before it was ready\nmore")
        return VerifyCurve("llamacpp==b1", 20.0, {n: ratios[outtype] * 20.0 for n in range(2, 7)})

    assert kernels._reason(LlamacppEngineError("llama-server exited with code -11 before it was ready: "
                                               + "0.00.005 I srv load_model: loading model x" * 3)) == \
        "llama-server exited with code -11 before it was ready"

    monkeypatch.setattr(kernels, "_curve", curve)
    monkeypatch.setattr(kernels, "trained_plan", lambda pair: None)
    monkeypatch.setattr(kernels, "speculative_generate", lambda *a, **k: None)
    monkeypatch.setattr(kernels, "position_acceptance", lambda results: acc)
    pair, ids = SimpleNamespace(target=None, draft=None), [None, None]
    choice = kernels.choose_regime(None, None, pair, ids, 8)
    assert asked == ["f16", "bf16", "f32", "q8_0"]          # none reached ENOUGH until q8_0
    assert choice.outtype == "q8_0" and choice.steps == 5       # a flat curve: the longest round
    said = choice.sentence()
    assert said.startswith("q8_0 weights and 5 draft tokens per round")
    assert ("also tried: f16 weights 1.50x at best (k=5); bf16 weights not measured (llama-server exited "
            "with code -11 before it was ready); f32 weights 1.62x at best (k=5)") in said
    # another type predicting more, but by less than BETTER: the first measured is kept
    ratios["q8_0"] = None
    choice = kernels.choose_regime(None, None, pair, ids, 8)
    assert choice.outtype == "f16" and [t["outtype"] for t in choice.tried] == ["f16", "bf16", "f32", "q8_0"]
    # a type whose batch costs less than one decode step (q8_0 on the AMD EPYC host: a verify of 3 tokens
    # 0.83 decode steps) is passed over, said: a useless draft would look fast there
    ratios["q8_0"] = 0.85
    choice = kernels.choose_regime(None, None, pair, ids, 8)
    assert choice.outtype == "f16"
    q8 = next(t for t in choice.tried if t["outtype"] == "q8_0")
    assert "predicted" not in q8 and q8["error"].startswith("a verify of 2 tokens costs 0.85 decode steps, "
                                                            "under one")
    assert "q8_0 weights passed over (a verify of 2 tokens costs 0.85 decode steps" in choice.sentence()
    # ... but never when it is the one type named (KERNELS' third word): that is what was asked to be seen
    named = kernels.choose_regime(None, None, pair, ids, 8, outtypes=("q8_0",))
    assert named.outtype == "q8_0" and "predicted" in named.tried[0]
    # the first type predicting ENOUGH is kept without trying the rest; a fixed k is kept
    asked.clear()
    ratios["f16"] = 1.1
    choice = kernels.choose_regime(None, None, pair, ids, 8, steps=2)
    assert asked == ["f16"] and choice.outtype == "f16" and choice.steps == 2
    assert [o["k"] for o in choice.options] == [2]
    # nothing servable: one line naming each type's reason
    ratios.update(f16=None, bf16=None, f32=None, q8_0=None)
    with pytest.raises(kernels.LlamacppUnavailable, match="f16: llama-server exited with code -11"):
        kernels.choose_regime(None, None, pair, ids, 8)


def test_a_draft_step_this_host_measured_is_counted_in_the_next_choice(monkeypatch, tmp_path):
    """The chapter keeps the draft step its rows measured (median, in decode steps, per weight type and CPU);
    the next choice on this host counts k of them in each round's cost, and says so. A row whose draft step
    could not be derived adds nothing."""
    from types import SimpleNamespace

    from helpers.engines.llamacpp.costs import VerifyCurve
    monkeypatch.setenv("EAGLE3_WORKBOOK_CACHE", str(tmp_path))
    engine = "llama.cpp b11434 (llama-server, cpu)"
    assert host_costs.remembered_draft_costs(engine, "tiny-llama", 96) == {}
    row = lambda step: SimpleNamespace(costs={"decode": 15.0, "draft_step": step})  # noqa: E731
    host_costs.remember_draft_costs(engine, "tiny-llama", {"widen": 96, "outtype": "bf16"},
                                    [row(-2.05), row(1.5), row(1.8)])
    known = host_costs.remembered_draft_costs(engine, "tiny-llama", 96)
    assert list(known) == ["bf16"] and known["bf16"]["decodes"] == pytest.approx(1.65 / 15.0, abs=1e-4)
    assert host_costs.remembered_draft_costs(engine, "tiny-llama", 64) == {}

    acc = [0.76, 0.48, 0.38, 0.26, 0.19]
    monkeypatch.setattr(kernels, "_curve", lambda found, wide, outtype, ids: VerifyCurve(
        "llamacpp==b1", 15.0, {n: 15.0 * (1.0 + 0.16 * n) for n in range(2, 7)}))
    monkeypatch.setattr(kernels, "trained_plan", lambda pair: None)
    monkeypatch.setattr(kernels, "speculative_generate", lambda *a, **k: None)
    monkeypatch.setattr(kernels, "position_acceptance", lambda results: acc)
    pair, ids = SimpleNamespace(target=None, draft=None), [None, None]
    blind = kernels.choose_regime(None, None, pair, ids, 8, outtypes=("bf16",))
    counted = kernels.choose_regime(None, None, pair, ids, 8, outtypes=("bf16",), draft_costs=known)
    c = known["bf16"]["decodes"]
    for o in counted.options:
        assert o["predicted"] == pytest.approx(o["tau"] / (o["verify_decodes"] + o["k"] * c), abs=1e-3)
    assert counted.steps < blind.steps           # dear draft steps favour a shorter round
    assert counted.to_dict()["draft_steps_counted"] and not blind.to_dict()["draft_steps_counted"]
    assert f"and a draft step {c:.2f} (this host's earlier run" in counted.sentence()
    assert "draft steps not counted: none measured here yet" in blind.sentence()
    # an unreadable cache remembers nothing
    (tmp_path / "kernels" / host_costs.DRAFT_COSTS).write_text("{not json")
    assert host_costs.remembered_draft_costs(engine, "tiny-llama", 96) == {}


def test_a_verify_curve_this_host_measured_is_reused_and_named(monkeypatch, tmp_path):
    """The choice keeps each weight type's verify curve (per build, pair, widening, CPU, threads and the
    prompts' tokens); a later choice on the same host uses it instead of starting a server, says when it was
    measured, and measures again for other prompts, another widening or a cache that cannot be read."""

    import torch

    from helpers.engines.llamacpp.costs import VerifyCurve
    monkeypatch.setenv("EAGLE3_WORKBOOK_CACHE", str(tmp_path))
    asked = []

    def curve(found, wide, outtype, ids):
        asked.append(outtype)
        return VerifyCurve("llamacpp==b1", 15.0, {n: 15.0 * (1.0 + 0.16 * n) for n in range(2, 7)})

    monkeypatch.setattr(kernels, "_curve", curve)
    monkeypatch.setattr(kernels, "trained_plan", lambda pair: None)
    monkeypatch.setattr(kernels, "speculative_generate", lambda *a, **k: None)
    monkeypatch.setattr(kernels, "position_acceptance", lambda results: [0.76, 0.48, 0.38, 0.26, 0.19])
    engine = "llama.cpp b11434 (llama-server, cpu)"
    pair, ids = SimpleNamespace(target=None, draft=None), [torch.tensor([1, 2, 3]), torch.tensor([4, 5])]

    def choose(memory, prompts=ids):
        return kernels.choose_regime(None, None, pair, prompts, 8, outtypes=("f16", "bf16"), curves=memory)

    first = choose(host_costs.CurveMemory(engine, "tiny-llama", 96))
    assert asked == ["f16", "bf16"] and "earlier run" not in first.sentence()
    asked.clear()
    again = choose(host_costs.CurveMemory(engine, "tiny-llama", 96))
    assert asked == [] and again.options == first.options and again.outtype == first.outtype
    assert f"decode steps (this host's earlier run, {time.strftime('%Y-%m-%d')}" in again.sentence()
    assert all(t["verify_measured"].startswith(time.strftime("%Y-%m-%d")) for t in again.tried)
    choose(host_costs.CurveMemory(engine, "tiny-llama", 64))                      # another widening: measured
    choose(host_costs.CurveMemory(engine, "tiny-llama", 96), [torch.tensor([1, 2, 4]), ids[1]])  # prompts
    assert asked == ["f16", "bf16", "f16", "bf16"]
    asked.clear()
    (tmp_path / "kernels" / host_costs.VERIFY_COSTS).write_text("[1, 2")     # unreadable: measured again
    choose(host_costs.CurveMemory(engine, "tiny-llama", 96))
    assert asked == ["f16", "bf16"]
    asked.clear()                          # a kept curve without every size the choice weighs: measured again
    short = VerifyCurve("llamacpp==b1", 15.0, {2: 20.0})
    host_costs.CurveMemory(engine, "tiny-llama", 96).put("f16", ids, short)
    choose(host_costs.CurveMemory(engine, "tiny-llama", 96))
    assert asked == ["f16"]
    assert json.loads((tmp_path / "kernels" / host_costs.VERIFY_COSTS).read_text())
