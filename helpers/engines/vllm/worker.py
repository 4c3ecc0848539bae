"""One vLLM engine in a process of its own, driven by JSON lines (run by ``.venv-vllm``'s Python).

The notebooks' kernel never imports vLLM: it pins another transformers, and an engine's threads,
memory and crashes belong in their own process. ``helpers.engines.vllm.engine.VllmEngine`` starts this
script, writes one JSON request per line on its stdin, and reads one JSON reply per line from the
file descriptor named by ``--reply-fd`` (vLLM's own logging goes to stderr, which the host keeps
in a log file). Only vLLM's public interfaces are used: ``LLM``, ``SamplingParams``,
``TokensPrompt``, ``LLM.get_metrics()``.

Requests: ``{"op": "generate", "prompts": [[ids]], "max_tokens": N}`` (greedy unless it names a
``temperature``, with an optional ``seed``; one prompt at a time, timed one by one; each request's id
and its ``spec_decode_metrics`` where the launch asked for them),
``{"op": "prompt_logprobs", "prompts": [[ids]]}``, ``{"op": "metrics"}`` (the Prometheus text its /metrics
endpoint would serve), ``{"op": "stop"}``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos": "accepted_per_position",
}


def spec_counters(llm) -> dict:
    """vLLM's own speculative-decoding counters (cumulative since the engine started)."""
    out = {}
    for metric in llm.get_metrics():
        key = SPEC_COUNTERS.get(metric.name)
        if key is None:
            continue
        out[key] = list(metric.values) if hasattr(metric, "values") else metric.value
    return out


# what the engine resolved, read from its VllmConfig (configuration, not the capacity the weights leave)
RESOLVED = {"gpu_memory_utilization": ("cache_config", "gpu_memory_utilization"),
            "block_size": ("cache_config", "block_size"), "cache_dtype": ("cache_config", "cache_dtype"),
            "max_num_seqs": ("scheduler_config", "max_num_seqs"),
            "max_num_batched_tokens": ("scheduler_config", "max_num_batched_tokens"),
            "max_model_len": ("model_config", "max_model_len"), "dtype": ("model_config", "dtype"),
            "enforce_eager": ("model_config", "enforce_eager"),
            "tensor_parallel_size": ("parallel_config", "tensor_parallel_size")}


def resolved(llm) -> dict:
    """Each RESOLVED value the running engine holds (a release without one of them leaves it out)."""
    config = getattr(getattr(llm, "llm_engine", None), "vllm_config", None)
    out = {}
    for key, (part, name) in RESOLVED.items():
        value = getattr(getattr(config, part, None), name, None)
        if value is not None:
            out[key] = str(value)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True, help="JSON: the LLM(...) keyword arguments")
    ap.add_argument("--reply-fd", type=int, required=True)
    a = ap.parse_args()
    reply = os.fdopen(a.reply_fd, "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)                      # anything printed by a library lands in the log, not the replies

    def send(obj):
        reply.write(json.dumps(obj) + "\n")
        reply.flush()

    started = time.perf_counter()
    try:
        import vllm
        from vllm import LLM, SamplingParams
        from vllm.inputs import TokensPrompt

        llm = LLM(**json.loads(a.spec))
    except Exception as exc:  # noqa: BLE001 - the host turns this into one line
        send({"ready": False, "error": " | ".join(f"{type(exc).__name__}: {exc}".split("\n"))[:2000]})
        return 1
    send({"ready": True, "vllm": vllm.__version__, "seconds": round(time.perf_counter() - started, 2),
          "pid": os.getpid(), "resolved": resolved(llm)})
    for line in sys.stdin:
        req = json.loads(line)
        op = req.get("op")
        try:
            if op == "stop":
                send({"ok": True})
                break
            if op == "generate":
                temperature, seed = float(req.get("temperature") or 0.0), req.get("seed")
                before = spec_counters(llm)
                outputs, seconds, per_request = [], [], []
                for i, ids in enumerate(req["prompts"]):
                    params = SamplingParams(max_tokens=int(req["max_tokens"]), temperature=temperature,
                                            ignore_eos=True, seed=None if seed is None else int(seed) + i)
                    t0 = time.perf_counter()
                    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)
                    seconds.append(time.perf_counter() - t0)
                    outputs.append(list(out[0].outputs[0].token_ids))
                    metrics = getattr(out[0].outputs[0], "spec_decode_metrics", None)
                    per_request.append({"request_id": out[0].request_id,
                                        "spec_decode_metrics": metrics.to_dict()} if metrics else None)
                send({"ok": True, "tokens": outputs, "seconds": seconds, "counters_before": before,
                      "counters_after": spec_counters(llm), "per_request": per_request})
            elif op == "metrics":     # the Prometheus text vLLM's /metrics would serve, from its registry
                import prometheus_client

                send({"ok": True, "text": prometheus_client.generate_latest().decode("utf-8")})
            elif op == "prompt_logprobs":
                params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1)
                result = []
                for ids in req["prompts"]:
                    out = llm.generate([TokensPrompt(prompt_token_ids=ids)], params, use_tqdm=False)[0]
                    rows = []
                    for pos, entry in enumerate(out.prompt_logprobs or []):
                        if entry is None:          # position 0 has no prediction
                            continue
                        actual = entry[ids[pos]].logprob
                        top = max(entry.items(), key=lambda kv: kv[1].logprob)[0]
                        rows.append([actual, top])
                    result.append(rows)
                send({"ok": True, "logprobs": result})
            else:
                send({"ok": False, "error": f"unknown op {op!r}"})
        except Exception as exc:  # noqa: BLE001
            send({"ok": False, "error": f"{type(exc).__name__}: {exc}".splitlines()[0][:2000]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
