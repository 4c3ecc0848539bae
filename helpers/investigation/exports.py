"""Every export a serving deployment already has, read into one ``ServedProfile`` (``investigation.served``).

What each engine writes is declared in its own folder, read from its own source
(``engines/<name>/exports.py``, docs/metrics.md has the table with file:line): its Prometheus prefix and shape
(per-position counters for vLLM and llama.cpp; SGLang's totals and "most recent" gauges), its log lines, its
JSON responses and documents. This module is what they share: reading a source (a file, a loopback or remote
``/metrics``, a Prometheus query), telling which engine wrote it, and adding up responses.

A histogram of accepted drafts per verify step and per-position counters are the same evidence: in a
chain, position i is accepted exactly in the steps that accepted more than i drafts. Totals (verify steps
and accepted tokens) give the accept length; a gauge gives only the engine's own average. What a source
lacks is said, with the flag or endpoint that would give it.

Two scrapes of the same counters make a window (``window``): the difference, with a counter that fell
(an engine restart) detected and said, and a "most recent" gauge labelled as such.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.parse
from dataclasses import dataclass, replace
from pathlib import Path

from .. import net
from ..engines.llamacpp import exports as llamacpp
from ..engines.lmdeploy import exports as lmdeploy
from ..engines.sglang import exports as sglang
from ..engines.vllm import exports as vllm
from ..errors import BadOption, BadText, read_text_file
from .served import (
    Counted,
    Family,
    Level,
    Responses,
    Scrape,
    ServedProfile,
    add_counts,
    histogram_profile,
    parse_prometheus,
    register,
    temperature_of,
)

# Every engine whose exports the workbook reads, each declared in its own folder (engines/<name>/exports.py);
# a response is offered to them in this order (LMDeploy's log line before vLLM's, whose logger it adapted).
FAMILIES: tuple[Family, ...] = (sglang.FAMILY, lmdeploy.FAMILY, vllm.FAMILY, llamacpp.FAMILY)
register(*FAMILIES)


# --------------------------------------------------------------------------------------
# Prometheus text


def _from_scrape(
    s: Scrape, gauges_from: Scrape | None = None, window_note: str = "", reset: bool = False
) -> ServedProfile | None:
    fam = s.family()
    notes = (window_note,) if window_note else ()
    if fam is None:
        return None
    if not fam.per_position:            # totals and gauges, read as that engine reads them (SGLang)
        return fam.from_totals(s, gauges_from or s, notes, reset)
    p = f"{fam.prefix}spec_decode_"
    drafts = s.total(p + "num_drafts")
    per_pos = s.by_label(p + "num_accepted_tokens_per_pos", "position")
    accepted, drafted = s.total(p + "num_accepted_tokens"), s.total(p + "num_draft_tokens")
    if drafts is None and not per_pos:
        return None
    counts = tuple(int(round(per_pos.get(i, 0.0))) for i in range(max(per_pos, default=-1) + 1))
    k = len(counts) or None
    return ServedProfile(
        engine=fam.engine,
        source=f"{fam.engine}-prometheus",
        where=s.where,
        drafts=int(round(drafts or 0)),
        accepted_per_position=counts or None,
        accepted=None if accepted is None else int(round(accepted)),
        draft_tokens=None if drafted is None else int(round(drafted)),
        num_spec_tokens=k,
        notes=notes,
        reset=reset,
    )


def _is_counter(name: str) -> bool:
    """The speculative counters a window differences (gauges may fall without a restart)."""
    return any(fam.counters(name) for fam in FAMILIES)


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
# JSON: responses, server info


def _json_source(obj, where: str, num_spec_tokens: int | None) -> ServedProfile:
    for fam in FAMILIES:
        found = fam.read_document(obj, where)
        if found is not None:
            return found
    items = obj if isinstance(obj, list) else [obj]
    by_engine: dict[str, list[Counted]] = {}
    temps: list[float] = []
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            raise BadText(
                f"{where}: item {i} is a JSON {type(it).__name__}; expected an engine's response object"
            )
        fam, counted = next(((f, c) for f in FAMILIES if (c := f.read_response(it, where, i)) is not None),
                            (None, None))
        if fam is None:
            continue
        by_engine.setdefault(fam.engine, []).append(counted)
        t = temperature_of(it)
        if t is not None:
            temps.append(t)
    if len(by_engine) > 1:
        raise BadText(
            f"{where}: responses from more than one engine ({', '.join(sorted(by_engine))}); pass one "
            f"engine's responses at a time"
        )
    if not by_engine:
        expected = [f.responses_expected for f in FAMILIES if f.responses_expected]
        raise BadText(
            f"{where}: no item carries speculative counts; expected {', '.join(expected[:-1])}, or "
            f"{expected[-1]}"
        )
    (engine, counted), = by_engine.items()
    temp, tsrc = None, ""
    if temps:
        if len(set(temps)) == 1 and len(temps) == len(counted):
            temp, tsrc = temps[0], "the responses"
        else:
            tsrc = f"the responses disagree or some lack it ({sorted(set(temps))})"
    hist: list[int] = []
    for c in counted:
        if c.histogram is not None:
            hist = add_counts(hist, c.histogram)
    samplers = [c.sampler for c in counted]
    responses = Responses(
        engine, where, len(items), len(counted), tuple(hist), sum(c.accepted for c in counted),
        sum(c.drafted for c in counted), temp, tsrc,
        samplers[0] if samplers and samplers[0] and len(set(samplers)) == 1 else None, num_spec_tokens,
    )
    fam = next(f for f in FAMILIES if f.engine == engine)
    if fam.from_responses is None:
        return histogram_profile(responses, f"{engine}-responses")
    return fam.from_responses(responses)


# --------------------------------------------------------------------------------------
# Reading a source


# a bearer token for a remote /metrics or a Prometheus, from the environment (never from argv)
TOKEN_ENV = "EAGLE3_WORKBOOK_METRICS_TOKEN"


# what one answer may be: a /metrics page is kilobytes, a Prometheus range over a busy fleet a few megabytes
MAX_EXPORT_BYTES = 32 * net.MB


def fetch(url: str, timeout: float = 10.0) -> str:
    """One GET of a deployment's export, on this machine or another (a GPU pod's /metrics, a Prometheus
    behind a gateway), whole within ``timeout`` seconds and at most ``MAX_EXPORT_BYTES``, with the bearer
    token ``EAGLE3_WORKBOOK_METRICS_TOKEN`` names when it is set (sent to the URL's own host only)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BadOption(f"--metrics {url}: expected an http(s) URL with a host")
    token = (os.environ.get(TOKEN_ENV) or "").strip()
    try:
        return net.get(url, deadline_s=timeout, max_bytes=MAX_EXPORT_BYTES,
                       headers={"Accept": "text/plain, application/json"},
                       auth=f"Bearer {token}" if token else None).text()
    except net.HTTPStatus as exc:
        hint = (f"; set {TOKEN_ENV} to the bearer token it expects" if exc.code in (401, 403) and not token
                else "")
        raise BadOption(f"--metrics {exc}{hint}") from None
    except net.NetError as exc:
        raise BadOption(f"--metrics {exc}; expected a running engine's /metrics, or a Prometheus query URL"
                        ) from None


PROMETHEUS_QUERY = ("/api/v1/query", "/api/v1/query_range")


def is_prometheus_query(url: str) -> bool:
    return urllib.parse.urlsplit(url).path.rstrip("/").endswith(PROMETHEUS_QUERY)


def _label_text(labels: dict) -> str:
    """A Prometheus API answer's labels written as the text format writes them: a value's backslash, quote
    and newline escaped, so the text parser gives back the same values (one key for one series)."""
    inner = ",".join(f'{k}="{_escaped(str(v))}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{{{inner}}}" if inner else ""


def _escaped(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


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


def profile_of(r: Reading, num_spec_tokens: int | None = None) -> ServedProfile:
    """One reading -> a ServedProfile, or one BadText naming the source and what it lacked."""
    json_error = None
    if r.text.lstrip().startswith(("[", "{")):
        try:
            obj = json.loads(r.text)
        except json.JSONDecodeError as exc:  # a log whose lines open with "[date]", or broken JSON
            json_error = f"{exc.msg} at line {exc.lineno}"
        else:
            return _json_source(obj, r.where, num_spec_tokens)
    scrape = r.scrape()
    found = _from_scrape(scrape) if scrape is not None else None
    if found is None:
        for fam in FAMILIES:
            found = fam.read_log(r.text, r.where)
            if found is not None:
                break
    if found is None and json_error is not None:
        raise BadText(
            f"{r.where} is not valid JSON ({json_error}) and holds no engine log line with speculative "
            f"statistics; expected a list of engine responses, a /metrics scrape or an engine's log"
        )
    if found is None:
        raise BadText(
            f"{r.where}: no speculative-decoding metrics found (looked for vllm:, sglang:, llamacpp: and "
            f"lmdeploy: spec counters, vLLM's and LMDeploy's 'SpecDecoding metrics' lines, llama.cpp's "
            f"'draft acceptance' line, SGLang's 'accept len:' line, and JSON responses)"
        )
    if found.level is Level.NONE or (found.drafts == 0 and found.gauge is None):
        raise BadText(f"{r.where}: the engine reports 0 verify steps; nothing was speculated yet")
    if num_spec_tokens and found.num_spec_tokens is None:
        found = replace(found, num_spec_tokens=num_spec_tokens)
    return found


def read_metrics(source: str | Path, timeout: float = 10.0,
                 num_spec_tokens: int | None = None) -> ServedProfile:
    return profile_of(read_source(source, timeout), num_spec_tokens)


def read_window(
    before: str | Path, after: str | Path, timeout: float = 10.0, num_spec_tokens: int | None = None
) -> ServedProfile:
    """Two readings of the same counters -> the window between them."""
    a, b = read_source(before, timeout), read_source(after, timeout)
    return window_of(a, b, num_spec_tokens)


def window_of(a: Reading, b: Reading, num_spec_tokens: int | None = None) -> ServedProfile:
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
    if num_spec_tokens and prof.num_spec_tokens is None:
        prof = replace(prof, num_spec_tokens=num_spec_tokens)
    return prof


def poll_window(
    url: str, seconds: float, timeout: float = 10.0, num_spec_tokens: int | None = None, sleep=time.sleep
) -> ServedProfile:
    """A URL read twice, ``seconds`` apart: the window between."""
    first = read_source(url, timeout)
    sleep(seconds)
    return window_of(first, read_source(url, timeout), num_spec_tokens)


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
    num_spec_tokens: int | None = None,
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
        return poll_window(sources[0], window_seconds, timeout, num_spec_tokens, sleep)
    if len(sources) == 2:
        return read_window(sources[0], sources[1], timeout, num_spec_tokens)
    if sources and sources[0].startswith(("http://", "https://")) and is_prometheus_query(sources[0]):
        readings = prometheus_readings(sources[0], fetch(sources[0], timeout))
        if len(readings) == 2:          # a range query: the window between its first and last samples
            return window_of(readings[0], readings[1], num_spec_tokens)
        return profile_of(readings[0], num_spec_tokens)
    return read_metrics(sources[0], timeout, num_spec_tokens)
