"""Start from the dashboard: the per-position acceptance a serving engine already exports, beside what
the draft should reach, and which explanation fits.

A miswired draft has a fingerprint in numbers every deployment already has: vLLM's
``vllm:spec_decode_num_accepted_tokens_per_pos`` counters (and its periodic "SpecDecoding metrics"
log line), SGLang's per-request ``spec_correct_drafts_histogram``, llama.cpp's "acceptance rate per
position" line. This module reads any of them into one ``ServedProfile`` (counts, not rates: the
counts say how sure a rate is), and ``explain`` sets it beside the expected profile (the training
record's per-step accuracy, or the workbook's own teacher-forced evaluation) and, where the target is
known, the profile the engine's predicted served layout simulates to.
``metrics_verdict`` gathers those (the record first; the pair loaded only when a target is given) and
calls ``explain``.

Formats, read from the engines' own source:
- vLLM 0.32 ``v1/spec_decode/metrics.py``: counters ``vllm:spec_decode_num_drafts``,
  ``..._num_draft_tokens``, ``..._num_accepted_tokens`` and ``..._num_accepted_tokens_per_pos``
  (label ``position``), exported with prometheus_client's ``_total`` suffix; the log line "SpecDecoding
  metrics: Mean acceptance length: %.2f, ..., Accepted: %d tokens, Drafted: %d tokens, Per-position
  acceptance rate: %s, ...".
- SGLang 0.5.23 ``meta_info``: ``spec_correct_drafts_histogram`` (verify steps with 0..k correct
  drafts), ``spec_verify_ct``, ``completion_tokens``.
- llama.cpp server log: "draft acceptance = 0.62008 ( 1797 accepted / 2898 generated), mean acceptance
  length = 2.24, acceptance rate per position = (0.727, 0.513)".
"""
from __future__ import annotations

import json
import math
import re
import urllib.request
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

from ..errors import BadOption, BadText, check_loopback, read_text_file
from ..model.draft import forward_verdict, run_as
from ..record import read_record
from .evaluate import evaluate_layout
from .pair import eval_captures, load_pair

Z95 = 1.959964
MIN_DRAFTS = 30          # fewer draft rounds than this say nothing about a rate but its order of magnitude
BROKEN = 0.05            # step-0 acceptance whose upper bound stays below this: the draft predicts nothing
TOLERANCE = 0.05         # serving may fall this far below a teacher-forced figure without a finding


class Explanation(StrEnum):
    OK = "ok"
    WIRING = "wiring"
    IGNORED_FLAG = "ignored-flag"
    ENGINE_DIFFERS = "engine-differs"
    WEAK_DRAFT = "weak-draft"
    BROKEN_DRAFT = "broken-draft"
    UNDETERMINED = "undetermined"


def wilson(k: int, n: int) -> tuple[float, float]:
    """The 95% Wilson interval of k successes in n: honest at small n and near 0 or 1."""
    if n <= 0:
        return 0.0, 1.0
    p = k / n
    d = 1 + Z95 ** 2 / n
    c = (p + Z95 ** 2 / (2 * n)) / d
    h = Z95 * math.sqrt(p * (1 - p) / n + Z95 ** 2 / (4 * n * n)) / d
    return max(0.0, c - h), min(1.0, c + h)


@dataclass(frozen=True)
class ServedProfile:
    """What the engine reports over some traffic: draft rounds and, per draft position, how many of
    them had that position accepted."""

    engine: str                         # vllm | sglang | llama.cpp
    source: str                         # prometheus | vllm-log | llamacpp-log | sglang-responses
    where: str
    drafts: int
    accepted_per_position: tuple[int, ...]
    notes: tuple[str, ...] = ()

    @property
    def accepted(self) -> int:
        return sum(self.accepted_per_position)

    @property
    def accept_length(self) -> float:
        return 1 + self.accepted / self.drafts if self.drafts else 1.0

    @property
    def rates(self) -> list[float]:
        return [a / self.drafts if self.drafts else 0.0 for a in self.accepted_per_position]

    def per_position(self) -> list[dict]:
        return [{"position": i, "rate": round(r, 4), "accepted": a, "drafts": self.drafts,
                 "interval": [round(x, 4) for x in wilson(a, self.drafts)]}
                for i, (a, r) in enumerate(zip(self.accepted_per_position, self.rates))]


# --------------------------------------------------------------------------------------
# Reading a source


_PROM = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_VLLM_LOG = re.compile(r"SpecDecoding metrics:.*?Accepted:\s*(\d+)\s*tokens,\s*Drafted:\s*(\d+)\s*tokens,"
                       r"\s*Per-position acceptance rate:\s*([\d.,\s]+?)(?:,\s*Avg|$)")
_LLAMA_LOG = re.compile(r"draft acceptance\s*=\s*[\d.]+\s*\(\s*(\d+)\s*accepted\s*/\s*(\d+)\s*generated\)"
                        r".*?mean acceptance length\s*=\s*([\d.]+).*?acceptance rate per position\s*=\s*"
                        r"\(([\d.,\s]+)\)")


def _prometheus(text: str, where: str) -> ServedProfile | None:
    drafts = 0.0
    per_pos: dict[int, float] = {}
    sg_len = sg_calls = None
    for line in text.splitlines():
        m = _PROM.match(line.strip())
        if not m or line.startswith("#"):
            continue
        name, labels, raw = m["name"].removesuffix("_total"), m["labels"] or "", m["value"]
        try:
            value = float(raw)
        except ValueError:
            continue
        if name == "vllm:spec_decode_num_drafts":
            drafts += value
        elif name == "vllm:spec_decode_num_accepted_tokens_per_pos":
            pos = re.search(r'position="(\d+)"', labels)
            if pos:
                per_pos[int(pos[1])] = per_pos.get(int(pos[1]), 0.0) + value
        elif name == "sglang:spec_accept_length":
            sg_len = value
        elif name == "sglang:spec_verify_calls":
            sg_calls = (sg_calls or 0.0) + value
    if per_pos or drafts:
        counts = tuple(int(round(per_pos.get(i, 0.0))) for i in range(max(per_pos, default=-1) + 1))
        return ServedProfile("vllm", "prometheus", where, int(round(drafts)), counts)
    if sg_len is not None:
        raise BadText(f"{where}: SGLang's scrape holds the accept length ({sg_len:.3f}) but no per-position "
                      f"counts; pass the requests' responses (a JSON list of their meta_info, which carries "
                      f"spec_correct_drafts_histogram) to see each position")
    return None


def _vllm_log(text: str, where: str) -> ServedProfile | None:
    drafts, per_pos = 0, []
    for m in _VLLM_LOG.finditer(text):
        rates = [float(x) for x in m[3].replace(" ", "").split(",") if x]
        if not rates:
            continue
        n = int(m[2]) // len(rates)                      # drafted tokens = drafts x k
        drafts += n
        per_pos = [a + round(r * n) for a, r in zip(per_pos + [0] * len(rates), rates)]
    return ServedProfile("vllm", "vllm-log", where, drafts, tuple(per_pos)) if drafts else None


def _llamacpp_log(text: str, where: str) -> ServedProfile | None:
    found = list(_LLAMA_LOG.finditer(text))
    if not found:
        return None
    m = found[-1]                  # the server prints running totals: the last line holds them all
    accepted, mean_len = int(m[1]), float(m[3])
    rates = [float(x) for x in m[4].replace(" ", "").split(",") if x]
    drafts = round(accepted / (mean_len - 1)) if mean_len > 1 else int(m[2]) // max(len(rates), 1)
    return ServedProfile("llama.cpp", "llamacpp-log", where, drafts, tuple(round(r * drafts) for r in rates),
                         ("drafts recovered from the logged mean acceptance length",))


def _sglang(obj, where: str) -> ServedProfile:
    items = obj if isinstance(obj, list) else [obj]
    hist: list[int] = []
    used = 0
    for i, it in enumerate(items):
        meta = it.get("meta_info", it) if isinstance(it, dict) else None
        if not isinstance(meta, dict):
            raise BadText(f"{where}: item {i} is a JSON {type(it).__name__}; expected an SGLang response or "
                          f"its meta_info object")
        h = meta.get("spec_correct_drafts_histogram")
        if h is None:
            continue
        if not isinstance(h, list) or not all(isinstance(x, int) and x >= 0 for x in h):
            raise BadText(f"{where}: item {i}'s spec_correct_drafts_histogram is {str(h)[:60]}; expected a "
                          f"list of counts")
        hist = [a + b for a, b in zip(hist + [0] * len(h), h + [0] * len(hist))][:max(len(h), len(hist))]
        used += 1
    if not used:
        raise BadText(f"{where}: no item carries spec_correct_drafts_histogram; expected SGLang responses "
                      f"served with speculative decoding (sglang >= 0.5.23 meta_info)")
    drafts = sum(hist)
    per_pos = tuple(sum(hist[j] for j in range(i + 1, len(hist))) for i in range(len(hist) - 1))
    return ServedProfile("sglang", "sglang-responses", where, drafts, per_pos,
                         (f"{used} of {len(items)} responses carried a histogram",))


def _fetch(url: str, timeout: float) -> str:
    host = urllib.parse.urlsplit(url).hostname or ""
    try:
        check_loopback(host)
    except ValueError as exc:
        raise BadOption(f"--metrics {url}: {exc}") from None
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.read().decode("utf-8", errors="replace")
    except OSError as exc:
        raise BadOption(f"--metrics {url}: cannot read it ({getattr(exc, 'reason', exc)}); expected a "
                        f"running engine's /metrics") from None


def read_metrics(source: str | Path, timeout: float = 10.0) -> ServedProfile:
    """Any supported source -> a ServedProfile, or one BadText naming the source and what it lacked."""
    text_source = str(source)
    if text_source.startswith(("http://", "https://")):
        where, text = text_source, _fetch(text_source, timeout)
    else:
        path = Path(source)
        if not path.is_file():
            raise BadOption(f"--metrics {source}: no such file (expected a /metrics scrape, a vLLM or "
                            f"llama.cpp log, or a JSON list of SGLang responses)")
        where, text = str(path), read_text_file(path, "metrics file")
    stripped = text.lstrip()
    if stripped.startswith(("[", "{")):
        try:
            return _sglang(json.loads(text), where)
        except json.JSONDecodeError as exc:
            raise BadText(f"{where} is not valid JSON ({exc.msg} at line {exc.lineno}); expected a list of "
                          f"SGLang responses") from None
    for reader in (_prometheus, _vllm_log, _llamacpp_log):
        found = reader(text, where)
        if found is not None:
            if not found.drafts:
                raise BadText(f"{where}: the engine reports 0 draft rounds; nothing was speculated yet")
            return found
    raise BadText(f"{where}: no speculative-decoding metrics found (looked for vllm:spec_decode_* counters, "
                  f"vLLM's 'SpecDecoding metrics' log line, llama.cpp's 'acceptance rate per position', "
                  f"SGLang responses)")


# --------------------------------------------------------------------------------------
# The judgement


@dataclass
class Expected:
    rates: list[float]                  # per position, unconditional (a draft's position i accepted)
    source: str                         # where the figures came from


@dataclass
class MetricsVerdict:
    profile: ServedProfile
    expected: Expected | None
    served_predicted: Expected | None   # the predicted served layout simulated on text
    served_layout: tuple[int, ...] | None
    trained_layout: tuple[int, ...] | None
    explanation: Explanation
    evidence: list[str] = field(default_factory=list)
    next: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        p = self.profile
        return {"engine": p.engine, "source": p.source, "where": p.where, "drafts": p.drafts,
                "per_position": p.per_position(), "accept_length": round(p.accept_length, 4),
                "expected_per_position": None if self.expected is None else
                [round(x, 4) for x in self.expected.rates],
                "expected_source": None if self.expected is None else self.expected.source,
                "served_predicted_per_position": None if self.served_predicted is None else
                [round(x, 4) for x in self.served_predicted.rates],
                "served_predicted_source": None if self.served_predicted is None else
                self.served_predicted.source,
                "served_layout": None if self.served_layout is None else list(self.served_layout),
                "trained_layout": None if self.trained_layout is None else list(self.trained_layout),
                "explanation": str(self.explanation), "evidence": self.evidence, "next": self.next,
                "notes": list(p.notes)}


def _below(k: int, n: int, target: float) -> bool:
    """The observed rate is below ``target`` by more than the tolerance, beyond what n draws allow."""
    return wilson(k, n)[1] < target - TOLERANCE


def _consistent(k: int, n: int, target: float) -> bool:
    lo, hi = wilson(k, n)
    return lo - TOLERANCE <= target <= hi + TOLERANCE


def explain(profile: ServedProfile, expected: Expected | None, served_predicted: Expected | None = None,
            served_layout=None, trained_layout=None, ignored_flags: tuple[str, ...] = ()) -> MetricsVerdict:
    """Which explanation the counts support, and no more: every comparison is made at position 0
    (the one every draft round reaches) with its Wilson interval."""
    n, acc = profile.drafts, profile.accepted_per_position
    v = MetricsVerdict(profile, expected, served_predicted,
                       None if served_layout is None else tuple(served_layout),
                       None if trained_layout is None else tuple(trained_layout), Explanation.UNDETERMINED)
    if not acc:
        v.evidence.append("the source reports no per-position counts")
        return v
    lo0, hi0 = wilson(acc[0], n)
    v.evidence.append(f"position 0 accepted in {acc[0]} of {n} draft rounds: {acc[0] / n:.3f} "
                      f"[{lo0:.3f}, {hi0:.3f}] (95% Wilson)")
    if n < MIN_DRAFTS:
        v.evidence.append(f"{n} draft rounds are too few to tell one explanation from another "
                          f"(at least {MIN_DRAFTS})")
        v.next.append("collect more traffic, then read the metrics again")
        return v
    mismatch = (served_layout is not None and trained_layout is not None
                and tuple(served_layout) != tuple(trained_layout))
    if hi0 < BROKEN and not mismatch:
        v.explanation = Explanation.BROKEN_DRAFT
        v.evidence.append(f"acceptance stays below {BROKEN:.0%} even at the interval's top: the draft "
                          f"predicts nothing the target says (wrong checkpoint, vocabulary map or weights)"
                          + ("" if served_layout is not None else "; or a wiring this far off: pass --target "
                                                                  "to compare the layouts"))
        v.next.append("python -m helpers check --target T --draft D")
        return v
    if expected is None:
        v.evidence.append("nothing says what this draft should reach: no training record with per-step "
                          "accuracy, and no target to evaluate it on")
        v.next.append("python -m helpers diagnose --metrics SRC --draft D --target T")
        return v
    e0 = expected.rates[0]
    if not _below(acc[0], n, e0):
        if mismatch:        # acceptance alone cannot clear a draft fed other states than it learned
            v.explanation = Explanation.WIRING
            v.evidence.append(f"it reaches the expected {e0:.3f} ({expected.source}), so this traffic is "
                              f"easier than the draft's validation text; but the engine's rules predict it "
                              f"serves {tuple(served_layout)} and the draft was trained on "
                              f"{tuple(trained_layout)}: fed its training layout it would accept more")
            if served_predicted is not None:
                v.evidence.append(f"on the same held-out text the served layout simulates to "
                                  f"{served_predicted.rates[0]:.3f} at position 0 against {e0:.3f}")
            v.next.append("python -m helpers check --target T --draft D --engine E (this release's fix)")
            return v
        v.explanation = Explanation.OK
        v.evidence.append(f"it reaches the expected {e0:.3f} ({expected.source}) within {TOLERANCE:.2f}")
        return v
    v.evidence.append(f"below the expected {e0:.3f} ({expected.source}) beyond the counts' interval")
    p0 = served_predicted.rates[0] if served_predicted is not None else None
    if mismatch:
        v.evidence.append(f"the engine's rules predict it serves {tuple(served_layout)}; the draft was "
                          f"trained on {tuple(trained_layout)}")
        if p0 is not None and _below(acc[0], n, p0):
            v.explanation = Explanation.ENGINE_DIFFERS
            v.evidence.append(f"below even the {p0:.3f} the served layout simulates to "
                              f"({served_predicted.source}): the engine computes something else besides the "
                              f"wiring")
            v.next.append("python -m helpers capture --backend ENGINE (measure what it feeds the draft)")
        else:
            v.explanation = Explanation.WIRING
            if p0 is not None:
                v.evidence.append(f"matching the {p0:.3f} the served layout simulates to "
                                  f"({served_predicted.source})")
            v.next.append("python -m helpers check --target T --draft D --engine E (this release's fix)")
        return v
    if ignored_flags:
        v.explanation = Explanation.IGNORED_FLAG
        v.evidence.append(f"the engine ignores {', '.join(ignored_flags)}, which the draft was trained with")
        v.next.append("python -m helpers check --target T --draft D --engine E")
        return v
    if served_layout is None or trained_layout is None:
        v.evidence.append("served and trained layouts unknown here: pass --target (and --engine) to compare "
                          "them")
        v.next.append("python -m helpers diagnose --metrics SRC --draft D --target T --engine E")
        return v
    if p0 is not None and _below(acc[0], n, p0):
        v.explanation = Explanation.ENGINE_DIFFERS
        v.evidence.append(f"served = trained, yet below the {p0:.3f} that layout simulates to on this text "
                          f"({served_predicted.source}): the engine computes something else (a kernel or "
                          f"forward bug)")
        v.next.append("python -m helpers capture --backend ENGINE, then check --measured")
        return v
    v.explanation = Explanation.WEAK_DRAFT
    v.evidence.append("served = trained by the engine's rules: the draft does worse on this traffic than in "
                      "training (a weak draft, or a workload unlike its training data)")
    v.next.append("python -m helpers diagnose --draft D --target T --text SAMPLE_OF_YOUR_TRAFFIC")
    return v


def metrics_verdict(source, draft_dir, target_dir=None, engine=None, text=None, windows: int = 12,
                    device: str = "cpu", progress: bool = False) -> MetricsVerdict:
    """The served profile beside what the draft should reach: the training record's per-step accuracy
    first, else the draft teacher-forced at its trained layout on held-out text; with a target, the
    layout ``engine`` is predicted to serve, simulated on the same text."""
    profile = read_metrics(source)                       # before any weights load: a bad source fails fast
    k = len(profile.accepted_per_position)
    record = read_record(draft_dir)
    trained = record.layout if record else None
    expected = None
    full = record.full_acc if record else None
    if full and len(full) >= k > 0:
        expected = Expected(list(full[:k]), "training record: teacher-forced validation accuracy per step")
    served_pred = served = None
    notes = []
    if target_dir is not None and k:
        pair = load_pair(target_dir, draft_dir, device)
        trained = trained or pair.recorded_layout
        plan = pair.served(engine)
        served = tuple(plan.layout) if not plan.errors else None
        caps = eval_captures(pair, text, max_windows=windows)
        what = "--text" if text is not None else "held-out text"
        where = f"teacher-forced on {what} ({int(caps.input_ids.numel())} tokens)"
        with run_as(pair.draft, engine):
            if served is not None:
                s = evaluate_layout(pair.draft, caps, served, steps=k)
                served_pred = Expected(list(s.full_acc), f"{where} at the served layout {served}")
            if expected is None and trained is not None:
                t = evaluate_layout(pair.draft, caps, trained, steps=k)
                expected = Expected(list(t.full_acc), f"{where} at the trained layout {trained}")
        ignored = tuple(phrase for phrase in forward_verdict(pair.draft, engine)[0])
        notes.append(f"served layout from {plan.source}")
    else:
        ignored = ()
    v = explain(profile, expected, served_pred, served, trained, ignored)
    v.evidence += notes
    return v
