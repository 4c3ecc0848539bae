"""What a draft should reach on the traffic an export describes: the temperature the traffic is judged
at, the figures shipped beside the draft (its speculation profile, its training record) at that temperature,
and, above 0, the engine's own acceptance rule (``rules.acceptance``). ``metrics.metrics_verdict`` adds the
workbook's own evaluation where a target is given."""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..profile import SpeculationProfile
from ..rules import acceptance
from .exports import ServedProfile

DEFAULT_API_TEMPERATURE = 1.0  # what vLLM, SGLang and llama.cpp sample at when a request names none


@dataclass
class Expected:
    rates: list[float]  # per position, marginal (a draft's positions 0..i accepted)
    source: str  # where the figures came from
    temperature: float | None = 0.0  # the sampling they describe (0: greedy verification)

    def accept_length(self, k: int | None = None) -> float:
        return 1.0 + sum(self.rates[:k] if k else self.rates)


def profile_expected(prof: SpeculationProfile, k: int, temperature: float) -> Expected | None:
    if prof.steps < k or prof.temperature is None or abs(prof.temperature - temperature) > 1e-9:
        return None
    where = prof.path.name if prof.path else "speculation profile"
    return Expected(list(prof.marginal[:k]), f"{where}: {prof.source or 'a recorded profile'}", temperature)


def temperature_of(profile: ServedProfile, temperature: float | None) -> tuple[float, str]:
    """The temperature the traffic is judged at, and what it rests on."""
    if temperature is not None:
        return temperature, "--temperature"
    if profile.temperature is not None:
        return profile.temperature, f"the traffic's ({profile.temperature_source})"
    return 0.0, ("not in the source: greedy (0) assumed"
                 + (f"; {profile.temperature_source}" if profile.temperature_source else ""))


def shipped_expected(shipped, record, k: int, temps: list[float]) -> dict[float, Expected | None]:
    """What the draft should reach per temperature from what ships beside it: its speculation profile, else
    (greedy only) the training record's per-step validation accuracy."""
    expected: dict[float, Expected | None] = {}
    for t in temps:
        e = profile_expected(shipped, k, t) if shipped and k else None
        full = record.full_acc if record else None
        if e is None and t == 0 and full and len(full) >= k > 0:
            e = Expected(list(full[:k]), "training record: teacher-forced validation accuracy per step", 0.0)
        expected[t] = e
    return expected


def acceptance_rule(profile: ServedProfile, engine, served_on, temps: list[float]):
    """Above temperature 0 each engine accepts by its own rule, read from its release (``rules.acceptance``);
    the traffic's sampler where the responses say it. (None, None) when every temperature is greedy."""
    if not any(t > 0 for t in temps):
        return None, None
    release = None if engine is None else (engine.version or engine.effective_version)
    rule, why_recorded = acceptance.rule_for(profile.engine, release, served_on or profile.device)
    if profile.sampler is not None and profile.sampler != rule.sampler:   # the traffic's, where it says
        rule = replace(rule, sampler=profile.sampler,
                       where=(*rule.where, "the sampler: the responses' generation_settings"))
    return rule, why_recorded
