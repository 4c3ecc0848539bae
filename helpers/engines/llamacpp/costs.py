"""What one speculative round costs on ``llama-server``, in decode steps: the break-even accept length.

Speculation pays when a round's tokens (the accept length) outnumber what the round costs in plain decode
steps. Three costs, each llama.cpp's own ``timings`` on this host's real kernels, per prompt:

- **decode**: a baseline request's ``predicted_ms / predicted_n`` (one token at a time);
- **verify of k+1 tokens**: the target alone, the prompt cached (``cache_prompt``), then the same prompt
  with k+1 more tokens: the second request's ``prompt_ms`` is one forward over a batch of k+1 tokens at
  that context, what a verify costs (its ``prompt_n`` is kept, since llama.cpp may re-read a token);
- **round**: a speculative request's ``predicted_ms`` over its draft rounds (llama.cpp's
  ``spec_decode_num_drafts`` for that request): verify plus k draft steps, as served.

The draft step is derived, (round - verify) / k, and said to be. The break-even accept length is round /
decode. The two sides of every prompt run back to back, the one that goes first alternating
(``timing.baseline_first``), so a drift of the machine falls on both.
"""
from __future__ import annotations

import os
import statistics
from dataclasses import asdict, dataclass

from ...live.timing import baseline_first
from .engine import LlamacppEngine


@dataclass(frozen=True)
class RoundCosts:
    """Per-prompt costs (milliseconds) on one llama.cpp build, and what they mean together."""

    engine: str
    steps: int
    decode_ms: tuple[float, ...]
    verify_ms: tuple[float, ...]
    verify_tokens: tuple[int, ...]       # the batch each verify timing covered (llama.cpp's prompt_n)
    round_ms: tuple[float, ...]
    rounds: tuple[int, ...]
    load_per_core: float = 0.0           # the load average per core when the measurement started

    @property
    def noisy(self) -> list[str]:
        """Why these medians may not be this host's costs: the machine was busy, or one cost's prompts
        disagree by more than a quarter (its upper quartile over its lower)."""
        busy = self.load_per_core > 1.0
        why = [f"load {self.load_per_core:.1f} per core before it started"] if busy else []
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
                f"{self.break_even_tau:.2f} (median of {len(self.decode_ms)} prompts)"
                + (f"; noisy: {'; '.join(self.noisy)}" if self.noisy else ""))


def _decode_ms(base: LlamacppEngine, prompt: list[int], max_tokens: int) -> float:
    t = base.completion(prompt, max_tokens).get("timings") or {}
    return float(t["predicted_ms"]) / max(1, int(t["predicted_n"]))


def _verify_ms(base: LlamacppEngine, prompt: list[int], extra: list[int]) -> tuple[float, int]:
    """The target's forward over ``extra`` (k+1 tokens) after ``prompt``, the prompt already cached."""
    ask = {"n_predict": 1, "temperature": 0.0, "top_k": 1, "cache_prompt": True, "ignore_eos": True,
           "seed": 0, "stream": False}
    base._post("/completion", {"prompt": [int(x) for x in prompt], **ask})
    t = base._post("/completion", {"prompt": [int(x) for x in prompt + extra], **ask}).get("timings") or {}
    return float(t["prompt_ms"]), int(t["prompt_n"])


def _round_ms(spec: LlamacppEngine, prompt: list[int], max_tokens: int) -> tuple[float, int]:
    gen = spec.generate([prompt], max_tokens)
    t = gen.timings[0]
    return float(t["predicted_ms"]) / max(1, gen.drafts), gen.drafts


def measure(base: LlamacppEngine, spec: LlamacppEngine, prompt_ids: list[list[int]], *, steps: int,
            max_new_tokens: int, bar=None) -> RoundCosts:
    """The three costs for each prompt, on a baseline and a speculative server already started (each
    paused while the other works, where it can be)."""
    dec, ver, vtok, rnd, rounds = [], [], [], [], []
    load = os.getloadavg()[0] / max(1, os.cpu_count() or 1) if hasattr(os, "getloadavg") else 0.0
    for i, p in enumerate(prompt_ids):
        spec.pause()
        base.resume()
        extra = base.completion(p, steps + 1)["tokens"][: steps + 1]   # the target's own continuation

        def baseline_side():
            spec.pause()
            base.resume()
            dec.append(_decode_ms(base, p, max_new_tokens))
            v, n = _verify_ms(base, p, [int(x) for x in extra])
            ver.append(v)
            vtok.append(n)

        def spec_side():
            base.pause()
            spec.resume()
            r, n = _round_ms(spec, p, max_new_tokens)
            rnd.append(r)
            rounds.append(n)

        for side in ((baseline_side, spec_side) if baseline_first(i, 0) else (spec_side, baseline_side)):
            side()
        if bar is not None:
            bar.update(1)
    base.resume()
    spec.resume()
    return RoundCosts(f"llamacpp=={base.version}", steps, tuple(dec), tuple(ver), tuple(vtok), tuple(rnd),
                      tuple(rounds), round(load, 2))
