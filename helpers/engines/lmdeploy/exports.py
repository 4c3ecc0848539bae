"""LMDeploy's exports, as its own code writes them (``lmdeploy/metrics/loggers.py``, adapted from vLLM's):
the ``lmdeploy:spec_decode_*`` counters on the API server's ``/metrics`` (``--enable-metrics``; one counter
per draft position, ``..._num_accepted_tokens_per_pos_total{position}``, beside gauges of the mean accept
rate and length), and the stats line it prints every interval, "[date DP0] Avg thr (in/out): ... KV cache:
..., SpecDecoding metrics: ... Accepted: A tokens, Drafted: D tokens, Per-position acceptance rate: ...",
each covering the interval since the one before. Its responses carry no acceptance counts. docs/metrics.md
has the table.
"""

from __future__ import annotations

from ...investigation.served import Family, ServedProfile, spec_decoding_lines

# what opens LMDeploy's stats line (LoggingStatLogger.log), and not vLLM's
STATS_LINE = "Avg thr (in/out):"


def read_log(text: str, where: str) -> ServedProfile | None:
    return spec_decoding_lines(text, where, "lmdeploy", lambda line: STATS_LINE in line)


FAMILY = Family(
    "lmdeploy",
    "lmdeploy:",
    per_position=True,
    per_position_hint="LMDeploy's /metrics (lmdeploy:spec_decode_num_accepted_tokens_per_pos_total, with "
    "--enable-metrics) or its log's 'SpecDecoding metrics' stats lines",
    responses_expected="",   # its responses carry no acceptance counts
    read_log=read_log,
    counters=lambda name: name.startswith("lmdeploy:spec_decode_num"),
)
