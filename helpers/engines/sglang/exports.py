"""SGLang's exports, as its own code writes them: on /metrics (``--enable-metrics``) the counters
``sglang:spec_verify_calls_total`` and ``sglang:generation_tokens_total`` and the "most recent" gauges
``sglang:spec_accept_length``, ``spec_accept_rate``, ``spec_num_steps`` (observability/metrics_collector.py
:511-545, :1860-1866, :2110-2112 at 0.5.23: no per-position counts); its "Decode batch ... accept len: X,
accept rate: Y" log line (a mean over each log interval, without its count); its responses' histograms
(``/generate``'s ``meta_info.spec_correct_drafts_histogram``, or ``sglext.spec_tokens_details`` from
``/v1/completions`` with ``return_spec_tokens_details``); and ``/server_info``
(``internal_states[].avg_spec_accept_length``). docs/metrics.md has the table.
"""

from __future__ import annotations

import re

from ...errors import BadText
from ...investigation.served import (
    Counted,
    Family,
    Scrape,
    ServedProfile,
    add_counts,
    counts_list,
    histogram_profile,
)

_LOG = re.compile(r"accept len:\s*([\d.]+),\s*accept rate:\s*([\d.]+)")


def read_log(text: str, where: str) -> ServedProfile | None:
    found = [(float(a), float(r)) for a, r in _LOG.findall(text)]
    if not found:
        return None
    mean = sum(a for a, _ in found) / len(found)
    ks = {round((a - 1) / r) for a, r in found if r > 0 and a > 1}
    return ServedProfile(
        engine="sglang",
        source="sglang-log",
        where=where,
        drafts=None,
        gauge=mean,
        gauge_scope=f"the mean of {len(found)} 'Decode batch' log intervals (each an average "
        f"whose count the log does not give)",
        num_spec_tokens=ks.pop() if len(ks) == 1 else None,
        notes=(f"newest interval: accept len {found[-1][0]:.2f}",),
    )


def from_totals(s: Scrape, g: Scrape, notes: tuple[str, ...], reset: bool) -> ServedProfile:
    """A scrape (or a window's difference ``s``, its gauges from ``g``): verify calls and generated tokens
    (counters), the accept length (gauges)."""
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
        engine="sglang",
        source="sglang-prometheus",
        where=s.where,
        drafts=int(round(calls)) if calls else None,
        accepted_per_position=None,
        accepted=accepted,
        draft_tokens=None,
        gauge=gauge,
        gauge_scope="most recent interval (gauge)" if gauge is not None else "",
        num_spec_tokens=k,
        notes=notes,
        reset=reset,
    )


def read_response(it: dict, where: str, i: int) -> Counted | None:
    """One response's histogram of verify steps by accepted drafts, where it carries one."""
    key = "spec_correct_drafts_histogram"
    meta = it.get("meta_info")
    if isinstance(meta, dict) and key in meta:
        return Counted(tuple(counts_list(meta[key], where, i, key)))
    if key in it:
        return Counted(tuple(counts_list(it[key], where, i, key)))
    ext = it.get("sglext")
    if isinstance(ext, dict) and ext.get("spec_tokens_details") is not None:
        det = ext["spec_tokens_details"]
        total: list[int] = []
        for d in det if isinstance(det, list) else [det]:
            if isinstance(d, dict):
                found = counts_list(d.get(key, []), where, i, f"sglext.spec_tokens_details.{key}")
                total = add_counts(total, found)
        return Counted(tuple(total))
    return None


def read_document(obj, where: str) -> ServedProfile | None:
    """``/server_info``: the server's lifetime average accept length per scheduler, no count."""
    if not (
        isinstance(obj, dict)
        and isinstance(obj.get("internal_states"), list)
        or (isinstance(obj, dict) and "avg_spec_accept_length" in obj)
    ):
        return None
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
        engine="sglang",
        source="sglang-server-info",
        where=where,
        drafts=None,
        gauge=sum(vals) / len(vals),
        gauge_scope=f"the server's lifetime average over {len(vals)} scheduler(s), no count",
        num_spec_tokens=steps if type(steps) is int and steps > 0 else None,
        notes=notes,
        device=device,
    )


FAMILY = Family(
    "sglang",
    "sglang:",
    per_position=False,
    per_position_hint="SGLang's responses: /generate meta_info (spec_correct_drafts_histogram), or "
    '/v1/completions with "return_spec_tokens_details": true (sglext.spec_tokens_details)',
    responses_expected="SGLang responses (meta_info spec_correct_drafts_histogram, or "
    'sglext.spec_tokens_details from /v1/completions with "return_spec_tokens_details": true)',
    read_log=read_log,
    read_response=read_response,
    from_responses=lambda r: histogram_profile(r, "sglang-responses"),
    read_document=read_document,
    from_totals=from_totals,
    counters=lambda name: name in ("sglang:spec_verify_calls", "sglang:generation_tokens"),
    # its startup durations per phase: a "mostrecent" gauge measured once per boot (its multiprocess
    # registry exports neither a process collector nor _created), metrics_collector.py
    identity=("sglang:startup_time_seconds",),
)
