"""One scorer and one ranker for candidate layouts, whatever the slot states came from: a capture of the
target's forward (``layout_search``) or a trainer's dump (``dump_diagnose``).

``fc`` is linear, so a layout's input to the draft is the sum of each slot's projection of its boundary's
state; ``score_states`` runs the draft's steps on several such sums at once and returns, per layout and
token, the cross-entropy against the target (its distribution where known, else its next token), whether
each step was right, and the tokens one greedy verify step keeps (``evaluate.accepted_run``). ``rank``
sorts layouts by that simulated accept length (ties: lower cross-entropy) and tests every row against the
best, paired over the same token blocks; ``within_noise`` marks the rows the test cannot tell from it. The
table it returns (``RANKING_COLUMNS`` first) is the one result both sources give.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable

import pandas as pd
import torch
import torch.nn.functional as F

from ..judgement import PairedTest
from .evaluate import accepted_run

# the columns every ranking opens with, whichever source it came from
RANKING_COLUMNS = ("rank", "sim_accept_length", "ce", "acc0", "z_vs_best", "within_noise")


@torch.no_grad()
def score_states(draft, h: torch.Tensor, ids: torch.Tensor, steps: int, n: int, labels: torch.Tensor,
                 probs: torch.Tensor | None = None, vocab_index: torch.Tensor | None = None):
    """Run ``steps`` draft steps on projected inputs ``h`` [B, T, H] (a layout's slot projections summed)
    over tokens ``ids`` [B, T]. ``labels`` [B, >= n + steps - 1]: step j's target for column c is
    ``labels[:, c + j]``; with ``probs`` (the target's draft-vocabulary distribution, indexed the same way)
    the cross-entropy is against it, else against the label through ``vocab_index`` (target id -> draft id,
    -1 outside). Returns (ce summed over steps [B, n], per-step hits [B, n] each, accepted [B, n])."""
    logits = draft.ttt_forward(ids, h, steps, projected=True)
    ce = torch.zeros(h.shape[0], n, device=h.device)
    hits = []
    for j, lg in enumerate(logits):
        lg = lg[:, :n].float()
        tgt = labels[:, j:j + n]
        logq = F.log_softmax(lg, -1)
        if probs is not None:
            ce += -(probs[:, j:j + n] * logq).sum(-1)
        else:
            d = vocab_index[tgt.clamp(min=0)]
            ce += -logq.gather(-1, d.clamp(min=0)[..., None])[..., 0]
        hits.append(draft.to_target_ids(lg.argmax(-1)) == tgt)
    return ce, hits, accepted_run(hits)


def rank(rows: list[dict], key: str, test: Callable[[Hashable, Hashable], PairedTest] | None
         ) -> tuple[pd.DataFrame, list[PairedTest]]:
    """Rows (each with ``key``, ``sim_accept_length``, ``ce`` and ``acc0``) sorted by accepted tokens per
    verify step, ties to the lower cross-entropy, numbered from 1. With ``test(best, other)``, each row's
    paired z against the best (``z_vs_best``) and whether that test cannot tell them apart
    (``within_noise``; the best is within its own noise). Returns the table and the tests, row by row."""
    df = pd.DataFrame(rows).sort_values(["sim_accept_length", "ce"], ascending=[False, True])
    df = df.reset_index(drop=True)
    df.insert(0, "rank", range(1, len(df) + 1))
    tests: list[PairedTest] = []
    if test is not None:
        best = df.loc[0, key]
        tests = [test(best, other) for other in df[key]]
        df["z_vs_best"] = [0.0 if i == 0 else round(t.z, 2) for i, t in enumerate(tests)]
        df["within_noise"] = [i == 0 or not t.significant for i, t in enumerate(tests)]
    return df, tests


def confident_set(ranking: pd.DataFrame, key: str) -> list[tuple]:
    """Every row the ranking's own test cannot tell from the best, best first (the best alone when the
    ranking was not tested)."""
    if "within_noise" not in ranking:
        return [tuple(ranking.loc[0, key])]
    rows = ranking[ranking["within_noise"].fillna(False).astype(bool)]
    return [tuple(x) for x in rows[key]] or [tuple(ranking.loc[0, key])]
