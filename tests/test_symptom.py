"""What the wiring costs against what the draft reaches, and on which text (verdict.WiringVerdict.symptom,
diagnosis.diagnose_text, pair.more_captures).

A verdict that compares layouts says, first, the accept length as served and as trained (the gain a fix
buys, with its interval), what the draft reaches wired right, and one sentence on the user's symptom: a
fix worth making, or a draft whose acceptance is its own. The text it judged on is named, and a
diagnosis not yet settled evaluates more of it, up to a stated budget.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from _pairs import tiny_llama

from helpers.investigation.verdict import MATERIAL, Acceptance, judge
from helpers.judgement import PairedTest
from helpers.rules.conventions import parse_engine

AT_TRAINED = Acceptance(1.92, (0.71, 0.16, 0.05))


def _verdict(served, trained, difference: float, se: float, blocks: int = 200, served_accept: float = 1.5):
    cost = PairedTest(difference, se, difference / se, blocks)
    return judge(served, trained, known=True, source="training record", cost=cost,
                 engine=parse_engine("sglang==0.5.23"), arch="LlamaForCausalLM", num_layers=10,
                 at_served=Acceptance(served_accept, (0.4, 0.08, 0.02)), at_trained=AT_TRAINED,
                 paths=("runs/draft", "runs/target"))


def test_a_costly_miswiring_says_fix_it():
    v = _verdict((3, 6, 8), (2, 5, 7), 0.42, 0.02, served_accept=1.50)
    assert v.symptom == ("the wiring costs 0.42 [0.36, 0.48] accepted tokens per step: fix it, and the draft "
                         "reaches 1.92")
    assert v.figures.startswith("accept length 1.50 as served, 1.92 at the training layout "
                                "(+0.42 [0.36, 0.48]")
    assert "reaches 1.92 of at most 4 (per draft position 0.71, 0.16, 0.05)" in v.figures
    assert v.head == [v.line, v.figures, v.symptom] and v.exit_code == 1
    # the fix is a command, with its ids as data
    d = v.to_dict()
    assert d["fix_command"] == ("python -m helpers fixes deploy --draft runs/draft --target runs/target "
                                "--engine sglang==0.5.23 --out runs/draft-deploy")
    assert d["fix_ids"] == [1, 4, 6] and d["symptom"] == v.symptom
    assert d["accept_length"]["trained"] == {"accept_length": 1.92, "per_step": [0.71, 0.16, 0.05],
                                             "at_most": 4}


def test_a_miswiring_that_costs_nothing_says_so():
    """The issue's held-out pair: 0.01 tokens per step, statistically separable, worth nothing."""
    v = _verdict((3, 6, 8), (2, 5, 7), 0.012, 0.0035, served_accept=1.91)
    assert v.significant and v.cost.difference - v.cost.half_width < MATERIAL * AT_TRAINED.accept_length
    assert v.symptom == ("the wiring costs 0.01 [0.00, 0.02]: fixing it will not recover acceptance; the "
                         "draft itself tops out at 1.92 here")
    # one rule for "does it matter" (verdict.cost_of): the first line, the sentence and the exit code agree
    assert v.mismatch and v.exit_code == 0 and v.line.startswith("MISMATCH, NEGLIGIBLE COST")


def test_a_right_wiring_and_too_little_text():
    ok = _verdict((2, 5, 7), (2, 5, 7), 0.0, 0.01)
    assert ok.symptom == ("the wiring is right, so acceptance is the draft's own: the draft itself tops out "
                          "at 1.92 here")
    assert ok.exit_code == 0
    few = _verdict((3, 6, 8), (2, 5, 7), 0.3, 0.2, blocks=4)
    assert "too few to size it: evaluate on more of your own text" in few.symptom
    assert "significant" not in few.symptom


def test_more_captures_are_the_captures_of_more_text():
    """Growing a capture captures only the new windows, and gives what capturing them all at once gives."""
    from helpers.investigation.pair import eval_captures, load_pair, more_captures

    pair = load_pair(tiny_llama() / "target", tiny_llama() / "draft")
    small = eval_captures(pair, max_windows=2, window=64)
    assert small.text.windows == 2 and small.text.origin == "beside the target"
    assert small.text.path.endswith("heldout.txt")
    grown = more_captures(pair, small, 4)
    direct = eval_captures(pair, max_windows=4, window=64)
    assert grown.text.windows == 4 and torch.equal(grown.input_ids, direct.input_ids)
    for b in direct.states:
        torch.testing.assert_close(grown.states[b], direct.states[b], rtol=0, atol=2e-3)
    assert torch.equal(grown.target_argmax, direct.target_argmax)
    assert more_captures(pair, grown, 3) is grown           # never shrinks


def _without_record(tmp_path: Path, ids) -> Path:
    """The tiny Llama pair's draft, record removed, saved in SGLang's format with config ids ``ids``."""
    from helpers.model.checkpoint import load_draft, save_draft
    from helpers.model.target import load_target

    d = tiny_llama()
    draft = load_draft(d / "draft", target=load_target(d / "target")[0])
    draft.cfg.eagle_ids = list(ids)
    save_draft(draft, tmp_path / "draft", "sglang")
    return tmp_path / "draft"


def test_an_unsettled_diagnosis_evaluates_more_text(tmp_path):
    """The ids-converted-across-conventions pair (tests/test_verdict.py): on 2 windows of 32 tokens the
    ranking cannot tell the layouts apart (UNDECIDED); diagnose_text doubles the windows of the same text up
    to its budget, where the served layout falls out of the confidence set (MISMATCH). The toy target's
    layers stay nearly interchangeable, so the ranking never names one best layout confidently: it says
    the budget was spent. Given no room to grow, it evaluates what it was given and says so."""
    from helpers.investigation.diagnosis import diagnose, diagnose_text
    from helpers.investigation.pair import eval_captures, load_pair

    trained = tuple(json.loads((tiny_llama() / "draft" / "training.json").read_text())["training_boundaries"])
    pair = load_pair(tiny_llama() / "target", _without_record(tmp_path, trained))
    engine = parse_engine("sglang==0.5.23")
    little = eval_captures(pair, max_windows=2, window=32)
    assert diagnose(pair, little, engine, steps=2, progress=False).wiring.mismatch is None
    d = diagnose_text(pair, little, engine, steps=2, budget=64, progress=False)
    assert d.text.windows == 64 and d.wiring.mismatch is True and trained in d.confident_set
    assert d.growth == "still not settled at 64 windows: the budget (--max-windows 64) is spent"
    assert d.to_dict()["text"] | {"growth": None} == {
        "path": d.text.path, "origin": "beside the target", "tokens": d.text.tokens, "window": 32,
        "windows": 64, "windows_available": d.text.tokens // 32, "growth": None}
    spent = diagnose_text(pair, little, engine, steps=2, budget=2, progress=False)
    assert not spent.settled and spent.text.windows == 2 and spent.wiring.mismatch is None
    assert spent.growth == "still not settled at 2 windows: the budget (--max-windows 2) is spent"


def test_notebook_02_says_the_verdict_the_figures_and_the_symptom():
    from helpers.notebook.story import verdict

    v = _verdict((3, 6, 8), (2, 5, 7), 0.42, 0.02, served_accept=1.50)
    text = verdict(v, from_dump=False).split("\n\n")
    assert text[0] == f"**Verdict.** {v.line}"
    assert text[1].startswith("**Accept length.** 1.50 as served, 1.92 at the training layout (+0.42")
    assert text[2] == ("**What it means.** The wiring costs 0.42 [0.36, 0.48] accepted tokens per step: fix "
                       "it, and the draft reaches 1.92.")


def test_an_undecided_verdict_bounds_what_rewiring_can_buy():
    cost = PairedTest(0.0, 0.006, 0.0, 200)
    close = judge((0, 3, 7), (0, 3, 7), known=False, source="inferred by the layout search",
                  confident_set=[(0, 3, 7), (0, 2, 7)], cost=cost, at_served=AT_TRAINED,
                  at_trained=AT_TRAINED)
    assert close.mismatch is None and close.exit_code == 3
    assert close.symptom == ("the served layout scores within 0.00 [-0.02, 0.02] of the best-scoring one: "
                             "whichever the training layout is, rewiring will not recover acceptance; the "
                             "draft itself tops out at 1.92 here")
    wide = judge((0, 3, 7), (0, 2, 7), known=False, source="inferred by the layout search",
                 confident_set=[(0, 3, 7), (0, 2, 7)], cost=PairedTest(0.1, 0.05, 2.0, 200),
                 at_served=AT_TRAINED, at_trained=AT_TRAINED)
    assert wide.symptom == ("the wiring may cost up to 0.25 accepted tokens per step against the "
                            "best-scoring layout: settle which layout the draft was trained on")
