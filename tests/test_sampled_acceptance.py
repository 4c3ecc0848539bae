"""Expected acceptance under speculative sampling at a temperature, teacher-forced like the greedy
figures: the overlap ``sum_v min(p_T, q_T)`` chained over the draft steps, which at T = 0 is the
greedy ``full_acc`` and at a tiny T comes back to it; on the embedded pair the trained layout keeps
its lead over the served one when traffic is sampled."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from helpers.investigation.evaluate import (
    EvalInputError,
    SampledScore,
    check_temperature,
    evaluate_layout,
    overlap,
    sampled_acceptance,
    token_blocks,
    verifier_logits,
)

TINY_KIMI = Path(__file__).resolve().parent.parent / "data" / "tiny-kimi"
TRAINED, SERVED = (0, 3, 7), (3, 7, 10)
STEPS = 3

needs_pair = pytest.mark.skipif(not (TINY_KIMI / "target" / "model.safetensors").is_file(),
                                reason="no embedded tiny-kimi pair")


@pytest.fixture(scope="module")
def pair_caps():
    from helpers.investigation.pair import eval_captures, load_pair

    pair = load_pair(TINY_KIMI / "target", TINY_KIMI / "draft")
    return pair, eval_captures(pair, max_windows=2)


# -- the overlap itself, by hand ------------------------------------------------------------------


def test_overlap_by_hand():
    p = torch.tensor([0.1, 0.4, 0.2, 0.3])
    ids = torch.tensor([1, 3])                    # draft token d is target token ids[d]
    q = torch.tensor([0.5, 0.5])
    # q in the target vocab: [0, .5, 0, .5]; min with p: [0, .4, 0, .3]
    assert overlap(p.log(), q.log(), ids, 1.0).item() == pytest.approx(0.7, abs=1e-6)
    # T = 2 flattens both: p_T ~ sqrt(p), q_T stays uniform
    pt = p.sqrt() / p.sqrt().sum()
    want = float(torch.minimum(pt[1], torch.tensor(0.5)) + torch.minimum(pt[3], torch.tensor(0.5)))
    assert overlap(p.log(), q.log(), ids, 2.0).item() == pytest.approx(want, abs=1e-6)
    # the same distribution is always accepted; disjoint supports never are
    full = torch.tensor([0.0, 0.4, 0.0, 0.6])
    same = overlap(full.log(), torch.tensor([0.4, 0.6]).log(), ids, 1.0)
    assert same.item() == pytest.approx(1.0, abs=1e-6)
    assert overlap(torch.tensor([5.0, -50.0, 5.0, -50.0]), q.log(), ids, 1.0).item() < 1e-6
    # two draft ids naming one target token: their probabilities add up there
    both = overlap(torch.tensor([0.0, 0.0, 9.0, 0.0]), torch.zeros(2), torch.tensor([2, 2]), 1.0)
    want = float(torch.softmax(torch.tensor([0.0, 0.0, 9.0, 0.0]), 0)[2])
    assert both.item() == pytest.approx(want, abs=1e-6)
    # batched over leading dims
    assert overlap(torch.randn(2, 5, 4), torch.randn(2, 5, 2), ids, 0.7).shape == (2, 5)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf"), -float("inf"), "hot", None, True])
def test_temperature_must_be_zero_or_finite_positive(bad):
    with pytest.raises(EvalInputError, match="temperature"):
        check_temperature(bad)
    assert check_temperature(0) == 0.0 and check_temperature(0.7) == 0.7


# -- on the embedded pair -------------------------------------------------------------------------


@needs_pair
def test_zero_temperature_is_the_greedy_figures_exactly(pair_caps):
    pair, caps = pair_caps
    for layout in (TRAINED, SERVED):
        g = evaluate_layout(pair.draft, caps, layout, STEPS)
        s = sampled_acceptance(pair.draft, None, caps, layout, STEPS, 0)   # the target is not needed at T = 0
        assert s.marginal == g.full_acc and s.conditional == g.cond_acc and s.tokens == g.tokens
        assert torch.equal(s.accepted, g.accepted)
        assert torch.equal(token_blocks(s.accepted), g.blocks())


@needs_pair
def test_tiny_temperature_comes_back_to_greedy(pair_caps):
    pair, caps = pair_caps
    g = evaluate_layout(pair.draft, caps, TRAINED, STEPS)
    s = sampled_acceptance(pair.draft, pair.target, caps, TRAINED, STEPS, 1e-4)
    assert s.temperature == 1e-4 and s.tokens == g.tokens
    for a, b in zip(s.marginal, g.full_acc):
        assert abs(a - b) <= 0.02, (s.marginal, g.full_acc)


@needs_pair
def test_overlap_in_unit_interval_marginals_non_increasing_and_indexed_right(pair_caps):
    pair, caps = pair_caps
    s = sampled_acceptance(pair.draft, pair.target, caps, SERVED, STEPS, 0.7)
    assert isinstance(s, SampledScore) and s.chain.shape == (STEPS, *s.accepted.shape)
    alpha0 = s.chain[0]
    assert float(alpha0.min()) >= 0.0 and float(alpha0.max()) <= 1.0
    assert all(0.0 <= o <= 1.0 for o in s.overlap)
    assert all(a >= b for a, b in zip(s.marginal, s.marginal[1:])), s.marginal
    assert s.accept_length == pytest.approx(1.0 + sum(s.marginal), abs=1e-3)
    assert s.conditional[0] == s.marginal[0] and s.conditional[1] == pytest.approx(
        s.marginal[1] / s.marginal[0], abs=1e-3)
    assert math.isfinite(s.se()) and math.isfinite(s.se(0))
    # step 0 at column t is scored against the target's distribution at position t + 1
    logits = pair.draft.ttt_forward(caps.input_ids[:1], caps.fused(SERVED, slice(0, 1)), 1)[0]
    n = s.accepted.shape[1]
    tl = verifier_logits(pair.target, caps.states[caps.num_layers][0, 1:1 + n].float())
    direct = overlap(tl, logits[0, :n], pair.draft.draft_token_ids, 0.7)
    assert torch.allclose(direct, alpha0[0], atol=1e-5)
    # holding fewer columns of the target's distribution at once changes nothing
    small = sampled_acceptance(pair.draft, pair.target, caps, SERVED, STEPS, 0.7, batch=1, rows=50)
    assert torch.allclose(small.chain, s.chain, atol=1e-5)


@needs_pair
def test_trained_layout_leads_the_served_one_when_sampled(pair_caps):
    pair, caps = pair_caps
    trained = sampled_acceptance(pair.draft, pair.target, caps, TRAINED, 1, 0.7)
    served = sampled_acceptance(pair.draft, pair.target, caps, SERVED, 1, 0.7)
    assert trained.marginal[0] > served.marginal[0], (trained.marginal, served.marginal)
    assert trained.to_dict()["temperature"] == 0.7


@needs_pair
def test_bad_inputs_are_refused(pair_caps):
    pair, caps = pair_caps
    with pytest.raises(EvalInputError, match="temperature"):
        sampled_acceptance(pair.draft, pair.target, caps, TRAINED, 1, float("nan"))
    with pytest.raises(EvalInputError, match="slots"):
        sampled_acceptance(pair.draft, pair.target, caps, (0, 3), 1, 0.7)
