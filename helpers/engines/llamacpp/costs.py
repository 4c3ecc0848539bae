"""What one speculative round costs on ``llama-server``, in decode steps: the break-even accept length.

Speculation pays when a round's tokens (the accept length) outnumber what the round costs in plain decode
steps. Three costs, each llama.cpp's own ``timings`` on this host's real kernels:

- **decode**: each baseline request of the paired run, its ``predicted_ms / predicted_n`` (one token at a
  time);
- **round**: each speculative request of the paired run, its ``predicted_ms`` over its draft rounds
  (llama.cpp's ``spec_decode_num_drafts`` for that request): verify plus k draft steps, as served;
- **verify of k+1 tokens**: measured after the paired run, per prompt, on the baseline server alone: the
  prompt cached (``cache_prompt``), then the same prompt with the first k+1 tokens of its baseline
  continuation: the second request's ``prompt_ms`` is one forward over a batch of k+1 tokens at that
  context, what a verify costs (its ``prompt_n`` is kept, since llama.cpp may re-read a token).

Decode and round come from the very requests the speed ratio was timed on
(``live.bench.PairedGenerations``: counterbalanced pairs, so a drift of the machine falls on both sides), so
nothing is generated twice. The draft step is derived, (round - verify) / k, and said to be. The break-even
accept length is round / decode.
"""
from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass

from ...live.bench import PairedGenerations
from .engine import LlamacppEngine


@dataclass(frozen=True)
class RoundCosts:
    """Per-request costs (milliseconds) on one llama.cpp build, and what they mean together."""

    engine: str
    steps: int
    decode_ms: tuple[float, ...]
    verify_ms: tuple[float, ...]
    verify_tokens: tuple[int, ...]       # the batch each verify timing covered (llama.cpp's prompt_n)
    round_ms: tuple[float, ...]
    rounds: tuple[int, ...]
    load_per_core: float = 0.0           # the 1-minute load average per core when the costs were read

    @property
    def noisy(self) -> list[str]:
        """Why these medians may not be this host's costs: the machine was busy, or one cost's prompts
        disagree by more than a quarter (its upper quartile over its lower)."""
        busy = self.load_per_core > 1.0
        why = [f"load {self.load_per_core:.1f} per core over the last minute"] if busy else []
        for name, xs in (("decode", self.decode_ms), ("verify", self.verify_ms), ("round", self.round_ms)):
            if len(xs) >= 2:
                q = statistics.quantiles(xs, n=4, method="inclusive")
                if q[0] > 0 and q[2] / q[0] > 1.25:
                    why.append(f"{name} varies {q[2] / q[0]:.1f}x between prompts")
        return why

    @staticmethod
    def _mid(xs) -> float:
        return float(statistics.median(xs)) if xs else float("nan")

    @property
    def decode(self) -> float:
        return self._mid(self.decode_ms)

    @property
    def verify(self) -> float:
        return self._mid(self.verify_ms)

    @property
    def round(self) -> float:
        return self._mid(self.round_ms)

    @property
    def draft_step(self) -> float:
        """Derived: what a round costs beyond its verify, per draft token."""
        return (self.round - self.verify) / self.steps

    @property
    def verify_over_decode(self) -> float:
        return self.verify / self.decode

    @property
    def break_even_tau(self) -> float:
        """The accept length at which a round's tokens pay for it: round / decode."""
        return self.round / self.decode

    def to_dict(self) -> dict:
        return asdict(self) | {
            "decode": round(self.decode, 3), "verify": round(self.verify, 3), "round": round(self.round, 3),
            "draft_step": round(self.draft_step, 3), "draft_step_is": "derived: (round - verify) / steps",
            "verify_over_decode": round(self.verify_over_decode, 3),
            "break_even_tau": round(self.break_even_tau, 3), "noisy": self.noisy}

    def line(self) -> str:
        return (f"{self.engine}: decode {self.decode:.2f} ms, verify of {self.steps + 1} tokens "
                f"{self.verify:.2f} ms ({self.verify_over_decode:.2f} decodes), draft step "
                f"{self.draft_step:.2f} ms (derived), round {self.round:.2f} ms -> break-even accept length "
                f"{self.break_even_tau:.2f} (medians of {len(self.decode_ms)} requests, verify of "
                f"{len(self.verify_ms)} prompts)"
                + (f"; noisy: {'; '.join(self.noisy)}" if self.noisy else ""))


def _decode_ms(gen) -> float:
    t = gen.timings[0]
    return float(t["predicted_ms"]) / max(1, int(t["predicted_n"]))


def _round_ms(gen) -> float:
    return float(gen.timings[0]["predicted_ms"]) / max(1, gen.drafts)


def _verify_ms(base: LlamacppEngine, prompt: list[int], extra: list[int]) -> tuple[float, int]:
    """The target's forward over ``extra`` (k+1 tokens) after ``prompt``, the prompt already cached."""
    ask = {"n_predict": 1, "temperature": 0.0, "top_k": 1, "cache_prompt": True, "ignore_eos": True,
           "seed": 0, "stream": False}
    base._post("/completion", {"prompt": [int(x) for x in prompt], **ask})
    t = base._post("/completion", {"prompt": [int(x) for x in prompt + extra], **ask}).get("timings") or {}
    return float(t["prompt_ms"]), int(t["prompt_n"])


def measure(base: LlamacppEngine, spec: LlamacppEngine, prompt_ids: list[list[int]], *, steps: int,
            every: PairedGenerations) -> RoundCosts:
    """The three costs: decode and round from every request of the paired run (``every``), verify measured
    now for each prompt on the baseline server (the speculative one paused where it can be)."""
    load = os.getloadavg()[0] / max(1, os.cpu_count() or 1) if hasattr(os, "getloadavg") else 0.0
    dec = tuple(_decode_ms(g) for g in every.baseline)
    rounds = tuple(max(1, g.drafts) for g in every.speculative)
    rnd = tuple(_round_ms(g) for g in every.speculative)
    ver, vtok = [], []
    first = {}
    for i, g in zip(every.prompt, every.baseline):
        first.setdefault(i, g.tokens[0][: steps + 1])   # the target's own continuation
    spec.pause()
    base.resume()
    try:
        for i, p in enumerate(prompt_ids):
            v, n = _verify_ms(base, p, [int(x) for x in first[i]])
            ver.append(v)
            vtok.append(n)
    finally:
        spec.resume()
    return RoundCosts(f"llamacpp=={base.version}", steps, dec, tuple(ver), tuple(vtok), rnd, rounds,
                      round(load, 2))


@dataclass(frozen=True)
class VerifyCurve:
    """On a baseline server alone: a decode step, and a verify's cost for each batch size, in milliseconds
    (medians over the prompts): what choosing a round's length needs before any draft is served."""

    engine: str
    decode: float
    verify: dict[int, float]             # batch size n (k draft tokens + 1) -> ms

    def over_decode(self, n: int) -> float:
        return self.verify[n] / self.decode


def verify_curve(base: LlamacppEngine, prompt_ids: list[list[int]], sizes: list[int], *,
                 decode_tokens: int = 32) -> VerifyCurve:
    """Each prompt decoded once (``decode_tokens``, at least the largest size), then verified at every
    size in ``sizes`` with the first n tokens of that continuation, the prompt cached."""
    dec, ver = [], {n: [] for n in sizes}
    for p in prompt_ids:
        body = base.completion(p, max(decode_tokens, max(sizes)))
        t = body.get("timings") or {}
        dec.append(float(t["predicted_ms"]) / max(1, int(t["predicted_n"])))
        cont = [int(x) for x in body["tokens"]]
        for n in sizes:
            ver[n].append(_verify_ms(base, p, cont[:n])[0])
    return VerifyCurve(f"llamacpp=={base.version}", float(statistics.median(dec)),
                       {n: float(statistics.median(v)) for n, v in ver.items()})
