"""Scoring a draft fed a given layout, teacher-forced on text, without any engine.

One target forward captures every boundary once (``TargetCaptures``); every layout
evaluation afterwards is just the draft run on a different concatenation of those
captures. Metrics follow speculators: ``full_acc_k`` (steps 0..k all right),
``cond_acc_k`` (step k right given 0..k-1 were), plus SpecForge's simulated accept length
``1 + a0 + a0*a1 + ...`` and a likelihood score (cross-entropy of the draft against the
target's own distribution).

Layouts are ranked by the simulated accept length, kept per token: at each position, one
token (the verifier's own) plus the leading run of draft steps whose top token equals the
target's greedy token there. That is what greedy verification accepts, so it is what an engine
rewards; cross-entropy over all steps lets the later steps, where every layout is poor, outweigh
a clear step-0 gap (docs/dumps.md, "Ranking"). The paired test that says whether two layouts
can be told apart runs on that same per-token count, over blocks of tokens.

Traffic sampled at a temperature T > 0 is verified by speculative (rejection) sampling, which
accepts a draft token with probability ``sum_v min(p_T, q_T)``; ``sampled_acceptance`` scores a
layout by that, chained along the same teacher-forced text, and at T = 0 gives the greedy figures.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..boundaries import check_layout
from ..errors import InputError
from ..judgement import BLOCK, PairedTest
from ..model.capture import capture_boundaries, decoder_parts
from ..rules.acceptance import Sampler, Verify


class EvalInputError(InputError):
    """Text too short, or a layout the draft cannot take."""


RANKED_BY = "expected accepted tokens per verify step (greedy verification, simulated accept length)"


def accepted_run(correct: list[torch.Tensor]) -> torch.Tensor:
    """Per column, 1 + the leading run of correct draft steps: the tokens one verify step keeps
    under greedy verification (the verifier's own token plus the accepted draft tokens).
    Columns past the last step's labels are cut off, as in ``accuracy_table``."""
    n = correct[-1].shape[-1]
    run = torch.ones_like(correct[0][..., :n], dtype=torch.bool)
    total = torch.ones(run.shape, dtype=torch.float32, device=run.device)
    for c in correct:
        run = run & c[..., :n].bool()
        total += run
    return total


def token_blocks(values: torch.Tensor | list[torch.Tensor], masks=None) -> torch.Tensor:
    """Means over blocks of about ``BLOCK`` consecutive tokens, within each row (window or record)
    and never across rows: the paired test's units. Each row is cut into pieces that differ in
    length by at most one token, so every block weighs about the same."""
    rows = list(values) if not isinstance(values, torch.Tensor) or values.dim() > 1 else [values]
    out = []
    for i, v in enumerate(rows):
        v = v.float().flatten()
        if masks is not None:
            v = v[masks[i].flatten().bool()]
        if v.numel():
            out += [p.mean() for p in torch.tensor_split(v, max(1, round(v.numel() / BLOCK)))]
    return torch.stack(out) if out else torch.zeros(0)


def paired_test(a_blocks: torch.Tensor, b_blocks: torch.Tensor) -> PairedTest:
    """Paired z of ``a - b`` over blocks. The standard deviation is floored at ``1 / BLOCK``, the
    step one token makes in a block's mean: a degenerate sample (one block, or identical
    differences) then gives a large but finite z instead of infinity, and with fewer than
    ``MIN_BLOCKS`` blocks nothing is called significant at all."""
    d = (a_blocks.float() - b_blocks.float()).flatten()
    nb = int(d.numel())
    if nb == 0:
        return PairedTest(0.0, 0.0, 0.0, 0)
    sd = float(d.std()) if nb > 1 else 0.0
    se = max(sd, 1.0 / BLOCK) / math.sqrt(nb)
    mean = float(d.mean())
    return PairedTest(mean, se, mean / se, nb)


@dataclass(frozen=True)
class EvalText:
    """The text a target's captures were taken on: where it came from, and how much of it they hold."""

    path: str | None       # None: text given as a string
    origin: str            # "--text", "beside the target", "the workbook's embedded held-out text", ...
    tokens: int            # tokens in the whole text
    window: int            # tokens per window
    windows: int           # windows captured
    ids: tuple[int, ...] = field(default=(), repr=False, compare=False)   # the whole text, tokenized

    @property
    def available(self) -> int:
        """Windows the whole text holds."""
        return self.tokens // self.window

    @property
    def line(self) -> str:
        where = self.path or "text given as a string"
        return (f"evaluated on {where} ({self.origin}): {self.windows} windows of {self.window} tokens, "
                f"{self.windows * self.window:,} of its {self.tokens:,} tokens")

    def to_dict(self) -> dict:
        return {"path": self.path, "origin": self.origin, "tokens": self.tokens, "window": self.window,
                "windows": self.windows, "windows_available": self.available}


@dataclass
class TargetCaptures:
    """Every boundary's state on some text, and what the target itself predicts there."""

    input_ids: torch.Tensor            # [N, T]
    states: dict[int, torch.Tensor]    # boundary -> [N, T, H] (float16 to save memory)
    target_argmax: torch.Tensor        # [N, T] target's greedy next token at each position
    num_layers: int
    draft_probs: torch.Tensor | None = None   # [N, T, Vd] target distribution over a draft vocab
    loss_mask: torch.Tensor | None = None
    text: EvalText | None = None              # what text, and how much of it (``pair.eval_captures``)

    @property
    def tokens(self) -> int:
        return int(self.input_ids.numel())

    def fused(self, layout, idx=slice(None)) -> torch.Tensor:
        return torch.cat([self.states[b][idx].float() for b in layout], -1)

    def extended(self, more: TargetCaptures, text: EvalText | None = None) -> TargetCaptures:
        """These windows followed by ``more``'s (the same boundaries), as one capture."""
        cat = lambda a, b: None if a is None or b is None else torch.cat([a, b])   # noqa: E731
        return TargetCaptures(torch.cat([self.input_ids, more.input_ids]),
                              {b: torch.cat([v, more.states[b]]) for b, v in self.states.items()},
                              torch.cat([self.target_argmax, more.target_argmax]), self.num_layers,
                              cat(self.draft_probs, more.draft_probs), cat(self.loss_mask, more.loss_mask),
                              text or self.text)


@torch.no_grad()
def verifier_logits(target, final_state: torch.Tensor) -> torch.Tensor:
    """Target logits from its pre-norm final state (boundary L): norm, then lm_head."""
    _, _, norm = decoder_parts(target)
    head = target.get_output_embeddings()
    return head(norm(final_state.to(head.weight.dtype))).float()


@torch.no_grad()
def capture_text(target, windows: torch.Tensor, boundaries=None, batch: int = 8,
                 progress: bool = False) -> TargetCaptures:
    """Run the target over [N, T] token windows once, keeping the asked boundaries (default: all)."""
    _, layers, _ = decoder_parts(target)
    L = len(layers)
    wanted = sorted(set(range(L + 1) if boundaries is None else boundaries) | {L})
    chunks: dict[int, list] = {b: [] for b in wanted}
    argmax = []
    rng = range(0, windows.shape[0], batch)
    for s in tqdm(rng, desc="capture", disable=not progress):
        x = windows[s:s + batch]
        with capture_boundaries(target, wanted) as store:
            out = target(input_ids=x, use_cache=False)
        for b in wanted:
            chunks[b].append(store[b].to(torch.float16))
        argmax.append(out.logits.argmax(-1))
    return TargetCaptures(windows, {b: torch.cat(v) for b, v in chunks.items()}, torch.cat(argmax), L)


@torch.no_grad()
def attach_draft_probs(target, caps: TargetCaptures, draft_token_ids: torch.Tensor, batch: int = 8) -> None:
    """Target distribution restricted to the draft vocabulary: the soft label of TTT."""
    out = []
    for s in range(0, caps.input_ids.shape[0], batch):
        logits = verifier_logits(target, caps.states[caps.num_layers][s:s + batch].float())
        out.append(F.softmax(logits[..., draft_token_ids], -1).to(torch.float16))
    caps.draft_probs = torch.cat(out)


@dataclass
class LayoutScore:
    layout: tuple[int, ...]
    steps: int
    full_acc: list[float]
    cond_acc: list[float]
    ce: float                 # step-0 cross-entropy vs the target distribution (nats; lower = better)
    tokens: int
    acc_se: float = 0.0       # standard error of step-0 accuracy
    extra: dict = field(default_factory=dict)
    accepted: torch.Tensor | None = field(default=None, repr=False)   # [N, n] per-token accepted_run

    def blocks(self) -> torch.Tensor:
        """This score's paired-test units (``token_blocks`` of the per-token accepted counts)."""
        if self.accepted is None:
            raise ValueError(f"the score of {self.layout} kept no per-token counts")
        return token_blocks(self.accepted)

    @property
    def acc0(self) -> float:
        return self.full_acc[0]

    @property
    def sim_accept_length(self) -> float:
        """SpecForge's ``1 + a0 + a0*a1 + ...`` from conditional accuracies."""
        total, run = 1.0, 1.0
        for a in self.cond_acc:
            run *= a
            total += run
        return total

    def to_dict(self) -> dict:
        return {"layout": list(self.layout), "steps": self.steps, "full_acc": self.full_acc,
                "cond_acc": self.cond_acc, "acc0": self.acc0, "ce": self.ce,
                "sim_accept_length": self.sim_accept_length, "tokens": self.tokens, "acc_se": self.acc_se}


def step_correct(draft, logits_list, target_argmax: torch.Tensor) -> list[torch.Tensor]:
    """Per step j, whether the draft's top token (as a target id) equals the target's greedy
    token at position t+1+j; columns with no such position are cut off at the end."""
    t = target_argmax.shape[1]
    out = []
    for j, logits in enumerate(logits_list):
        n = t - 1 - j
        pred = draft.to_target_ids(logits[:, :n].argmax(-1))
        out.append(pred == target_argmax[:, 1 + j:1 + j + n])
    return out


def accuracy_table(correct: list[torch.Tensor],
                   mask: torch.Tensor | None = None) -> tuple[list[float], list[float], float]:
    """(full_acc_k, cond_acc_k, se of acc_0) over columns where every step has a label."""
    steps = len(correct)
    n = correct[-1].shape[1]
    run = torch.ones_like(correct[0][:, :n], dtype=torch.bool)
    m = torch.ones_like(run) if mask is None else mask[:, :n].bool()
    full, cond, prev = [], [], float(m.sum())
    for j in range(steps):
        run = run & correct[j][:, :n]
        hit = float((run & m).sum())
        full.append(hit / max(float(m.sum()), 1.0))
        cond.append(hit / prev if prev else 0.0)
        prev = hit
    p = full[0]
    se = (p * (1 - p) / max(float(m.sum()), 1.0)) ** 0.5
    return full, cond, se


def _draft_layout(draft, caps: TargetCaptures, layout) -> tuple[int, ...]:
    """``layout`` checked against the target's boundaries and the draft's fc width."""
    layout = check_layout(layout, caps.num_layers)
    if len(layout) != draft.cfg.num_aux:
        raise EvalInputError(f"layout {layout} has {len(layout)} slots; the draft's fc takes "
                             f"{draft.cfg.num_aux} x {draft.cfg.target_hidden_size} = {draft.cfg.fc_in}")
    return layout


def _check_window(caps: TargetCaptures, steps: int) -> None:
    if caps.input_ids.shape[1] < steps + 2:
        raise EvalInputError(f"windows of {caps.input_ids.shape[1]} tokens are too short for {steps} draft "
                             f"steps")


@torch.no_grad()
def evaluate_layout(draft, caps: TargetCaptures, layout, steps: int = 1, batch: int = 16,
                    max_windows: int | None = None, zero_features: bool = False) -> LayoutScore:
    """The draft teacher-forced on ``caps`` with ``layout`` as its fused input.

    ``zero_features`` feeds zeros in place of every captured feature: the floor the draft
    reaches from token embeddings and its own context alone. A served layout scoring near it
    carries nothing the draft can use; one scoring above it still carries part of the signal.
    """
    layout = _draft_layout(draft, caps, layout)
    n_win = caps.input_ids.shape[0] if max_windows is None else min(max_windows, caps.input_ids.shape[0])
    _check_window(caps, steps)
    corr_chunks, ce_sum, ce_n = [[] for _ in range(steps)], 0.0, 0
    for s in range(0, n_win, batch):
        idx = slice(s, min(s + batch, n_win))
        ids = caps.input_ids[idx]
        fused = caps.fused(layout, idx)
        if zero_features:
            fused = torch.zeros_like(fused)
        logits = draft.ttt_forward(ids, fused, steps)
        for j, c in enumerate(step_correct(draft, logits, caps.target_argmax[idx])):
            corr_chunks[j].append(c)
        if caps.draft_probs is not None:
            p = caps.draft_probs[idx][:, 1:].float()
            logq = F.log_softmax(logits[0][:, :-1].float(), -1)
            ce_sum += float(-(p * logq).sum(-1).sum())
            ce_n += p.shape[0] * p.shape[1]
    correct = [torch.cat(c) for c in corr_chunks]
    full, cond, se = accuracy_table(correct)
    tokens = int(correct[-1].numel())
    return LayoutScore(tuple(layout), steps, [round(x, 4) for x in full], [round(x, 4) for x in cond],
                       round(ce_sum / ce_n, 4) if ce_n else float("nan"), tokens, round(se, 4),
                       accepted=accepted_run(correct))


# --------------------------------------------------------------------------------------
# Speculative sampling at a temperature

ROWS = 256         # columns of one window whose target distribution is held at once (memory ~ ROWS x vocab)


def check_temperature(temperature) -> float:
    """``temperature`` as a float: 0 (greedy) or a finite positive number, else ``EvalInputError``."""
    try:
        t = float(temperature)
    except (TypeError, ValueError):
        raise EvalInputError(f"temperature {temperature!r} is not a number; expected 0 (greedy) or a "
                             f"finite positive number") from None
    if isinstance(temperature, bool) or not math.isfinite(t) or t < 0:
        raise EvalInputError(f"temperature {temperature!r} is out of range; expected 0 (greedy) or a "
                             f"finite positive number")
    return t


def overlap(target_logits: torch.Tensor, draft_logits: torch.Tensor, draft_token_ids: torch.Tensor,
            temperature: float) -> torch.Tensor:
    """Speculative sampling's acceptance probability of one draft token, ``sum_v min(p_T, q_T)``.

    ``target_logits`` [..., V] over the target vocabulary, ``draft_logits`` [..., Vd] over the
    draft's, whose entry ``d`` is target token ``draft_token_ids[d]``; both are divided by
    ``temperature`` (> 0) and softmaxed. The draft's probability is carried into the target
    vocabulary (summed where two draft ids name one target token), so a target token outside the
    draft vocabulary has q = 0 and adds nothing. Returns [...], in [0, 1].
    """
    return _overlap_p(F.softmax(target_logits.float() / temperature, -1), draft_logits, draft_token_ids,
                      temperature)


def _overlap_p(p: torch.Tensor, draft_logits: torch.Tensor, draft_token_ids: torch.Tensor,
               temperature: float) -> torch.Tensor:
    """``overlap`` with the target's tempered distribution ``p`` already computed."""
    q = F.softmax(draft_logits.float().to(p.device) / temperature, -1)
    q_target = torch.zeros_like(p).index_add_(-1, draft_token_ids.to(p.device), q)
    return torch.minimum(p, q_target).sum(-1).clamp_(0.0, 1.0)


def sampler_probs(target_logits: torch.Tensor, temperature: float, sampler: Sampler) -> torch.Tensor:
    """The target's distribution as the engine samples from it: ``softmax(logits / T)`` restricted by the
    engine's default top-k, top-p and min-p (each acting on what the previous kept, renormalized), before the
    temperature where the engine applies them first (llama.cpp's chain), after it otherwise."""
    logits = target_logits.float()
    if not sampler.filters_first:
        logits = logits / temperature
    if not sampler.off:
        if sampler.top_k > 0 and sampler.top_k < logits.shape[-1]:
            kth = logits.topk(sampler.top_k, -1).values[..., -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if sampler.top_p < 1.0:
            srt, idx = logits.sort(-1, descending=True)
            cum = F.softmax(srt, -1).cumsum(-1)
            drop = (cum - F.softmax(srt, -1)) >= sampler.top_p     # keep the smallest prefix reaching top_p
            logits = logits.scatter(-1, idx, srt.masked_fill(drop, float("-inf")))
        if sampler.min_p > 0.0:
            p = F.softmax(logits, -1)
            logits = logits.masked_fill(p < sampler.min_p * p.max(-1, keepdim=True).values, float("-inf"))
    if sampler.filters_first:
        logits = logits / temperature
    return F.softmax(logits, -1)


@dataclass
class SampledScore:
    """Expected acceptance of a draft chain under speculative sampling at ``temperature``."""

    layout: tuple[int, ...]
    steps: int
    temperature: float
    marginal: list[float]      # expected P(draft tokens 0..i all accepted), per position i
    conditional: list[float]   # marginal_i / marginal_{i-1} (marginal_{-1} = 1)
    overlap: list[float]       # mean acceptance probability of step j alone, unchained
    accept_length: float       # 1 + sum(marginal): expected tokens per verify step
    tokens: int
    chain: torch.Tensor | None = field(default=None, repr=False)     # [steps, N, n] the marginal per token
    accepted: torch.Tensor | None = field(default=None, repr=False)  # [N, n] per token, 1 + chain.sum(0)

    def blocks(self, position: int | None = None) -> torch.Tensor:
        """``token_blocks`` of the per-token expected accepted tokens, or with ``position`` of that
        position's chain term: the units of a standard error or of a paired test."""
        if self.accepted is None or self.chain is None:
            raise ValueError(f"the sampled score of {self.layout} kept no per-token figures")
        return token_blocks(self.accepted if position is None else self.chain[position])

    def se(self, position: int | None = None) -> float:
        """Standard error over blocks of ``accept_length``, or of ``marginal[position]``."""
        b = self.blocks(position)
        return float(b.std() / math.sqrt(b.numel())) if b.numel() > 1 else float("nan")

    def to_dict(self) -> dict:
        return {"layout": list(self.layout), "steps": self.steps, "temperature": self.temperature,
                "marginal": self.marginal, "conditional": self.conditional, "overlap": self.overlap,
                "accept_length": round(self.accept_length, 4), "tokens": self.tokens,
                "accept_length_se": round(self.se(), 4) if self.accepted is not None else None}


@torch.no_grad()
def sampled_acceptance(draft, target, caps: TargetCaptures, layout, steps: int, temperature: float,
                       batch: int = 16, rows: int = ROWS, max_windows: int | None = None,
                       verify: Verify = Verify.SPECULATIVE, sampler: Sampler = Sampler()) -> SampledScore:
    """The draft teacher-forced on ``caps`` with ``layout``, scored as speculative sampling at
    ``temperature`` would accept it, or as an engine's own rule does (``verify``, ``rules.acceptance``):
    ``TARGET_ONLY`` accepts the draft's argmax with the target's probability of it under the engine's
    ``sampler`` (``sampler_probs``); ``GREEDY`` is temperature 0's argmax match whatever ``temperature``.

    Per column t and draft step j, ``alpha_j(t) = sum_v min(p_T(v), q_T(v))``: p_T the target's
    next-token distribution at the position step j predicts (from the captured pre-norm final
    state through ``verifier_logits``), q_T the draft's step-j distribution carried into the target
    vocabulary, both ``softmax(logits / T)``. Draft token i is accepted only if 0..i-1 were, so
    ``marginal[i]`` is the mean over columns of ``prod_{j<=i} alpha_j(t)`` and ``accept_length``
    is ``1 + sum(marginal)``, over the same columns as ``evaluate_layout``.

    An approximation, as the greedy figures are: every step is fed the text's own next tokens, so
    the chain runs along the teacher-forced text, whereas in serving step j is fed the tokens the
    draft sampled and the target accepted, and the columns are weighted by the text, not by what
    the target samples at T. The steps' acceptances are multiplied as if independent given that
    text. ``T == 0`` is greedy verification: the argmax indicator of ``step_correct``, so the
    figures equal ``evaluate_layout``'s ``full_acc`` and ``cond_acc`` (``target`` is not used).

    Memory: the draft runs ``batch`` windows at a time, as in ``evaluate_layout``; the target's
    distribution is held for ``rows`` columns of one window at a time (a few ``rows x vocab``
    float32 tensors).
    """
    t_ = 0.0 if verify is Verify.GREEDY else check_temperature(temperature)
    if steps < 1:
        raise EvalInputError(f"steps must be at least 1, got {steps}")
    layout = _draft_layout(draft, caps, layout)
    _check_window(caps, steps)
    if rows < 1 or batch < 1:
        raise EvalInputError(f"batch and rows must be at least 1, got {batch} and {rows}")
    n_win = caps.input_ids.shape[0] if max_windows is None else min(max_windows, caps.input_ids.shape[0])
    n = caps.input_ids.shape[1] - steps          # columns where every step has a label
    final = caps.states[caps.num_layers]
    ids_t = draft.draft_token_ids
    alpha_chunks: list[list[torch.Tensor]] = [[] for _ in range(steps)]
    for s in range(0, n_win, batch):
        idx = slice(s, min(s + batch, n_win))
        logits = draft.ttt_forward(caps.input_ids[idx], caps.fused(layout, idx), steps)
        if t_ == 0:
            for j, c in enumerate(step_correct(draft, logits, caps.target_argmax[idx])):
                alpha_chunks[j].append(c[:, :n].float())
            continue
        per_step = [torch.empty(logits[0].shape[0], n) for _ in range(steps)]
        for w in range(logits[0].shape[0]):
            for c0 in range(0, n, rows):
                c1 = min(c0 + rows, n)
                # step j at column c predicts position c + 1 + j: rows c0+1 .. c1+steps cover every step
                vl = verifier_logits(target, final[s + w, c0 + 1:c1 + steps].float())
                if verify is Verify.TARGET_ONLY:
                    p = sampler_probs(vl, t_, sampler)
                    for j in range(steps):
                        tok = ids_t.to(p.device)[logits[j][w, c0:c1].argmax(-1).to(p.device)]
                        per_step[j][w, c0:c1] = p[j:j + c1 - c0].gather(-1, tok[:, None]).squeeze(-1).cpu()
                    continue
                p = F.softmax(vl / t_, -1)
                for j in range(steps):
                    a = _overlap_p(p[j:j + c1 - c0], logits[j][w, c0:c1], ids_t, t_)
                    per_step[j][w, c0:c1] = a.cpu()
        for j in range(steps):
            alpha_chunks[j].append(per_step[j])
    alphas = [torch.cat(a).cpu() for a in alpha_chunks]                    # steps x [N, n]
    if t_ == 0:
        full, cond, _ = accuracy_table([a.bool() for a in alphas])
        chain = torch.cumprod(torch.stack(alphas), 0)
        accepted = accepted_run([a.bool() for a in alphas])
    else:
        chain = torch.cumprod(torch.stack(alphas), 0)
        full = [float(c.double().mean()) for c in chain]
        cond, prev = [], 1.0
        for m in full:
            cond.append(m / prev if prev else 0.0)
            prev = m
        accepted = 1.0 + chain.sum(0)
    return SampledScore(tuple(layout), steps, t_, [round(x, 4) for x in full], [round(x, 4) for x in cond],
                        [round(float(a.double().mean()), 4) for a in alphas],
                        float(accepted.double().mean()), int(alphas[-1].numel()), chain, accepted)
