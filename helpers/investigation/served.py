"""What an engine reports about acceptance over some traffic, whatever export it came from: one
``ServedProfile``; the Prometheus page it may come from (``Scrape``); and what each engine's ``exports``
module declares about its own exports (``Family``: its metric prefix, its log reader, its response
reader), registered by ``investigation.exports``, which reads a source with every registered family.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from prometheus_client.parser import text_string_to_metric_families

from ..errors import BadText
from ..profile import Z95, wilson
from ..rules.acceptance import Sampler


class Level(StrEnum):
    """How much a source says, best first."""

    COUNTS = "per-position counts"
    TOTALS = "totals"  # verify steps and accepted tokens, no positions
    GAUGE = "gauge"  # an engine's own average, no counts
    NONE = "none"



@dataclass(frozen=True)
class ServedProfile:
    """What the engine reports over some traffic. ``drafts``: verify steps (draft rounds);
    ``accepted_per_position[i]``: how many of them accepted draft position i."""

    engine: str  # vllm | sglang | llamacpp | lmdeploy
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
            f"{_HINTS.get(self.engine, 'a source with them')} would give each position"
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


@dataclass(frozen=True)
class Counted:
    """One response's speculative counts: verify steps with 0..k accepted drafts (``histogram``), or, where
    an engine's response gives only totals, its accepted and drafted tokens."""

    histogram: tuple[int, ...] | None = None
    accepted: int = 0
    drafted: int = 0
    sampler: Sampler | None = None   # the target's sampler, where the response says (llama.cpp)


@dataclass(frozen=True)
class Responses:
    """One engine's JSON responses, added up: what a family turns into its profile."""

    engine: str
    where: str
    items: int                       # responses in the source
    counted: int                     # those that carried counts
    histogram: tuple[int, ...]       # summed over the responses with a histogram
    accepted: int                    # summed over the responses with totals only
    drafted: int
    temperature: float | None
    temperature_source: str
    sampler: Sampler | None
    num_spec_tokens: int | None      # k, tokens drafted per round, where the user gave it


def numbers(text: str) -> list[float]:
    """The decimal numbers in a log line's list, in order."""
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", text)]


def temperature_of(item: dict) -> float | None:
    """The temperature a response says it ran at, wherever its engine puts it."""
    for holder in (item, item.get("sampling_params"), item.get("request"), item.get("generation_settings")):
        if isinstance(holder, dict):
            t = holder.get("temperature")
            if isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t) and t >= 0:
                return round(float(t), 6)     # llama.cpp echoes a float32: 0.699999988 is the 0.7 asked for
    return None


def counts_list(value, where: str, i: int, key: str) -> list[int]:
    """A response's histogram as given, or a BadText naming the item and the key."""
    if not isinstance(value, list) or not all(
        isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in value
    ):
        raise BadText(f"{where}: item {i}'s {key} is {str(value)[:60]}; expected a list of counts")
    return value


def add_counts(a: list[int] | tuple[int, ...], b: list[int] | tuple[int, ...]) -> list[int]:
    """Two histograms added position by position (the shorter padded with zeros)."""
    n = max(len(a), len(b))
    return [(a[j] if j < len(a) else 0) + (b[j] if j < len(b) else 0) for j in range(n)]


def histogram_profile(r: Responses, source: str) -> ServedProfile:
    """Responses whose histograms count verify steps by accepted drafts: per-position counts, exactly."""
    hist = list(r.histogram)
    drafts = sum(hist)
    if not drafts:
        raise BadText(f"{r.where}: the responses' histograms count 0 verify steps; nothing was speculated")
    per_pos = tuple(sum(hist[j] for j in range(i + 1, len(hist))) for i in range(len(hist) - 1))
    return ServedProfile(
        engine=r.engine,
        source=source,
        where=r.where,
        drafts=drafts,
        accepted_per_position=per_pos,
        accepted=sum(j * c for j, c in enumerate(hist)),
        draft_tokens=None,
        num_spec_tokens=len(hist) - 1,
        histogram=tuple(hist),
        temperature=r.temperature,
        temperature_source=r.temperature_source,
        notes=(f"{r.counted} of {r.items} responses carried a histogram",),
    )


_SPEC_LINE = re.compile(r"SpecDecoding metrics:(?P<rest>.*)$", re.M)


def spec_decoding_lines(text: str, where: str, engine: str,
                        wanted: Callable[[str], bool]) -> ServedProfile | None:
    """The "SpecDecoding metrics: ... Accepted: A tokens, Drafted: D tokens, Per-position acceptance rate:
    r0, r1, ..." lines an engine logs (vLLM's, and LMDeploy's, which adapted vLLM's logger), each covering
    the interval since the one before, added up. ``wanted`` picks this engine's lines by the whole line;
    fields are found by name, so one inserted between them does no harm."""
    drafts, per_pos, acc_total, drafted_total, lines = 0, [], 0, 0, 0
    for m in _SPEC_LINE.finditer(text):
        start = text.rfind("\n", 0, m.start()) + 1
        if not wanted(text[start:m.end()]):
            continue
        rest = m["rest"]
        acc = re.search(r"Accepted:\s*(\d+)\s*tokens", rest)
        dra = re.search(r"Drafted:\s*(\d+)\s*tokens", rest)
        pos = re.search(r"Per-position acceptance rate:\s*((?:\d+(?:\.\d+)?\s*,?\s*)+)", rest)
        mean = re.search(r"Mean acceptance length:\s*([\d.]+)", rest)
        if not (acc and dra):
            continue
        rates = numbers(pos[1]) if pos else []
        a, d = int(acc[1]), int(dra[1])
        if rates:
            n = d // len(rates)  # k tokens drafted every round
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
    return ServedProfile(
        engine=engine,
        source=f"{engine}-log",
        where=where,
        drafts=drafts,
        accepted_per_position=tuple(per_pos) or None,
        accepted=acc_total,
        draft_tokens=drafted_total,
        num_spec_tokens=len(per_pos) or None,
        notes=(
            f"{lines} 'SpecDecoding metrics' lines added up (each covers the interval since the one before)",
        ),
    )


def _none(*_args) -> None:
    return None


@dataclass(frozen=True)
class Family:
    """What one engine exports, declared in its folder (``engines/<name>/exports.py``): its Prometheus
    prefix and shape, how its logs and its responses read, and where per-position counts would come from."""

    engine: str
    prefix: str                      # its /metrics names start with it
    per_position: bool               # counters per draft position (vLLM, llama.cpp), else totals and gauges
    per_position_hint: str           # which export gives per-position counts, for a source without them
    responses_expected: str          # what its responses carry, for the error when no response does
    read_log: Callable[[str, str], ServedProfile | None]
    read_response: Callable[[dict, str, int], Counted | None] = _none
    from_responses: Callable[[Responses], ServedProfile] | None = None   # None: histogram_profile
    read_document: Callable[[object, str], ServedProfile | None] = _none   # e.g. SGLang's /server_info
    from_totals: Callable[..., ServedProfile | None] | None = None   # a scrape of totals, gauges (SGLang)
    counters: Callable[[str], bool] = _none   # the series a window differences (gauges may fall freely)
    identity: tuple[str, ...] = ()   # series fixed for one boot's life, beside process_start_time_seconds

    def __str__(self) -> str:
        return self.engine


_FAMILIES: list[Family] = []
_HINTS: dict[str, str] = {}
_IDENTITY: set[str] = set()


def register(*families: Family) -> None:
    """Make each engine's exports known: which scrape is whose, what a source without positions lacks."""
    for fam in families:
        if fam.engine not in _HINTS:
            _FAMILIES.append(fam)
        _HINTS[fam.engine] = fam.per_position_hint
        _IDENTITY.update(fam.identity)


# What a page says about the process behind it, fixed for the life of one boot: its start time
# (prometheus_client's process collector: vLLM's API server), or SGLang's startup durations per phase (a
# ``mostrecent`` gauge measured once per boot, srt/observability/metrics_collector.py
# ``sglang:startup_time_seconds``; its multiprocess registry exports neither a process collector nor
# ``_created``)
PROCESS_START = "process_start_time_seconds"


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
        return {key: v for key, v in self.series.items() if key[0] == PROCESS_START or key[0] in _IDENTITY}

    def family(self) -> Family | None:
        """The registered engine whose speculative series the page holds, or None."""
        for fam in _FAMILIES:
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


def _samples(text: str):
    """(name, labels, value) of every sample line in ``text``, each read by prometheus_client's own parser
    of the text format: label values decoded (``\\"``, ``\\\\``, ``\\n``), a ``}`` or ``,`` inside a quoted
    value kept. Line by line, so a line that is no sample (a log's, or one the parser refuses) is passed
    over, not the page: a log read as a page gives no series."""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            found = [s for family in text_string_to_metric_families(line + "\n") for s in family.samples]
        except (ValueError, TypeError, KeyError, IndexError):
            continue
        for s in found:
            yield s.name, s.labels, s.value


def parse_prometheus(text: str, where: str, at: float | None = None) -> Scrape | None:
    """The page's series keyed by (name without ``_total``, sorted decoded labels); ``_created`` samples
    apart, non-finite values left out. None when the page holds no sample."""
    series, created = {}, {}
    for name, label_map, value in _samples(text):
        if not math.isfinite(value):
            continue
        labels = tuple(sorted(label_map.items()))
        if name.endswith("_created"):
            created[(name.removesuffix("_created"), labels)] = value
            continue
        key = (name.removesuffix("_total"), labels)
        series[key] = series.get(key, 0.0) + value
    if not series:
        return None
    return Scrape(where, series, created, at)
