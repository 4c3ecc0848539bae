"""vLLM's exports, as its own code writes them: the ``vllm:spec_decode_*`` counters on /metrics (one per
draft position: ``..._num_accepted_tokens_per_pos{position}``), the "SpecDecoding metrics: ..." log line
(each covers the interval since the one before, so lines add up), and the per-request acceptance histogram
of ``--per-request-spec-decode-metrics`` responses (``metrics.speculative_decoding.acceptance_histogram``,
v1/metrics/stats.py:350-421) or the offline API's ``spec_decode_metrics``. docs/metrics.md has the table.
"""

from __future__ import annotations

import re

from ...investigation.served import Counted, Family, ServedProfile, counts_list, histogram_profile, numbers

_LINE = re.compile(r"SpecDecoding metrics:(?P<rest>.*)$", re.M)


def read_log(text: str, where: str) -> ServedProfile | None:
    drafts, per_pos, acc_total, drafted_total, lines = 0, [], 0, 0, 0
    for m in _LINE.finditer(text):
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
        engine="vllm",
        source="vllm-log",
        where=where,
        drafts=drafts,
        accepted_per_position=tuple(per_pos) or None,
        accepted=acc_total,
        draft_tokens=drafted_total,
        num_spec_tokens=k,
        notes=(
            f"{lines} 'SpecDecoding metrics' lines added up (each covers the interval since the one before)",
        ),
    )


def read_response(it: dict, where: str, i: int) -> Counted | None:
    """One response's acceptance histogram, where it carries one."""
    metrics = it.get("metrics")
    sd = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    if sd is None and "acceptance_histogram" in it:
        sd = it
    if sd is None and isinstance(it.get("spec_decode_metrics"), dict):
        sd = it["spec_decode_metrics"]
    if isinstance(sd, dict):
        return Counted(tuple(counts_list(
            sd.get("acceptance_histogram"), where, i, "speculative_decoding.acceptance_histogram")))
    return None


FAMILY = Family(
    "vllm",
    "vllm:",
    per_position=True,
    per_position_hint="vLLM's /metrics (vllm:spec_decode_num_accepted_tokens_per_pos_total) or "
    "--per-request-spec-decode-metrics summary responses",
    responses_expected="vLLM responses with --per-request-spec-decode-metrics (metrics.speculative_decoding)",
    read_log=read_log,
    read_response=read_response,
    from_responses=lambda r: histogram_profile(r, "vllm-responses"),
    counters=lambda name: name.startswith("vllm:spec_decode_num"),
)
