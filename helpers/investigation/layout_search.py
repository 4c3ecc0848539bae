"""Which layout was this draft trained on? Score candidate layouts and rank them.

``fc`` is linear, so ``fc(cat(a, b, c)) = W0 a + W1 b + W2 c``: each slot's projection of
each boundary is computed once, and a layout costs one sum plus one pass of the draft's
single layer. Layouts are ranked by what an engine rewards: the expected accepted tokens per
verify step under greedy verification against the target's own greedy tokens (the simulated
accept length, kept per token; ``evaluate.accepted_run``), over the draft steps asked for, on
every captured token. Cross-entropy and step-0 accuracy are reported beside it, and the
ranking's confidence is a paired z of best vs each other layout over blocks of tokens, on the
same measure. A full sweep of every ordered tuple is a screen on step 0 and fewer tokens, in two
rounds (successive halving): every layout on a quarter of the screen's windows, then the best sixteenth by
step-0 accuracy and by step-0 cross-entropy on all of them; the screen's leaders by either go on to the
final measure.
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import pandas as pd
import torch
from tqdm.auto import tqdm

from ..boundaries import check_layout, layout_label
from ..judgement import MIN_BLOCKS
from . import scoring
from .evaluate import (
    RANKED_BY,
    EvalInputError,
    LayoutScore,
    TargetCaptures,
    evaluate_layout,
    paired_test,
    token_blocks,
)
from .scoring import score_states


class SlotProjections:
    """``proj[s][b]``: slot s of ``fc`` applied to boundary b's state, for a token subset."""

    def __init__(self, draft, caps: TargetCaptures, windows: int | None = None):
        if caps.draft_probs is None:
            raise EvalInputError("captures carry no target distribution; call attach_draft_probs first")
        n = caps.input_ids.shape[0] if windows is None else min(windows, caps.input_ids.shape[0])
        self.draft, self.caps, self.n = draft, caps, n
        self.ids = caps.input_ids[:n]
        self.proj = [{b: draft.slot_project(caps.states[b][:n].float(), s)   # fc, and its norms (draft.py)
                      for b in caps.states} for s in range(draft.cfg.num_aux)]
        self.probs = caps.draft_probs[:n, 1:].float()
        self.labels = caps.target_argmax[:n, 1:]

    @torch.no_grad()
    def score(self, layouts: list[tuple[int, ...]], steps: int = 1, chunk: int | None = None) -> list[dict]:
        """Per layout and token: accepted tokens over ``steps`` draft steps (``accepted``), the
        cross-entropy against the target's distribution averaged over the steps (``ce``) and
        whether step 0 was right (``hit``); several layouts per forward."""
        t = self.ids.shape[1]
        n = t - steps
        if n < 1:
            raise EvalInputError(f"windows of {t} tokens are too short for {steps} draft steps")
        if chunk is None:   # layouts per forward: about 256 MB of fp32 logits
            chunk = max(1, min(8, 2**26 // max(1, self.n * t * self.draft.cfg.draft_vocab_size * steps)))
        out = []
        for i in range(0, len(layouts), chunk):
            group = layouts[i:i + chunk]
            h = torch.cat([sum(self.proj[s][b] for s, b in enumerate(lay)) for lay in group])
            g = len(group)
            ce, hits, acc = score_states(self.draft, h, self.ids.repeat(g, 1), steps, n,
                                         self.labels.repeat(g, 1), self.probs.repeat(g, 1, 1))
            for k, lay in enumerate(group):
                sl = slice(k * self.n, (k + 1) * self.n)
                out.append({"layout": tuple(lay), "ce": ce[sl] / steps, "hit": hits[0][sl].float(),
                            "accepted": acc[sl]})
        return out

    def score_step0(self, layouts: list[tuple[int, ...]], chunk: int = 8) -> list[dict]:
        """The sweep's screen: one draft step."""
        return self.score(layouts, 1, chunk)


@dataclass
class SearchResult:
    ranking: pd.DataFrame            # one row per layout: layout, label, sim_accept_length, ce, acc0, ...
    best: tuple[int, ...]
    runner_up: tuple[int, ...] | None
    margin_ce: float                 # runner-up ce - best ce (nats per token), beside the ranking
    margin_acc: float                # best acc0 - runner-up acc0
    z: float                         # paired z of the acceptance margin, best vs runner-up, over blocks
    mode: str
    evaluations: int
    seconds: float
    tokens: int
    notes: list[str] = field(default_factory=list)
    margin: float = float("nan")     # best - runner-up in accepted tokens per verify step: the ranking's own
    steps: int = 1                   # draft steps the ranking's measure counts
    blocks: int = 0                  # paired-test blocks behind ``z``
    scores: dict = field(default_factory=dict, repr=False)   # layout -> per-token scores of the final measure

    @property
    def confident(self) -> bool:
        """The best stands apart from every other layout scored by the final measure, on enough blocks."""
        return self.runner_up is not None and self.blocks >= MIN_BLOCKS and self.confident_set == [self.best]

    @property
    def confident_set(self) -> list[tuple[int, ...]]:
        """Every layout the ranking's own test cannot tell from the best, best first. Only rows
        scored by the final measure take part; the rest were never compared at full strength."""
        return scoring.confident_set(self.ranking, "layout")

    def blocks_of(self, layout) -> torch.Tensor | None:
        sc = self.scores.get(tuple(layout))
        return None if sc is None else token_blocks(sc["accepted"])

    def to_dict(self, top: int = 10) -> dict:
        rows = self.ranking.head(top).to_dict("records")
        for r in rows:
            r["layout"] = list(r["layout"])
            for k in ("sim_accept_length", "ce", "acc0"):
                r[k] = round(r[k], 4)
            if "within_noise" in r:
                r["within_noise"] = None if pd.isna(r["within_noise"]) else bool(r["within_noise"])
        return {"best_layout": list(self.best), "runner_up": list(self.runner_up) if self.runner_up else None,
                "margin": self.margin, "margin_ce": self.margin_ce, "margin_acc": self.margin_acc,
                "z": self.z, "confident": self.confident, "ranked_by": RANKED_BY, "steps": self.steps,
                "blocks": self.blocks, "mode": self.mode, "evaluations": self.evaluations,
                "seconds": self.seconds, "tokens": self.tokens, "ranking": rows, "notes": self.notes}


def _rank(scored: list[dict], num_layers: int, mode: str, t0: float, tokens: int, steps: int = 1,
          final: bool = True) -> SearchResult:
    """Sort by accepted tokens (ties: lower ce); with ``final``, each row's paired test against the best."""
    rows = [{"layout": s["layout"], "label": layout_label(s["layout"], num_layers),
             "sim_accept_length": float(s["accepted"].mean()), "ce": float(s["ce"].mean()),
             "acc0": float(s["hit"].mean())} for s in scored]
    by = {s["layout"]: s for s in scored}

    def test(best, other):
        return paired_test(token_blocks(by[best]["accepted"]), token_blocks(by[other]["accepted"]))

    df, tests = scoring.rank(rows, "layout", test if final else None)
    best = df.loc[0, "layout"]
    runner = df.loc[1, "layout"] if len(df) > 1 else None
    z = margin = margin_ce = margin_acc = float("nan")
    blocks = 0
    if final:
        blocks = tests[0].blocks
        if runner is not None:
            z, margin = float(df.loc[1, "z_vs_best"]), tests[1].difference
    if runner is not None:
        margin_ce = float((by[runner]["ce"] - by[best]["ce"]).mean())
        margin_acc = float(by[best]["hit"].mean() - by[runner]["hit"].mean())
        if not final:
            margin = float(by[best]["accepted"].mean() - by[runner]["accepted"].mean())
    return SearchResult(df, best, runner, round(margin_ce, 6), round(margin_acc, 4), round(z, 2), mode,
                        len(df), round(time.perf_counter() - t0, 2), tokens, margin=round(margin, 4),
                        steps=steps, blocks=blocks, scores=by if final else {})


def _score(sp: SlotProjections, layouts, progress: bool, desc: str, steps: int = 1) -> list[dict]:
    out = []
    bar = tqdm(total=len(layouts), desc=desc, disable=not progress, mininterval=1.0)
    for i in range(0, len(layouts), 64):
        out.extend(sp.score(layouts[i:i + 64], steps))
        bar.update(len(layouts[i:i + 64]))
    bar.close()
    return out


def _leaders(ranking: pd.DataFrame, top: int) -> list[tuple[int, ...]]:
    """The screen's survivors: the top by step-0 acceptance and the top by step-0 cross-entropy.
    Either alone can leave the answer behind (accuracy ties between neighbours, a likelihood that
    prefers a hedging layout), so both lists go on to the final measure."""
    by_acc = [tuple(l) for l in ranking["layout"].head(top)]
    by_ce = [tuple(l) for l in ranking.sort_values("ce", kind="stable")["layout"].head(top)]
    return list(dict.fromkeys(by_acc + by_ce))


@torch.no_grad()
def rerank(draft, caps: TargetCaptures, result: SearchResult, top: int = 12, steps: int = 3,
           include=()) -> SearchResult:
    """Re-score the screen's leaders on every captured token with ``steps`` draft steps, by the
    final measure (accepted tokens per verify step), each against the best by the paired test."""
    t0 = time.perf_counter()
    leaders = _leaders(result.ranking, top)
    # e.g. the served layout
    # (each once: the served layout and the one its config format's writers mean may be the same)
    leaders = list(dict.fromkeys(leaders + [tuple(l) for l in include if l is not None]))
    sp = SlotProjections(draft, caps)
    scored = sp.score(leaders, steps)
    out = _rank(scored, caps.num_layers, f"{result.mode}+rerank", t0, scored[0]["hit"].numel(), steps)
    out.ranking["scored_by"] = f"accepted tokens, {steps} draft steps, all tokens"
    rest = result.ranking[~result.ranking["layout"].map(tuple).isin(set(leaders))].copy()
    rest["rank"] = range(len(out.ranking) + 1, len(out.ranking) + 1 + len(rest))
    # the screen's columns are not comparable with the final measure's across this line (nor across its
    # rounds, where it had two: each row names the tokens it was scored on)
    if "scored_by" not in rest:
        rest["scored_by"] = "screen: step 0, sweep tokens"
    rest["z_vs_best"] = float("nan")
    rest["within_noise"] = None
    out.ranking = pd.concat([out.ranking, rest], ignore_index=True)
    out.evaluations = result.evaluations
    out.seconds = round(result.seconds + out.seconds, 2)
    extra = len(leaders) - len(_leaders(result.ranking, top))
    out.notes = [f"the {result.mode} search's leaders ({top} by step-0 accuracy and {top} by "
                 f"step-0 cross-entropy, {len(leaders) - extra} layouts)"
                 + (f" and {extra} named layout(s)" if extra else "")
                 + f" re-ranked on {out.tokens} tokens by accepted tokens over {steps} draft steps"]
    return out


# the full screen's second round scores the best 1/SCREEN_KEEP of the first round by each measure: on one
# window of the tiny pairs the trained layout ranked 2nd-3rd by cross-entropy and 3rd-83rd by accuracy of 1716
SCREEN_KEEP = 16


def full_search(draft, caps: TargetCaptures, windows: int | None = 4, progress: bool = True,
                rerank_top: int = 12, include=(), steps: int = 3) -> SearchResult:
    """Every ordered tuple of distinct boundaries (1716 for 13 boundaries and 3 slots), screened in two
    rounds where there are enough windows: all of them on a quarter of the ``windows``, then the best
    sixteenth by step-0 accuracy and the best sixteenth by step-0 cross-entropy on all ``windows`` (at
    least ``4 * rerank_top`` by each, so the final measure's leaders are chosen from a full-strength
    screen). The answer sits in the first round's top few percent on either measure; the screen costs
    about two fifths of a single round on every window."""
    t0 = time.perf_counter()
    layouts = list(itertools.permutations(sorted(caps.states), draft.cfg.num_aux))
    n = caps.input_ids.shape[0] if windows is None else min(windows, caps.input_ids.shape[0])
    first = max(1, n // 4)
    keep = max(4 * max(rerank_top, 1), -(-len(layouts) // SCREEN_KEEP))
    if first == n or 2 * keep >= len(layouts):
        sp = SlotProjections(draft, caps, n)
        res = _rank(_score(sp, layouts, progress, "full search"), caps.num_layers, "full", t0,
                    sp.labels.numel(), final=not rerank_top)
        return rerank(draft, caps, res, rerank_top, steps, include=include) if rerank_top else res
    sp1 = SlotProjections(draft, caps, first)
    round1 = _rank(_score(sp1, layouts, progress, f"full search, round 1 ({first} of {n} windows)"),
                   caps.num_layers, "full", t0, sp1.labels.numel(), final=False)
    survivors = _leaders(round1.ranking, keep)
    sp = SlotProjections(draft, caps, n)
    res = _rank(_score(sp, survivors, progress, f"full search, round 2 ({n} windows)"), caps.num_layers,
                "full", t0, sp.labels.numel(), final=not rerank_top)
    res.ranking["scored_by"] = f"screen: step 0, {sp.labels.numel()} tokens"
    out = rerank(draft, caps, res, rerank_top, steps, include=include) if rerank_top else res
    # the first round's other layouts rank below every layout the second round scored: the final
    # measure's leaders are chosen from the full-strength screen alone
    scored = set(out.ranking["layout"].map(tuple))
    rest = round1.ranking[~round1.ranking["layout"].map(tuple).isin(scored)].copy()
    rest["scored_by"] = f"screen round 1: step 0, {sp1.labels.numel()} tokens"
    rest["rank"] = range(len(out.ranking) + 1, len(out.ranking) + 1 + len(rest))
    if "z_vs_best" in out.ranking:
        rest["z_vs_best"] = float("nan")
        rest["within_noise"] = None
    out.ranking = pd.concat([out.ranking, rest], ignore_index=True)
    out.evaluations = len(layouts)
    out.notes = [f"screened in two rounds: all {len(layouts)} layouts on {sp1.labels.numel()} tokens, then "
                 f"the best {keep} by step-0 accuracy and by step-0 cross-entropy ({len(survivors)} layouts) "
                 f"on {sp.labels.numel()}", *out.notes]
    return out


def permutation_search(draft, caps: TargetCaptures, boundaries, windows: int | None = None,
                       steps: int = 3) -> SearchResult:
    """Every order of one set of boundaries: does the draft care about slot order?"""
    t0 = time.perf_counter()
    sp = SlotProjections(draft, caps, windows)
    layouts = list(itertools.permutations(tuple(boundaries)))
    scored = _score(sp, layouts, False, "permutations", steps)
    return _rank(scored, caps.num_layers, "permutations", t0, scored[0]["hit"].numel(), steps)


def slot_sweep(draft, caps: TargetCaptures, base, windows: int | None = None,
               progress: bool = False) -> pd.DataFrame:
    """Each slot of ``base`` swapped for every boundary, the others fixed: the heatmap's data
    (step 0: the slot's own effect, before later steps compound it)."""
    base = check_layout(base, caps.num_layers, draft.cfg.num_aux)
    sp = SlotProjections(draft, caps, windows)
    layouts, keys = [], []
    for s in range(len(base)):
        for b in sorted(caps.states):
            lay = list(base)
            lay[s] = b
            layouts.append(tuple(lay))
            keys.append((s, b))
    scored = _score(sp, layouts, progress, "slot sweep")
    return pd.DataFrame([{"slot": s, "boundary": b, "layout": sc["layout"], "ce": float(sc["ce"].mean()),
                          "acc0": float(sc["hit"].mean())} for (s, b), sc in zip(keys, scored)])


def coordinate_search(draft, caps: TargetCaptures, starts=None, windows: int | None = 6, rounds: int = 4,
                      progress: bool = True, include=(), steps: int = 3) -> SearchResult:
    """For large L: improve one slot at a time from a few starting layouts, then try every
    order of the winner. Costs about starts x rounds x slots x (L+1) evaluations, not (L+1)^slots.
    The climb uses step-0 cross-entropy (smooth, so a slot moves towards the answer before its
    top-1 flips); the layouts it visits are then ranked like the full search's."""
    t0 = time.perf_counter()
    sp = SlotProjections(draft, caps, windows)
    L, k = caps.num_layers, draft.cfg.num_aux
    bounds = sorted(caps.states)
    if starts is None:
        spread = tuple(round(i * L / (k + 1)) for i in range(1, k + 1))
        starts = {spread, tuple(range(k)), tuple(min(2 + i * (L // k), L) for i in range(k))}
    cache: dict[tuple, dict] = {}

    def score(layouts):
        todo = [l for l in layouts if l not in cache and len(set(l)) == len(l)]
        for s in sp.score_step0(todo):
            cache[s["layout"]] = s
        return [cache[l] for l in layouts if l in cache]

    bar = tqdm(total=len(starts), desc="coordinate search", disable=not progress)
    for start in starts:
        cur = tuple(start)
        score([cur])
        for _ in range(rounds):
            changed = False
            for s in range(k):
                cands = [cur[:s] + (b,) + cur[s + 1:] for b in bounds]
                best = min(score(cands), key=lambda x: float(x["ce"].mean()))["layout"]
                if best != cur:
                    cur, changed = best, True
            if not changed:
                break
        score(list(itertools.permutations(cur)))
        bar.update(1)
    bar.close()
    screen = _rank(list(cache.values()), L, "coordinate", t0, sp.labels.numel(), final=False)
    return rerank(draft, caps, screen, steps=steps, include=include)


def search(draft, caps: TargetCaptures, mode: str = "auto", windows: int | None = 4, progress: bool = True,
           include=(), steps: int = 3) -> SearchResult:
    """``include``: layouts always scored by the final measure (the served and recorded ones), so a
    verdict about them never rests on the coarser sweep. ``steps``: the draft steps the final
    measure counts (the engine's speculative steps)."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    n = math.perm(len(caps.states), draft.cfg.num_aux)
    if mode == "auto":
        mode = "full" if n <= 3000 else "coordinate"
    if mode == "full":
        return full_search(draft, caps, windows, progress, include=include, steps=steps)
    if mode == "coordinate":
        return coordinate_search(draft, caps, windows=windows, progress=progress, include=include,
                                 steps=steps)
    raise ValueError(f"unknown search mode {mode!r}; expected auto, full or coordinate")


def compare_layouts(draft, caps: TargetCaptures, layouts: dict[str, tuple], steps: int,
                    no_features_row: bool = False) -> pd.DataFrame:
    """Named layouts (e.g. served / trained / best) side by side, with TTT steps; optionally a
    control row with every feature zeroed, the floor the served row should be read against."""
    rows = []
    items = [(name, lay, False) for name, lay in layouts.items()]
    if no_features_row and layouts:
        items.append(("no features (zeros)", next(iter(layouts.values())), True))
    for name, lay, zeros in items:
        sc: LayoutScore = evaluate_layout(draft, caps, lay, steps, zero_features=zeros)
        row = {"wiring": name, "layout": () if zeros else tuple(lay),
               "label": "zeros" if zeros else layout_label(lay, caps.num_layers),
               "ce": sc.ce, "sim_accept_length": round(sc.sim_accept_length, 3), "tokens": sc.tokens}
        for j in range(steps):
            row[f"full_acc_{j}"] = sc.full_acc[j]
            row[f"cond_acc_{j}"] = sc.cond_acc[j]
        rows.append(row)
    return pd.DataFrame(rows)
