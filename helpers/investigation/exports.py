"""Every export a serving deployment already has, read into one ``ServedProfile``.

Formats, read from the engines' own source (docs/metrics.md has the table with file:line):

- Prometheus text (a scrape file, or a loopback ``/metrics`` URL):
  vLLM 0.32 ``vllm:spec_decode_num_drafts``, ``..._num_draft_tokens``, ``..._num_accepted_tokens``,
  ``..._num_accepted_tokens_per_pos{position}`` (counters, ``_total``); llama.cpp b11434 (``--metrics``)
  the same four under ``llamacpp:`` (tools/server/server-task.cpp:1565-1623); SGLang 0.5.23
  (``--enable-metrics``) counters ``sglang:spec_verify_calls_total`` and ``sglang:generation_tokens_total``
  (observability/metrics_collector.py:1860-1866, 2110-2112) and gauges ``sglang:spec_accept_length``,
  ``spec_accept_rate``, ``spec_num_steps`` ("mostrecent", :511-545): no per-position counts.
- Logs: vLLM's "SpecDecoding metrics: ..." (each line covers the interval since the last one, so lines add
  up); llama.cpp's per-request "draft acceptance = R (A accepted / G generated), mean len = L" (INFO; the
  slot's stats reset per task, server-context.cpp:404, :715), its "acc per pos = (...)" (trace level) and
  "statistics draft-eagle3: ... #acc rate/pos = (...)" (cumulative, common/speculative.cpp:3053), and the
  older "mean acceptance length = ..., acceptance rate per position = (...)"; SGLang's "Decode batch ...
  accept len: X, accept rate: Y" (a mean over each log interval, without its count).
- JSON: SGLang ``/generate`` responses (``meta_info.spec_correct_drafts_histogram``), its OpenAI responses
  with ``return_spec_tokens_details`` (``sglext.spec_tokens_details``), ``/server_info``
  (``internal_states[].avg_spec_accept_length``); vLLM responses with ``--per-request-spec-decode-metrics``
  (``metrics.speculative_decoding.acceptance_histogram``, v1/metrics/stats.py:350-421) or the offline API's
  ``spec_decode_metrics``; llama.cpp ``/completion`` responses (``timings.draft_n``,
  ``timings.draft_n_accepted``, server-common.cpp:99-102).

A histogram of accepted drafts per verify step and per-position counters are the same evidence: in a
chain, position i is accepted exactly in the steps that accepted more than i drafts. Totals (verify steps
and accepted tokens) give the accept length; a gauge gives only the engine's own average. What a source
lacks is said, with the flag or endpoint that would give it.

Two scrapes of the same counters make a window (``window``): the difference, with a counter that fell
(an engine restart) detected and said, and a "most recent" gauge labelled as such.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

from ..errors import BadOption, BadText, read_text_file
from ..profile import Z95, wilson
from ..rules.acceptance import Sampler


class Level(StrEnum):
    """How much a source says, best first."""

    COUNTS = "per-position counts"
    TOTALS = "totals"  # verify steps and accepted tokens, no positions
    GAUGE = "gauge"  # an engine's own average, no counts
    NONE = "none"


PER_POSITION_HINT = {
    "vllm": "vLLM's /metrics (vllm:spec_decode_num_accepted_tokens_per_pos_total) or "
    "--per-request-spec-decode-metrics summary responses",
    "sglang": "SGLang's responses: /generate meta_info (spec_correct_drafts_histogram), or /v1/completions "
    'with "return_spec_tokens_details": true (sglext.spec_tokens_details)',
    "llamacpp": "llama.cpp's /metrics with --metrics "
    "(llamacpp:spec_decode_num_accepted_tokens_per_pos_total)",
}


@dataclass(frozen=True)
class ServedProfile:
    """What the engine reports over some traffic. ``drafts``: verify steps (draft rounds);
    ``accepted_per_position[i]``: how many of them accepted draft position i."""

    engine: str  # vllm | sglang | llamacpp
    source: str  # vllm-prometheus, sglang-responses, llamacpp-log, ...
    where: str
    drafts: int | None
    accepted_per_position: tuple[int, ...] | None = None
    accepted: int | None = None  # accepted draft tokens, where no positions are given
    draft_tokens: int | None = None  # proposed draft tokens
    gauge: float | None = None  # the engine's own accept-length average, no count
    gauge_scope: str = ""  # what that average covers
    num_spec_tokens: int | None = None  # k, where the source says
    histogram: tuple[int, ...] | None = None  # verify steps with 0..k accepted drafts
    temperature: float | None = None  # the traffic's, where the source says
    temperature_source: str = ""
    notes: tuple[str, ...] = ()
    reset: bool = False  # a window across a counter reset (engine restart)
    device: str | None = None  # where the source says what the engine ran on ("cpu"): SGLang verifies by it
    sampler: Sampler | None = None  # the target's sampler, where the responses say (llama.cpp)

    @property
    def level(self) -> Level:
        if self.accepted_per_position and self.drafts:
            return Level.COUNTS
        if self.drafts and self.accepted is not None:
            return Level.TOTALS
        if self.gauge is not None:
            return Level.GAUGE
        return Level.NONE

    @property
    def total_accepted(self) -> int | None:
        if self.accepted_per_position is not None:
            return sum(self.accepted_per_position)
        return self.accepted

    @property
    def accept_length(self) -> float | None:
        """Tokens per verify step (the verifier's own included); None where nothing computed one."""
        if self.level in (Level.COUNTS, Level.TOTALS):
            return 1 + self.total_accepted / self.drafts
        return self.gauge

    @property
    def rates(self) -> list[float]:
        if self.level is not Level.COUNTS:
            return []
        return [a / self.drafts for a in self.accepted_per_position]

    def steps_histogram(self) -> tuple[int, ...] | None:
        """Verify steps with 0..k accepted drafts: given, or recovered from chain per-position counts."""
        if self.histogram:
            return self.histogram
        if self.level is not Level.COUNTS:
            return None
        a = [self.drafts, *self.accepted_per_position, 0]
        if any(y > x for x, y in zip(a, a[1:])):
            return None  # not a chain's counts (a tree, or a mixed scrape)
        return tuple(a[j] - a[j + 1] for j in range(len(a) - 1))

    def accept_interval(self) -> tuple[float, float, str] | None:
        """95% interval of the accept length, and how it was formed; None where the source cannot give one."""
        n, mean = self.drafts, self.accept_length
        if not n or mean is None or self.level is Level.GAUGE:
            return None
        hist = self.steps_histogram()
        if hist:
            m = sum(j * c for j, c in enumerate(hist)) / n
            var = sum(c * (j - m) ** 2 for j, c in enumerate(hist)) / max(n - 1, 1)
            h = Z95 * math.sqrt(var / n)
            how = "normal over verify steps, from their histogram"
        elif self.num_spec_tokens:
            m = mean - 1
            var = max(m * (self.num_spec_tokens - m), 0.0)  # Bhatia-Davis: the largest spread possible
            h = Z95 * math.sqrt(var / n)
            how = (
                f"normal with the largest variance {self.num_spec_tokens} draft tokens allow (Bhatia-Davis): "
                f"the source gives totals only"
            )
        else:
            return None
        return max(1.0, mean - h), mean + h, how

    def per_position(self) -> list[dict]:
        return [
            {
                "position": i,
                "rate": round(r, 4),
                "accepted": a,
                "drafts": self.drafts,
                "interval": [round(x, 4) for x in wilson(a, self.drafts)],
            }
            for i, (a, r) in enumerate(zip(self.accepted_per_position or (), self.rates))
        ]

    def missing(self) -> str:
        """What per-position evidence is missing, and where to get it ("" when nothing is)."""
        if self.level is Level.COUNTS:
            return ""
        return (
            f"this source has no per-position counts; "
            f"{PER_POSITION_HINT.get(self.engine, 'a source with them')} would give each position"
        )

    def to_dict(self) -> dict:
        iv = self.accept_interval()
        return {
            "engine": self.engine,
            "source": self.source,
            "where": self.where,
            "level": str(self.level),
            "drafts": self.drafts,
            "per_position": self.per_position() if self.level is Level.COUNTS else None,
            "accepted_tokens": self.total_accepted,
            "draft_tokens": self.draft_tokens,
            "accept_length": None if self.accept_length is None else round(self.accept_length, 4),
            "accept_length_interval": None if iv is None else [round(iv[0], 4), round(iv[1], 4)],
            "accept_length_interval_method": None if iv is None else iv[2],
            "gauge": self.gauge,
            "gauge_scope": self.gauge_scope or None,
            "num_spec_tokens": self.num_spec_tokens,
            "temperature": self.temperature,
            "temperature_source": self.temperature_source or None,
            "missing": self.missing() or None,
            "counter_reset": self.reset,
            "notes": list(self.notes),
        }


# --------------------------------------------------------------------------------------
# Prometheus text


_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class Family:
    """Whose metric names a scrape holds, and what shape of evidence that engine exports there."""

    engine: str
    prefix: str
    per_position: bool  # counters per draft position (vLLM, llama.cpp), else totals and gauges (SGLang)

    def __str__(self) -> str:
        return self.engine


FAMILIES = (
    Family("vllm", "vllm:", True),
    Family("sglang", "sglang:", False),
    Family("llamacpp", "llamacpp:", True),
)


# What a page says about the process behind it, fixed for the life of one boot: its start time
# (prometheus_client's process collector: vLLM's API server), or SGLang's startup durations per phase (a
# ``mostrecent`` gauge measured once per boot, srt/observability/metrics_collector.py
# ``sglang:startup_time_seconds``; its multiprocess registry exports neither a process collector nor
# ``_created``)
IDENTITY = ("process_start_time_seconds", "sglang:startup_time_seconds")


@dataclass(frozen=True)
class Scrape:
    """One Prometheus page: each series' value, keyed by (name without ``_total``, sorted labels)."""

    where: str
    series: dict[tuple[str, tuple[tuple[str, str], ...]], float]
    created: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    at: float | None = None  # seconds (time.time) when it was read, where known

    def identity(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        """The series that identify the process behind the page (``IDENTITY``): equal in two scrapes of one
        boot, different after a restart whatever the counters did."""
        return {key: v for key, v in self.series.items() if key[0] in IDENTITY}

    def family(self) -> Family | None:
        for fam in FAMILIES:
            if any(name.startswith(fam.prefix + "spec") for name, _ in self.series):
                return fam
        return None

    def total(self, name: str, **match) -> float | None:
        vals = [
            v
            for (n, labels), v in self.series.items()
            if n == name and all(dict(labels).get(k) == want for k, want in match.items())
        ]
        return sum(vals) if vals else None

    def by_label(self, name: str, label: str) -> dict[int, float]:
        out: dict[int, float] = {}
        for (n, labels), v in self.series.items():
            if n == name and dict(labels).get(label, "").isdigit():
                i = int(dict(labels)[label])
                out[i] = out.get(i, 0.0) + v
        return out


def parse_prometheus(text: str, where: str, at: float | None = None) -> Scrape | None:
    series, created = {}, {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m["value"])
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        labels = tuple(sorted(_LABEL.findall(m["labels"] or "")))
        name = m["name"]
        if name.endswith("_created"):
            created[(name.removesuffix("_created"), labels)] = value
            continue
        key = (name.removesuffix("_total"), labels)
        series[key] = series.get(key, 0.0) + value
    if not series:
        return None
    return Scrape(where, series, created, at)


def _from_scrape(
    s: Scrape, gauges_from: Scrape | None = None, window_note: str = "", reset: bool = False
) -> ServedProfile | None:
    fam = s.family()
    g = gauges_from or s
    notes = (window_note,) if window_note else ()
    if fam is None:
        return None
    if fam.per_position:
        p = f"{fam.prefix}spec_decode_"
        drafts = s.total(p + "num_drafts")
        per_pos = s.by_label(p + "num_accepted_tokens_per_pos", "position")
        accepted, draft_tokens = s.total(p + "num_accepted_tokens"), s.total(p + "num_draft_tokens")
        if drafts is None and not per_pos:
            return None
        counts = tuple(int(round(per_pos.get(i, 0.0))) for i in range(max(per_pos, default=-1) + 1))
        k = len(counts) or None
        return ServedProfile(
            fam.engine,
            f"{fam.engine}-prometheus",
            s.where,
            int(round(drafts or 0)),
            counts or None,
            None if accepted is None else int(round(accepted)),
            None if draft_tokens is None else int(round(draft_tokens)),
            num_spec_tokens=k,
            notes=notes,
            reset=reset,
        )
    # SGLang: verify calls and generated tokens (counters), the accept length (gauges)
    calls = s.total("sglang:spec_verify_calls")
    gen = s.total("sglang:generation_tokens")
    gauge = g.total("sglang:spec_accept_length")
    steps = g.total("sglang:spec_num_steps")
    k = int(steps) if steps and steps > 0 else None
    if calls:
        # SGLang's own formula (PR 3152): completion tokens over verify calls; the prefill's first token
        # counts as well, so it runs a little above the verify steps' own mean on short outputs
        accepted = max(int(round((gen or 0.0) - calls)), 0)
        notes += (
            f"accept length from SGLang's counters: generation_tokens / spec_verify_calls "
            f"({gen:.0f} / {calls:.0f}; each request's first token, from prefill, counts too)",
        )
    else:
        accepted = None
    if gauge is not None:
        notes += (
            f"sglang:spec_accept_length {gauge:.3f} is a gauge of the most recent log interval only "
            f"(multiprocess mode 'mostrecent'), not an average over the window",
        )
    return ServedProfile(
        "sglang",
        "sglang-prometheus",
        s.where,
        int(round(calls)) if calls else None,
        None,
        accepted,
        None,
        gauge,
        "most recent interval (gauge)" if gauge is not None else "",
        k,
        notes=notes,
        reset=reset,
    )


def _is_counter(name: str) -> bool:
    """The speculative counters a window differences (gauges may fall without a restart)."""
    return name.startswith(("vllm:spec_decode_num", "llamacpp:spec_decode_num")) or name in (
        "sglang:spec_verify_calls",
        "sglang:generation_tokens",
    )


def window(before: Scrape, after: Scrape) -> ServedProfile:
    """What happened between two scrapes of the same counters. A counter that fell, or a series whose
    ``_created`` time changed, is a reset (the engine restarted): the window then holds the counts since
    the restart only, and says so."""
    fam_b, fam_a = before.family(), after.family()
    if fam_a is None:
        raise BadText(f"{after.where}: no speculative-decoding counters in the second scrape")
    if fam_b is not None and fam_b != fam_a:
        raise BadText(
            f"the two scrapes come from different engines ({fam_b}, then {fam_a}); a window needs "
            f"two scrapes of the same counters"
        )
    restarted = sorted(
        {
            key[0]
            for key, v in after.series.items()
            if _is_counter(key[0]) and key in before.series and v < before.series[key] - 1e-9
        }
    )
    recreated = sorted(
        {
            key[0]
            for key, t in after.created.items()
            if _is_counter(key[0]) and key in before.created and abs(t - before.created[key]) > 1e-6
        }
    )
    ib, ia = before.identity(), after.identity()
    started = sorted({k[0] for k in ia if k in ib and abs(ia[k] - ib[k]) > 1e-9})
    reset = bool(restarted or recreated or started)
    if reset:
        delta = dict(after.series)
        why = (f"what it says of its process changed: {', '.join(started)}" if started
               else f"{', '.join(restarted or recreated)} {'fell' if restarted else 'were re-created'}")
        note = (
            f"the engine restarted inside the window ({why}): these are the counts since the restart, and "
            f"the traffic between the first scrape and the restart is not in them"
        )
    else:
        delta = {
            key: v - before.series.get(key, 0.0) if _is_counter(key[0]) else v
            for key, v in after.series.items()
        }
        span = f" over {after.at - before.at:.0f} s" if after.at is not None and before.at is not None else ""
        note = f"window: the difference of two scrapes ({before.where} -> {after.where}){span}"
        if not (ib and ia) and not (before.created and after.created):
            note += ("; the page says nothing of the process behind it (no process_start_time_seconds, no "
                     "_created, no sglang:startup_time_seconds), so a restart followed by more traffic than "
                     "before cannot be told from no restart")
    if not reset and not any(v for key, v in delta.items() if _is_counter(key[0])):
        raise BadText(
            f"{before.where} -> {after.where}: no verify steps inside the window (every speculative counter "
            f"is where it was); nothing was speculated between the two scrapes, or the engine restarted and "
            f"served exactly as much, which counters without a _created time cannot tell apart"
        )
    diff = Scrape(f"{before.where} -> {after.where}", delta, after.created, after.at)
    prof = _from_scrape(diff, gauges_from=after, window_note=note, reset=reset)
    if prof is None:
        raise BadText(f"{after.where}: no speculative-decoding counters to take a window of")
    return prof


# --------------------------------------------------------------------------------------
# Logs


_VLLM_LINE = re.compile(r"SpecDecoding metrics:(?P<rest>.*)$", re.M)
_LLAMA_REQ = re.compile(
    r"draft acceptance\s*=\s*[\d.]+\s*\(\s*(\d+)\s*accepted\s*/\s*(\d+)\s*generated\)\s*,\s*"
    r"mean len\s*=\s*([\d.]+)"
)
_LLAMA_POS = re.compile(r"acc per pos\s*=\s*\(([\d.,\s]*)\)")
_LLAMA_STATS = re.compile(
    r"statistics\s+(\S+):\s*#calls\(b,g,a\)\s*=\s*\d+\s+\d+\s+(\d+).*?#gen tokens\s*=\s*(\d+)"
    r".*?#acc tokens\s*=\s*(\d+)(?:.*?#acc rate/pos\s*=\s*\(([\d.,\s]*)\))?"
)
_LLAMA_OLD = re.compile(
    r"draft acceptance\s*=\s*[\d.]+\s*\(\s*(\d+)\s*accepted\s*/\s*(\d+)\s*generated\)"
    r".*?mean acceptance length\s*=\s*([\d.]+).*?acceptance rate per position\s*=\s*"
    r"\(([\d.,\s]+)\)"
)
_SGLANG_LOG = re.compile(r"accept len:\s*([\d.]+),\s*accept rate:\s*([\d.]+)")


def _floats(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", text)]


def _vllm_log(text: str, where: str) -> ServedProfile | None:
    drafts, per_pos, acc_total, drafted_total, lines = 0, [], 0, 0, 0
    for m in _VLLM_LINE.finditer(text):
        rest = m["rest"]
        acc = re.search(r"Accepted:\s*(\d+)\s*tokens", rest)
        dra = re.search(r"Drafted:\s*(\d+)\s*tokens", rest)
        pos = re.search(r"Per-position acceptance rate:\s*((?:\d+(?:\.\d+)?\s*,?\s*)+)", rest)
        mean = re.search(r"Mean acceptance length:\s*([\d.]+)", rest)
        if not (acc and dra):
            continue
        rates = _floats(pos[1]) if pos else []
        a, d = int(acc[1]), int(dra[1])
        if rates:
            n = d // len(rates)  # vLLM drafts k tokens every round
        elif mean and float(mean[1]) > 1.0:
            n = round(a / (float(mean[1]) - 1))
        else:
            continue
        lines += 1
        drafts += n
        acc_total += a
        drafted_total += d
        if rates:
            per_pos = [x + round(r * n) for x, r in zip(per_pos + [0] * len(rates), rates)]
    if not lines:
        return None
    k = len(per_pos) or None
    return ServedProfile(
        "vllm",
        "vllm-log",
        where,
        drafts,
        tuple(per_pos) or None,
        acc_total,
        drafted_total,
        num_spec_tokens=k,
        notes=(
            f"{lines} 'SpecDecoding metrics' lines added up (each covers the interval since the one before)",
        ),
    )


def _llamacpp_log(text: str, where: str) -> ServedProfile | None:
    stats = list(_LLAMA_STATS.finditer(text))
    if stats:  # cumulative per speculative implementation: the newest holds all
        m = stats[-1]
        calls, gen, acc = int(m[2]), int(m[3]), int(m[4])
        rates = _floats(m[5]) if m[5] else []
        per = tuple(round(r * calls) for r in rates) or None
        return ServedProfile(
            "llamacpp",
            "llamacpp-log",
            where,
            calls,
            per,
            acc,
            gen,
            num_spec_tokens=len(rates) or None,
            notes=(f"the newest 'statistics {m[1]}' line (running totals since the server started)",),
        )
    old = list(_LLAMA_OLD.finditer(text))
    if old:
        m = old[-1]
        accepted, mean_len = int(m[1]), float(m[3])
        rates = _floats(m[4])
        drafts = round(accepted / (mean_len - 1)) if mean_len > 1 else int(m[2]) // max(len(rates), 1)
        return ServedProfile(
            "llamacpp",
            "llamacpp-log",
            where,
            drafts,
            tuple(round(r * drafts) for r in rates),
            accepted,
            int(m[2]),
            num_spec_tokens=len(rates) or None,
            notes=(
                "drafts recovered from the logged mean acceptance length (running totals: the last line)",
            ),
        )
    reqs = list(_LLAMA_REQ.finditer(text))
    if not reqs:
        return None
    drafts = acc_total = gen_total = 0
    per_pos: list[int] = []
    unknown = 0
    for i, m in enumerate(reqs):
        a, g, mean_len = int(m[1]), int(m[2]), float(m[3])
        if mean_len <= 1.0:
            unknown += 1  # 0 accepted: the line gives no verify steps
            continue
        n = round(a / (mean_len - 1))
        drafts += n
        acc_total += a
        gen_total += g
        nxt = reqs[i + 1].start() if i + 1 < len(reqs) else len(text)
        pos = _LLAMA_POS.search(text, m.end(), nxt)
        if pos:
            rates = _floats(pos[1])
            per_pos = [x + round(r * n) for x, r in zip(per_pos + [0] * len(rates), rates)]
    notes = [
        f"{len(reqs)} per-request 'draft acceptance' lines added up (llama.cpp resets a slot's stats per "
        f"request); verify steps recovered from 'mean len' (2 decimals)"
    ]
    if unknown:
        notes.append(
            f"{unknown} request(s) accepted nothing, and their lines give no verify steps: left out, so "
            f"the accept length is an upper bound"
        )
    if per_pos and sum(1 for _ in _LLAMA_POS.finditer(text)) < len(reqs) - unknown:
        per_pos = []
        notes.append("'acc per pos' lines (-lv 4) missing for some requests: per-position counts not used")
    if not drafts:
        return None
    return ServedProfile(
        "llamacpp",
        "llamacpp-log",
        where,
        drafts,
        tuple(per_pos) or None,
        acc_total,
        gen_total,
        num_spec_tokens=len(per_pos) or None,
        notes=tuple(notes),
    )


def _sglang_log(text: str, where: str) -> ServedProfile | None:
    found = [(float(a), float(r)) for a, r in _SGLANG_LOG.findall(text)]
    if not found:
        return None
    mean = sum(a for a, _ in found) / len(found)
    ks = {round((a - 1) / r) for a, r in found if r > 0 and a > 1}
    return ServedProfile(
        "sglang",
        "sglang-log",
        where,
        None,
        gauge=mean,
        gauge_scope=f"the mean of {len(found)} 'Decode batch' log intervals (each an average "
        f"whose count the log does not give)",
        num_spec_tokens=ks.pop() if len(ks) == 1 else None,
        notes=(f"newest interval: accept len {found[-1][0]:.2f}",),
    )


# --------------------------------------------------------------------------------------
# JSON: responses, server info


def _temperature_of(item: dict) -> float | None:
    for holder in (item, item.get("sampling_params"), item.get("request"), item.get("generation_settings")):
        if isinstance(holder, dict):
            t = holder.get("temperature")
            if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0:
                return round(float(t), 6)     # llama.cpp echoes a float32: 0.699999988 is the 0.7 asked for
    return None


def _sampler_of(item: dict) -> Sampler | None:
    """The target's sampler a llama.cpp response says it ran (``generation_settings``: top_k, top_p, min_p
    and the ``samplers`` order, the temperature last by default), or None."""
    gs = item.get("generation_settings")
    if not isinstance(gs, dict):
        return None
    k, p, m, order = gs.get("top_k"), gs.get("top_p"), gs.get("min_p"), gs.get("samplers")
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (k, p, m)):
        return None
    first = (isinstance(order, list) and "temperature" in order
             and all(order.index(f) < order.index("temperature") for f in ("top_k", "top_p", "min_p")
                     if f in order))
    return Sampler(max(0, int(k)), round(float(p), 6), round(float(m), 6), bool(first))


def _histogram(value, where: str, i: int, key: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value
    ):
        raise BadText(f"{where}: item {i}'s {key} is {str(value)[:60]}; expected a list of counts")
    return value


def _item_histogram(it: dict, where: str, i: int) -> tuple[str, list[int]] | None:
    """(engine, verify steps with 0..k accepted drafts) from one response, or None."""
    meta = it.get("meta_info")
    if isinstance(meta, dict) and "spec_correct_drafts_histogram" in meta:
        return "sglang", _histogram(
            meta["spec_correct_drafts_histogram"], where, i, "spec_correct_drafts_histogram"
        )
    if "spec_correct_drafts_histogram" in it:
        return "sglang", _histogram(
            it["spec_correct_drafts_histogram"], where, i, "spec_correct_drafts_histogram"
        )
    ext = it.get("sglext")
    if isinstance(ext, dict) and ext.get("spec_tokens_details") is not None:
        det = ext["spec_tokens_details"]
        total: list[int] = []
        for d in det if isinstance(det, list) else [det]:
            if isinstance(d, dict):
                total = _add(
                    total,
                    _histogram(
                        d.get("spec_correct_drafts_histogram", []),
                        where,
                        i,
                        "sglext.spec_tokens_details.spec_correct_drafts_histogram",
                    ),
                )
        return "sglang", total
    metrics = it.get("metrics")
    sd = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if sd is None and "acceptance_histogram" in it:
        sd = it
    if sd is None and isinstance(it.get("spec_decode_metrics"), dict):
        sd = it["spec_decode_metrics"]
    if isinstance(sd, dict):
        return "vllm", _histogram(
            sd.get("acceptance_histogram"), where, i, "speculative_decoding.acceptance_histogram"
        )
    return None


def _add(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[j] if j < len(a) else 0) + (b[j] if j < len(b) else 0) for j in range(n)]


def _json_source(obj, where: str, draft_tokens: int | None) -> ServedProfile:
    if (
        isinstance(obj, dict)
        and isinstance(obj.get("internal_states"), list)
        or (isinstance(obj, dict) and "avg_spec_accept_length" in obj)
    ):
        states = obj.get("internal_states") or [obj]
        vals = [
            s["avg_spec_accept_length"]
            for s in states
            if isinstance(s, dict) and isinstance(s.get("avg_spec_accept_length"), (int, float))
        ]
        if not vals:
            raise BadText(
                f"{where}: SGLang server info without avg_spec_accept_length; expected a server "
                f"launched with speculative decoding"
            )
        args = next((s for s in states if isinstance(s, dict) and "speculative_num_steps" in s), obj)
        steps = args.get("speculative_num_steps") if isinstance(args, dict) else None
        notes = ()
        device = args.get("device") if isinstance(args, dict) else None
        device = device if isinstance(device, str) else None
        if device == "cpu":
            # SGLang 0.5.23 srt/speculative/eagle_utils.py, _verify_uses_greedy: is_cpu
            notes = ("the server runs on a CPU, where SGLang verifies drafts greedily at any temperature",)
        return ServedProfile(
            "sglang",
            "sglang-server-info",
            where,
            None,
            gauge=sum(vals) / len(vals),
            gauge_scope=f"the server's lifetime average over {len(vals)} scheduler(s), no count",
            num_spec_tokens=steps if type(steps) is int and steps > 0 else None,
            notes=notes,
            device=device,
        )
    items = obj if isinstance(obj, list) else [obj]
    hist: list[int] = []
    engines, temps, samplers = set(), [], []
    used = llama = 0
    acc = drafted = 0
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            raise BadText(
                f"{where}: item {i} is a JSON {type(it).__name__}; expected an engine's response object"
            )
        found = _item_histogram(it, where, i)
        timings = it.get("timings")
        if found is not None:
            engines.add(found[0])
            hist = _add(hist, found[1])
            used += 1
        elif isinstance(timings, dict) and "draft_n" in timings:
            dn, da = timings.get("draft_n"), timings.get("draft_n_accepted", 0)
            if (
                not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in (dn, da))
                or da > dn
            ):
                raise BadText(
                    f"{where}: item {i}'s timings draft_n {dn!r}, draft_n_accepted {da!r}; expected "
                    f"counts with accepted <= drafted"
                )
            engines.add("llamacpp")
            acc, drafted, llama = acc + da, drafted + dn, llama + 1
        else:
            continue
        t = _temperature_of(it)
        if t is not None:
            temps.append(t)
        samplers.append(_sampler_of(it))
    if len(engines) > 1:
        raise BadText(
            f"{where}: responses from more than one engine ({', '.join(sorted(engines))}); pass one "
            f"engine's responses at a time"
        )
    slots = all(isinstance(it, dict) and "id_task" in it and "params" in it for it in items)
    if not engines and items and slots:
        t = _temperature_of({"request": items[0]["params"]})
        raise BadText(
            f"{where}: llama.cpp's /slots: each slot's last request's sampling (temperature "
            f"{'unknown' if t is None else f'{t:g}'}), no speculative counts; pass its /metrics "
            f"(llama-server --metrics) or the /completion responses, with --temperature for the traffic's"
        )
    if not engines:
        raise BadText(
            f"{where}: no item carries speculative counts; expected SGLang responses (meta_info "
            f"spec_correct_drafts_histogram, or sglext.spec_tokens_details from /v1/completions with "
            f'"return_spec_tokens_details": true), vLLM responses with '
            f"--per-request-spec-decode-metrics (metrics.speculative_decoding), or llama.cpp "
            f"/completion responses (timings.draft_n)"
        )
    temp, tsrc = None, ""
    if temps:
        if len(set(temps)) == 1 and len(temps) == used + llama:
            temp, tsrc = temps[0], "the responses"
        else:
            tsrc = f"the responses disagree or some lack it ({sorted(set(temps))})"
    engine = engines.pop()
    if engine == "llamacpp":
        k = draft_tokens
        rounds = round(drafted / k) if k else None
        notes = [f"{llama} of {len(items)} responses carried timings.draft_n"]
        if rounds is None:
            notes.append(
                "llama.cpp's timings give drafted and accepted tokens but not the verify steps: pass "
                "--draft-tokens K (its --spec-draft-n-max) for an accept length; without it none is judged"
            )
        else:
            notes.append(
                f"verify steps taken as draft_n / {k}: a lower bound (a round drafts at most {k}, fewer "
                f"near the end of a request), so the accept length from it is an upper bound: a shortfall "
                f"it shows is real, an ok may not be"
            )
        return ServedProfile(
            "llamacpp",
            "llamacpp-responses",
            where,
            rounds,
            None,
            acc,
            drafted,
            num_spec_tokens=k,
            temperature=temp,
            temperature_source=tsrc,
            notes=tuple(notes),
            sampler=samplers[0] if samplers and samplers[0] and len(set(samplers)) == 1 else None,
        )
    drafts = sum(hist)
    if not drafts:
        raise BadText(f"{where}: the responses' histograms count 0 verify steps; nothing was speculated")
    per_pos = tuple(sum(hist[j] for j in range(i + 1, len(hist))) for i in range(len(hist) - 1))
    source = "sglang-responses" if engine == "sglang" else "vllm-responses"
    return ServedProfile(
        engine,
        source,
        where,
        drafts,
        per_pos,
        sum(j * c for j, c in enumerate(hist)),
        None,
        num_spec_tokens=len(hist) - 1,
        histogram=tuple(hist),
        temperature=temp,
        temperature_source=tsrc,
        notes=(f"{used} of {len(items)} responses carried a histogram",),
    )


# --------------------------------------------------------------------------------------
# Reading a source


# a bearer token for a remote /metrics or a Prometheus, from the environment (never from argv)
TOKEN_ENV = "EAGLE3_WORKBOOK_METRICS_TOKEN"


def fetch(url: str, timeout: float = 10.0) -> str:
    """One GET of a deployment's export, on this machine or another (a GPU pod's /metrics, a Prometheus
    behind a gateway), with the bearer token ``EAGLE3_WORKBOOK_METRICS_TOKEN`` names when it is set."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadOption(f"--metrics {url}: expected an http(s) URL with a host")
    headers = {"User-Agent": "eagle3-workbook", "Accept": "text/plain, application/json"}
    token = (os.environ.get(TOKEN_ENV) or "").strip()
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout) as r:
            return r.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        hint = (f"; set {TOKEN_ENV} to the bearer token it expects" if exc.code in (401, 403) and not token
                else "")
        raise BadOption(f"--metrics {url}: HTTP {exc.code} {exc.reason}{hint}") from None
    except OSError as exc:
        raise BadOption(
            f"--metrics {url}: cannot read it ({getattr(exc, 'reason', exc)}); expected a "
            f"running engine's /metrics, or a Prometheus query URL"
        ) from None


PROMETHEUS_QUERY = ("/api/v1/query", "/api/v1/query_range")


def is_prometheus_query(url: str) -> bool:
    return urllib.parse.urlsplit(url).path.rstrip("/").endswith(PROMETHEUS_QUERY)


def _label_text(labels: dict) -> str:
    inner = ",".join(f'{k}="{str(v)}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{{{inner}}}" if inner else ""


def prometheus_readings(url: str, text: str) -> list[Reading]:
    """A Prometheus server's answer to ``/api/v1/query`` (one instant: one reading) or ``/api/v1/query_range``
    (the first and last sample of each series: the window the dashboard holds), as the exposition text the
    engines' own /metrics would have given, so one parser reads both."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        raise BadText(f"{url}: not a Prometheus API answer (not JSON)") from None
    ok = isinstance(body, dict) and body.get("status") == "success" and isinstance(body.get("data"), dict)
    if not ok:
        why = body.get("error") if isinstance(body, dict) else None
        raise BadText(f"{url}: the Prometheus query failed ({why or 'no data'})")
    data = body["data"]
    kind, result = data.get("resultType"), data.get("result") or []
    if kind not in ("vector", "matrix") or not result:
        raise BadText(f"{url}: the query returned no series (resultType {kind!r}); query the engine's "
                      f"speculative counters, e.g. {{__name__=~\"vllm:spec_decode.*\"}}")
    points: list[list[tuple[float, str]]] = [[], []]
    resets: list[float] = []
    for series in result:
        name = (series.get("metric") or {}).get("__name__")
        samples = [series["value"]] if kind == "vector" else (series.get("values") or [])
        if not name or not samples:
            continue
        line = f"{name}{_label_text(series['metric'])}"
        last = samples[-1][1]
        if kind == "matrix" and _is_counter(name.removesuffix("_total")):
            # the series between its ends, as Prometheus's increase() reads it: a fall between two samples is
            # a restart, from which the counter counts again from 0
            vals = [float(v) for _, v in samples]
            up = sum(b - a if b >= a else b for a, b in zip(vals, vals[1:]))
            resets += [float(samples[i + 1][0]) for i, (a, b) in enumerate(zip(vals, vals[1:])) if b < a]
            last = repr(vals[0] + up)
        points[0].append((float(samples[0][0]), f"{line} {samples[0][1]}"))
        points[1].append((float(samples[-1][0]), f"{line} {last}"))
    if not points[0]:
        raise BadText(f"{url}: the query's series carry no metric names; query raw series, not an expression")
    ends = points[:1] if kind == "vector" else points
    restarts = tuple(sorted(set(resets)))
    return [Reading(f"{url} @ {max(t for t, _ in p):.0f}", "\n".join(ln for _, ln in p) + "\n",
                    max(t for t, _ in p), restarts if i else ()) for i, p in enumerate(ends)]


@dataclass(frozen=True)
class Reading:
    """A source's text, read once: a Prometheus scrape keeps its series for a window."""

    where: str
    text: str
    at: float | None = None
    restarts: tuple[float, ...] = ()   # a Prometheus range: when a counter fell between two of its samples

    def scrape(self) -> Scrape | None:
        if self.text.lstrip().startswith("{"):
            return None
        return parse_prometheus(self.text, self.where, self.at)


def read_source(source: str | Path, timeout: float = 10.0) -> Reading:
    s = str(source)
    if s.startswith(("http://", "https://")) and is_prometheus_query(s):
        return prometheus_readings(s, fetch(s, timeout))[-1]
    if s.startswith(("http://", "https://")):
        return Reading(s, fetch(s, timeout), time.time())
    path = Path(source)
    if not path.is_file():
        raise BadOption(
            f"--metrics {source}: no such file (expected a /metrics scrape, an engine's log, or "
            f"a JSON list of responses)"
        )
    return Reading(str(path), read_text_file(path, "metrics file"), path.stat().st_mtime)


def profile_of(r: Reading, draft_tokens: int | None = None) -> ServedProfile:
    """One reading -> a ServedProfile, or one BadText naming the source and what it lacked."""
    json_error = None
    if r.text.lstrip().startswith(("[", "{")):
        try:
            obj = json.loads(r.text)
        except json.JSONDecodeError as exc:  # a log whose lines open with "[date]", or broken JSON
            json_error = f"{exc.msg} at line {exc.lineno}"
        else:
            return _json_source(obj, r.where, draft_tokens)
    scrape = r.scrape()
    found = _from_scrape(scrape) if scrape is not None else None
    if found is None:
        for reader in (_vllm_log, _llamacpp_log, _sglang_log):
            found = reader(r.text, r.where)
            if found is not None:
                break
    if found is None and json_error is not None:
        raise BadText(
            f"{r.where} is not valid JSON ({json_error}) and holds no engine log line with speculative "
            f"statistics; expected a list of engine responses, a /metrics scrape or an engine's log"
        )
    if found is None:
        raise BadText(
            f"{r.where}: no speculative-decoding metrics found (looked for vllm:, sglang: and "
            f"llamacpp: spec counters, vLLM's 'SpecDecoding metrics' line, llama.cpp's 'draft "
            f"acceptance' line, SGLang's 'accept len:' line, and JSON responses)"
        )
    if found.level is Level.NONE or (found.drafts == 0 and found.gauge is None):
        raise BadText(f"{r.where}: the engine reports 0 verify steps; nothing was speculated yet")
    if draft_tokens and found.num_spec_tokens is None:
        found = replace(found, num_spec_tokens=draft_tokens)
    return found


def read_metrics(source: str | Path, timeout: float = 10.0, draft_tokens: int | None = None) -> ServedProfile:
    return profile_of(read_source(source, timeout), draft_tokens)


def read_window(
    before: str | Path, after: str | Path, timeout: float = 10.0, draft_tokens: int | None = None
) -> ServedProfile:
    """Two readings of the same counters -> the window between them."""
    a, b = read_source(before, timeout), read_source(after, timeout)
    return window_of(a, b, draft_tokens)


def window_of(a: Reading, b: Reading, draft_tokens: int | None = None) -> ServedProfile:
    sa, sb = a.scrape(), b.scrape()
    if sa is None or sb is None or sb.family() is None:
        bad = a.where if sa is None else b.where
        raise BadText(
            f"{bad}: a window needs two Prometheus scrapes of the same counters; this is not one "
            f"(responses and logs are per request or per interval already: pass one of them alone)"
        )
    prof = window(sa, sb)
    if b.restarts:
        when = ", ".join(time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t)) for t in b.restarts)
        prof = replace(prof, reset=True, notes=(*prof.notes, (
            f"the engine restarted inside the window ({len(b.restarts)} time(s): a counter fell between two "
            f"of the dashboard's samples, at {when} UTC); counted as Prometheus's increase() counts: what "
            f"was served between the last sample before each restart and the restart is not in the counts")))
    if prof.level is Level.NONE or (prof.drafts == 0 and prof.gauge is None):
        raise BadText(
            f"{a.where} -> {b.where}: no verify steps inside the window; nothing was speculated "
            f"between the two scrapes"
        )
    if draft_tokens and prof.num_spec_tokens is None:
        prof = replace(prof, num_spec_tokens=draft_tokens)
    return prof


def poll_window(
    url: str, seconds: float, timeout: float = 10.0, draft_tokens: int | None = None, sleep=time.sleep
) -> ServedProfile:
    """A URL read twice, ``seconds`` apart: the window between."""
    first = read_source(url, timeout)
    sleep(seconds)
    return window_of(first, read_source(url, timeout), draft_tokens)


def parse_duration(text: str) -> float:
    """'60s', '5m', '1h', '90' (seconds) -> seconds, or a BadOption."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*", str(text))
    if not m or float(m[1]) <= 0:
        raise BadOption(f"--window {text!r}: expected a duration such as 60s, 5m or 1h")
    return float(m[1]) * {"s": 1, "m": 60, "h": 3600, None: 1}[m[2]]


def read_served(
    sources: list[str],
    window_seconds: float | None = None,
    *,
    timeout: float = 10.0,
    draft_tokens: int | None = None,
    sleep=time.sleep,
) -> ServedProfile:
    """``--metrics`` once (a reading), twice (the window between two scrapes), or a URL with ``--window``."""
    sources = list(sources or [])
    if len(sources) > 2:
        raise BadOption(
            f"--metrics given {len(sources)} times; expected one source, or two scrapes (BEFORE, "
            f"AFTER) of the same counters"
        )
    if window_seconds is not None:
        if len(sources) != 1 or not sources[0].startswith(("http://", "https://")):
            raise BadOption(
                "--window polls one URL twice; pass --metrics http://127.0.0.1:PORT/metrics once "
                "(for two files, pass --metrics BEFORE --metrics AFTER)"
            )
        return poll_window(sources[0], window_seconds, timeout, draft_tokens, sleep)
    if len(sources) == 2:
        return read_window(sources[0], sources[1], timeout, draft_tokens)
    if sources and sources[0].startswith(("http://", "https://")) and is_prometheus_query(sources[0]):
        readings = prometheus_readings(sources[0], fetch(sources[0], timeout))
        if len(readings) == 2:          # a range query: the window between its first and last samples
            return window_of(readings[0], readings[1], draft_tokens)
        return profile_of(readings[0], draft_tokens)
    return read_metrics(sources[0], timeout, draft_tokens)
