"""A reference EAGLE-3 engine: greedy baseline and chain speculation, fed like SGLang feeds it.

The draft is fed the target's fused features for the layout of a ``CapturePlan`` -- the
same object the isolated test and the reports use -- so serving with the deployed wiring
or with the training wiring is this same code with a different plan.

One speculation round (``speculative_round``):
  1. the draft proposes k tokens: its cache already holds every verified column, so the
     last extend gave proposal 1; k-1 chain steps feed back its own pre-norm state;
  2. the target verifies the pending token plus the k proposals in one forward, capturing
     the plan's boundaries on the way;
  3. the longest agreeing prefix is accepted, plus the target's own next token (the bonus);
  4. both KV caches are cut back to the verified length, and the draft is extended over
     the accepted columns with the target's features at those columns.
At temperature 0 the output equals the baseline's token for token; ``check_lossless``
verifies it on every prompt the benchmark runs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..boundaries import CapturePlan
from ..errors import NonFiniteResult
from .capture import capture_boundaries
from .draft import DraftKVCache, Eagle3Draft


def rollback(cache, length: int) -> None:
    """Cut a Hugging Face cache back to ``length`` tokens (its ``crop`` takes a count to remove)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


@dataclass
class GenerationResult:
    tokens: list[int]
    seconds: float
    verify_steps: int = 0
    accepted: list[int] = field(default_factory=list)   # accepted draft tokens per verify step
    k: int = 0
    draft_seconds: float = 0.0      # time inside draft forwards (extend + chain)
    verify_seconds: float = 0.0     # time inside target verify forwards
    draft_calls: int = 0

    @property
    def tok_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds else 0.0

    @property
    def tau(self) -> float:
        """SGLang's accept length: tokens produced per verify step (accepted + bonus)."""
        return (sum(self.accepted) + len(self.accepted)) / len(self.accepted) if self.accepted else 1.0


# -- the target -------------------------------------------------------------------------


class TargetRunner:
    """The target with a KV cache, capturing the plan's boundaries on every forward."""

    def __init__(self, model, plan: CapturePlan | None = None):
        from transformers import DynamicCache

        self.model = model
        self.plan = plan
        self.cache = DynamicCache(config=model.config)

    @property
    def length(self) -> int:
        return self.cache.get_seq_length()

    @torch.no_grad()
    def forward(self, ids: torch.Tensor):
        """[1, n] new tokens -> (logits [n, V], fused feature [n, width] or None)."""
        if self.plan is None:
            out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True)
            return out.logits[0], None
        with capture_boundaries(self.model, self.plan.layout) as store:
            out = self.model(input_ids=ids, past_key_values=self.cache, use_cache=True)
        fused = torch.cat([store[b][0] for b in self.plan.layout], -1)
        return out.logits[0], fused

    def rollback(self, length: int) -> None:
        rollback(self.cache, length)


def prefill(runner: TargetRunner, prompt: torch.Tensor):
    logits, fused = runner.forward(prompt[None])
    return int(logits[-1].argmax()), fused


def decode_one_token(runner: TargetRunner, token: int) -> int:
    logits, _ = runner.forward(torch.tensor([[token]], device=runner.model.device))
    return int(logits[-1].argmax())


@torch.no_grad()
def baseline_generate(model, prompt: torch.Tensor, max_new_tokens: int) -> GenerationResult:
    """Plain KV-cached greedy decoding: one target forward per token."""
    t0 = time.perf_counter()
    runner = TargetRunner(model)
    token, _ = prefill(runner, prompt)
    out = [token]
    while len(out) < max_new_tokens:
        token = decode_one_token(runner, token)
        out.append(token)
    return GenerationResult(out, time.perf_counter() - t0)


# -- the draft --------------------------------------------------------------------------


class DraftRunner:
    """The draft with its cache; ``columns`` counts verified columns (target-fed entries)."""

    def __init__(self, draft: Eagle3Draft, max_len: int = 4096):
        p = next(draft.parameters())
        self.draft = draft
        self.cache = DraftKVCache(draft.cfg, 1, max_len, p.device, p.dtype)
        self.columns = 0

    def extend(self, next_tokens: torch.Tensor, fused: torch.Tensor):
        """Columns fed (token t+1, target feature at t): returns proposal 1 and the state to chain from."""
        n = next_tokens.numel()
        pos = torch.arange(self.columns, self.columns + n, device=fused.device)[None]
        logits, state = self.draft.step(next_tokens[None], fused[None].to(self.cache.k.dtype), pos,
                                        self.cache)
        if not bool(torch.isfinite(logits[0, -1]).all()):  # argmax of NaN is token 0: a silent tau of 1.0
            raise NonFiniteResult(f"the draft's logits are NaN/Inf at position {self.columns + n - 1}: its "
                                  f"weights or the features fed to it overflow, so no accept length it gives "
                                  f"can be trusted")
        self.columns += n
        return int(self.draft.to_target_ids(logits[0, -1].argmax())), state[:, -1:]

    def chain(self, first: int, state: torch.Tensor, k: int) -> list[int]:
        """k-1 more proposals, each fed the previous proposal and the draft's own state."""
        proposals = [first]
        last_col = self.columns - 1
        for j in range(1, k):
            tok = torch.tensor([[proposals[-1]]], device=state.device)
            pos = torch.tensor([[last_col + j]], device=state.device)
            logits, state = self.draft.step(tok, state, pos, self.cache)
            proposals.append(int(self.draft.to_target_ids(logits[0, -1].argmax())))
        self.cache.crop(self.columns)
        return proposals


def accept(proposals: list[int], target_next: list[int]) -> int:
    """Length of the longest prefix of proposals the target agrees with, greedily."""
    n = 0
    while n < len(proposals) and proposals[n] == target_next[n]:
        n += 1
    return n


def speculative_round(target: TargetRunner, draft: DraftRunner, pending: int, proposal: int,
                      state: torch.Tensor, k: int, clock: dict | None = None):
    """One draft-verify-accept-extend cycle -> (new tokens, accepted count, next pending, proposal, state).

    ``clock`` (optional) accumulates seconds spent in the draft and in the verify forward,
    which is what says whether accuracy or overhead limits the speedup.
    """
    t0 = time.perf_counter()
    proposals = draft.chain(proposal, state, k)
    t1 = time.perf_counter()
    base = target.length
    ids = torch.tensor([[pending] + proposals], device=target.model.device)
    logits, fused = target.forward(ids)
    target_next = logits.argmax(-1).tolist()
    t2 = time.perf_counter()
    n = accept(proposals, target_next)
    bonus = target_next[n]
    target.rollback(base + n + 1)
    new_tokens = proposals[:n] + [bonus]
    next_ids = torch.tensor(new_tokens, device=fused.device)
    proposal, state = draft.extend(next_ids, fused[: n + 1])
    if clock is not None:
        clock["draft"] += (t1 - t0) + (time.perf_counter() - t2)
        clock["verify"] += t2 - t1
    return new_tokens, n, bonus, proposal, state


@torch.no_grad()
def speculative_generate(model, draft: Eagle3Draft, plan: CapturePlan, prompt: torch.Tensor,
                         max_new_tokens: int, k: int = 5) -> GenerationResult:
    if len(plan.layout) != draft.cfg.num_aux:
        raise ValueError(f"plan {plan.layout} has {len(plan.layout)} slots; the draft's fc takes "
                         f"{draft.cfg.num_aux}")
    t0 = time.perf_counter()
    target = TargetRunner(model, plan)
    runner = DraftRunner(draft, max_len=prompt.numel() + max_new_tokens + 2 * k + 8)
    pending, fused = prefill(target, prompt)
    next_tokens = torch.cat([prompt[1:], torch.tensor([pending], device=prompt.device)])
    proposal, state = runner.extend(next_tokens, fused)
    out = [pending]
    accepted = []
    clock = {"draft": 0.0, "verify": 0.0}
    while len(out) < max_new_tokens:
        new, n, pending, proposal, state = speculative_round(target, runner, pending, proposal, state, k,
                                                             clock)
        out.extend(new)
        accepted.append(n)
    return GenerationResult(out[:max_new_tokens], time.perf_counter() - t0, len(accepted), accepted, k,
                            clock["draft"], clock["verify"], len(accepted) * k)


# -- metrics ------------------------------------------------------------------------------


def acceptance_histogram(results: list[GenerationResult]) -> list[int]:
    """How many verify steps accepted 0, 1, ..., k draft tokens."""
    k = max((r.k for r in results), default=0)
    hist = [0] * (k + 1)
    for r in results:
        for n in r.accepted:
            hist[n] += 1
    return hist


def position_acceptance(results: list[GenerationResult]) -> list[float]:
    """P(draft position i accepted), over every verify step: how fast the chain decays."""
    hist = acceptance_histogram(results)
    total = sum(hist)
    return [sum(hist[i + 1:]) / total if total else 0.0 for i in range(len(hist) - 1)]


def check_lossless(baseline: GenerationResult, spec: GenerationResult) -> bool:
    return baseline.tokens == spec.tokens
