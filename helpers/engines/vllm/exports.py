"""vLLM's exports, as its own code writes them: the ``vllm:spec_decode_*`` counters on /metrics (one per
draft position: ``..._num_accepted_tokens_per_pos{position}``), the "SpecDecoding metrics: ..." log line
(each covers the interval since the one before, so lines add up), and the per-request acceptance histogram
of ``--per-request-spec-decode-metrics`` responses (``metrics.speculative_decoding.acceptance_histogram``,
v1/metrics/stats.py:350-421) or the offline API's ``spec_decode_metrics``. docs/metrics.md has the table.
"""

from __future__ import annotations

from ...investigation.served import (
    Counted,
    Family,
    ServedProfile,
    counts_list,
    histogram_profile,
    spec_decoding_lines,
)


def read_log(text: str, where: str) -> ServedProfile | None:
    return spec_decoding_lines(text, where, "vllm", lambda line: True)


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
