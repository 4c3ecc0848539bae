"""Which layout was this draft trained on? Score candidate layouts and rank them.

``fc`` is linear, so ``fc(cat(a, b, c)) = W0 a + W1 b + W2 c``: each slot's projection of
each boundary is computed once, and a layout costs one sum plus one pass of the draft's
single layer. Layouts are ranked by the draft's cross-entropy against the target's own
distribution -- a likelihood is steadier than top-1 accuracy, which can put a neighbour
of the true layout a hair ahead by noise -- with accuracy reported beside it, and the
ranking's confidence given as a paired z-score of best vs runner-up over tokens.
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from .boundaries import check_layout, layout_label
from .evaluate import EvalInputError, LayoutScore, TargetCaptures, evaluate_layout

Z_NOISE = 3.0   # a layout whose paired z against the best is below this is within noise of it


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
    def score_step0(self, layouts: list[tuple[int, ...]], chunk: int = 8) -> list[dict]:
        """Step-0 cross-entropy and accuracy of each layout, several layouts per forward."""
        out = []
        for i in range(0, len(layouts), chunk):
            group = layouts[i:i + chunk]
            h = torch.cat([sum(self.proj[s][b] for s, b in enumerate(lay)) for lay in group])
            ids = self.ids.repeat(len(group), 1)
            logits = self.draft.ttt_forward(ids, h, 1, projected=True)[0][:, :-1]
            logq = F.log_softmax(logits.float(), -1)
            ce = -(self.probs.repeat(len(group), 1, 1) * logq).sum(-1)          # [G*N, T-1]
            pred = self.draft.to_target_ids(logits.argmax(-1))
            hit = (pred == self.labels.repeat(len(group), 1)).float()
            for g, lay in enumerate(group):
                sl = slice(g * self.n, (g + 1) * self.n)
                out.append({"layout": tuple(lay), "ce": ce[sl], "hit": hit[sl]})
        return out


@dataclass
class SearchResult:
    ranking: pd.DataFrame            # one row per layout: layout, label, ce, acc0, ...
    best: tuple[int, ...]
    runner_up: tuple[int, ...] | None
    margin_ce: float                 # runner-up ce - best ce (nats per token)
    margin_acc: float                # best acc0 - runner-up acc0
    z: float                         # paired z-score of the ce margin over tokens
    mode: str
    evaluations: int
    seconds: float
    tokens: int
    notes: list[str] = field(default_factory=list)

    @property
    def confident(self) -> bool:
        return self.z >= Z_NOISE

    @property
    def confident_set(self) -> list[tuple[int, ...]]:
        """Every layout the ranking's own test cannot tell from the best (paired z < 3), best first.
        Only rows scored by the final measure take part; the rest were never compared at full strength."""
        if "z_vs_best" not in self.ranking:
            return [tuple(self.best)]
        rows = self.ranking[self.ranking["z_vs_best"].notna() & (self.ranking["z_vs_best"] < Z_NOISE)]
        return [tuple(l) for l in rows["layout"]] or [tuple(self.best)]

    def to_dict(self, top: int = 10) -> dict:
        rows = self.ranking.head(top).to_dict("records")
        for r in rows:
            r["layout"] = list(r["layout"])
            r["ce"], r["acc0"] = round(r["ce"], 4), round(r["acc0"], 4)
        return {"best_layout": list(self.best), "runner_up": list(self.runner_up) if self.runner_up else None,
                "margin": self.margin_ce, "margin_acc": self.margin_acc, "z": self.z, "mode": self.mode,
                "evaluations": self.evaluations, "seconds": self.seconds, "tokens": self.tokens,
                "ranking": rows, "notes": self.notes}


def _rank(scored: list[dict], num_layers: int, mode: str, t0: float, tokens: int) -> SearchResult:
    rows = [{"layout": s["layout"], "label": layout_label(s["layout"], num_layers),
             "ce": float(s["ce"].mean()), "acc0": float(s["hit"].mean())} for s in scored]
    df = pd.DataFrame(rows).sort_values(["ce", "acc0"], ascending=[True, False]).reset_index(drop=True)
    df.insert(0, "rank", range(1, len(df) + 1))
    best = df.loc[0, "layout"]
    runner = df.loc[1, "layout"] if len(df) > 1 else None
    z = margin_ce = margin_acc = float("nan")
    by = {s["layout"]: s for s in scored}
    df["z_vs_best"] = [0.0 if i == 0 else round(_paired_z(by[l]["ce"], by[best]["ce"]), 2)
                       for i, l in enumerate(df["layout"])]
    if runner is not None:
        margin_ce = float((by[runner]["ce"] - by[best]["ce"]).mean())
        z = float(df.loc[1, "z_vs_best"])
        margin_acc = float(by[best]["hit"].mean() - by[runner]["hit"].mean())
    return SearchResult(df, best, runner, round(margin_ce, 6), round(margin_acc, 4), round(z, 2), mode,
                        len(df), round(time.perf_counter() - t0, 2), tokens)


def _paired_z(ce_a: torch.Tensor, ce_b: torch.Tensor) -> float:
    """z of mean(ce_a - ce_b) over tokens: how many standard errors a is worse than b."""
    diff = (ce_a - ce_b).flatten()
    return float(diff.mean()) / (float(diff.std()) / math.sqrt(diff.numel()) + 1e-12)


def _score(sp: SlotProjections, layouts, progress: bool, desc: str, chunk: int = 8) -> list[dict]:
    out = []
    bar = tqdm(total=len(layouts), desc=desc, disable=not progress, mininterval=1.0)
    for i in range(0, len(layouts), 64):
        out.extend(sp.score_step0(layouts[i:i + 64], chunk))
        bar.update(len(layouts[i:i + 64]))
    bar.close()
    return out


@torch.no_grad()
def rerank(draft, caps: TargetCaptures, result: SearchResult, top: int = 12, steps: int = 2,
           include=()) -> SearchResult:
    """Re-score the leaders on every captured token with ``steps`` draft steps.

    The sweep scores step 0 on a subset for speed; neighbouring layouts can sit within its
    noise. Later steps feed the draft its own state, built from ``fc``'s output, so they
    amplify a wrong slot; the leaders are re-ranked by the summed cross-entropy of all steps.
    """
    t0 = time.perf_counter()
    leaders = [tuple(l) for l in result.ranking["layout"].head(top)]
    # e.g. the served layout
    leaders += [tuple(l) for l in include if l is not None and tuple(l) not in leaders]
    sp = SlotProjections(draft, caps)
    scored = []
    for lay in leaders:
        h = sum(sp.proj[s][b] for s, b in enumerate(lay))
        logits = draft.ttt_forward(sp.ids, h, steps, projected=True)
        t = sp.ids.shape[1]
        n = t - steps
        ce = 0
        for j, lg in enumerate(logits):
            p = caps.draft_probs[: sp.n, 1 + j:1 + j + n].float()
            ce = ce - (p * F.log_softmax(lg[:, :n].float(), -1)).sum(-1)
        pred = draft.to_target_ids(logits[0][:, :n].argmax(-1))
        hit = (pred == caps.target_argmax[: sp.n, 1:1 + n]).float()
        scored.append({"layout": lay, "ce": ce / steps, "hit": hit})
    out = _rank(scored, caps.num_layers, f"{result.mode}+rerank", t0, scored[0]["hit"].numel())
    out.ranking["scored_by"] = f"{steps}-step ce, all tokens"
    rest = result.ranking[~result.ranking["layout"].map(tuple).isin(set(leaders))].copy()
    rest["rank"] = range(len(out.ranking) + 1, len(out.ranking) + 1 + len(rest))
    rest["scored_by"] = "step-0 ce, sweep tokens"   # the two ce columns are not comparable across this line
    rest["z_vs_best"] = float("nan")
    out.ranking = pd.concat([out.ranking, rest], ignore_index=True)
    out.evaluations = result.evaluations
    out.seconds = round(result.seconds + out.seconds, 2)
    extra = len(leaders) - min(top, len(result.ranking))
    out.notes = [f"top {top} of the {result.mode} search" + (f" and {extra} named layout(s)" if extra else "")
                 + f" re-ranked on {out.tokens} tokens with {steps} draft steps"]
    return out


def full_search(draft, caps: TargetCaptures, windows: int | None = 4, progress: bool = True,
                rerank_top: int = 12, include=()) -> SearchResult:
    """Every ordered tuple of distinct boundaries (1716 for 13 boundaries and 3 slots)."""
    t0 = time.perf_counter()
    sp = SlotProjections(draft, caps, windows)
    layouts = list(itertools.permutations(sorted(caps.states), draft.cfg.num_aux))
    res = _rank(_score(sp, layouts, progress, "full search"), caps.num_layers, "full", t0, sp.labels.numel())
    return rerank(draft, caps, res, rerank_top, include=include) if rerank_top else res


def permutation_search(draft, caps: TargetCaptures, boundaries, windows: int | None = None) -> SearchResult:
    """Every order of one set of boundaries: does the draft care about slot order?"""
    t0 = time.perf_counter()
    sp = SlotProjections(draft, caps, windows)
    layouts = list(itertools.permutations(tuple(boundaries)))
    return _rank(_score(sp, layouts, False, "permutations"), caps.num_layers, "permutations", t0,
                 sp.labels.numel())


def slot_sweep(draft, caps: TargetCaptures, base, windows: int | None = None,
               progress: bool = False) -> pd.DataFrame:
    """Each slot of ``base`` swapped for every boundary, the others fixed: the heatmap's data."""
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
                      progress: bool = True, include=()) -> SearchResult:
    """For large L: improve one slot at a time from a few starting layouts, then try every
    order of the winner. Costs about starts x rounds x slots x (L+1) evaluations, not (L+1)^slots."""
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
    return rerank(draft, caps, _rank(list(cache.values()), L, "coordinate", t0, sp.labels.numel()),
                  include=include)


def search(draft, caps: TargetCaptures, mode: str = "auto", windows: int | None = 4, progress: bool = True,
           include=()) -> SearchResult:
    """``include``: layouts always scored by the final measure (the served and recorded ones), so a
    verdict about them never rests on the coarser sweep."""
    n = math.perm(len(caps.states), draft.cfg.num_aux)
    if mode == "auto":
        mode = "full" if n <= 3000 else "coordinate"
    if mode == "full":
        return full_search(draft, caps, windows, progress, include=include)
    if mode == "coordinate":
        return coordinate_search(draft, caps, windows=windows, progress=progress, include=include)
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
