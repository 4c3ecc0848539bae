"""Record what LMDeploy exports for the tiny Llama pair, written by LMDeploy's own metrics code.

    .venv/bin/python benchmarks/record_lmdeploy_exports.py --out tests/exports [--version 0.18.0]

LMDeploy's PyTorch engine needs a CUDA (or Ascend, MACA, Cambricon) device, so it cannot serve on a
CPU-only host. What its API server would export is still taken from the release: its
``lmdeploy/metrics/stats.py`` and ``lmdeploy/metrics/loggers.py`` are read from its wheel (by ranges, into a
temporary folder) and run here on stubs of the two modules they import for names only
(``lmdeploy.messages``, ``lmdeploy.utils``): ``PrometheusStatLogger`` writes the ``/metrics`` page and
``LoggingStatLogger`` prints the stats lines, each fed one ``SpeculativeDecodingStats`` per verify step
through its own ``update_per_draft``, as the engine feeds them.

The acceptance behind those steps is measured, not assumed: the workbook's reference engine
(``helpers.model.engine``, gpt-fast's loop on this CPU's kernels) serves each draft of ``data/tiny-llama``
on the layout LMDeploy's rule, read from the release now, feeds a Llama target (its config builder's
``(2, N//2, N-3)``): the deployed draft (trained on (0, 3, 7)) miswired, the retrained one (trained on
what LMDeploy serves) as trained. Every folder gets a ``manifest.json`` saying so.
"""
from __future__ import annotations

import argparse
import datetime
import enum
import importlib.util
import io
import json
import logging
import platform
import sys
import tempfile
import types
from contextlib import redirect_stdout
from pathlib import Path

import torch

from helpers.investigation.pair import load_pair
from helpers.investigation.prompts import read_prompts
from helpers.live.reference import encode_prompts
from helpers.model.engine import speculative_generate
from helpers.rules import wheels
from helpers.rules.conventions import parse_engine

REPO = Path(__file__).resolve().parents[1]
PAIR = REPO / "data" / "tiny-llama"
DRAFTS = {"deployed": PAIR / "draft", "retrained": PAIR / "draft-retrained"}
METRICS = ("lmdeploy/metrics/stats.py", "lmdeploy/metrics/loggers.py")
PREFIXES = ("lmdeploy:spec_decode", "lmdeploy:generation_tokens")


def release_metrics(version: str, folder: Path) -> types.ModuleType:
    """LMDeploy's ``loggers`` module from its wheel, with ``lmdeploy.messages`` and ``lmdeploy.utils``
    stubbed for the names they are imported for (the real ones import torch and the engine)."""
    root = wheels.fetch("lmdeploy", version, lambda name: name in METRICS, cache=folder, whole=False)
    pkg = types.ModuleType("lmdeploy")
    pkg.__path__ = []
    messages = types.ModuleType("lmdeploy.messages")
    messages.ResponseType = enum.Enum("ResponseType", "SUCCESS FINISH ENGINE_STOP_ERROR CANCEL")
    messages.EngineEvent = messages.EngineOutput = messages.ScheduleMetrics = object
    utils = types.ModuleType("lmdeploy.utils")
    utils.get_logger = logging.getLogger
    metrics = types.ModuleType("lmdeploy.metrics")
    metrics.__path__ = []
    sys.modules.update({"lmdeploy": pkg, "lmdeploy.messages": messages, "lmdeploy.utils": utils,
                        "lmdeploy.metrics": metrics})
    for rel in METRICS:
        name = rel[:-3].replace("/", ".")
        spec = importlib.util.spec_from_file_location(name, root / rel)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules["lmdeploy.metrics.loggers"]


def trim(text: str) -> str:
    keep = []
    for line in text.splitlines():
        parts = line.split()
        name = parts[2] if line.startswith(("# HELP ", "# TYPE ")) and len(parts) > 2 else line.split("{")[0]
        if name.startswith(PREFIXES):
            keep.append(line)
    return "\n".join(keep) + "\n"


def record(loggers, steps: list[list[int]], k: int, prompt_tokens: list[int],
           log_every: int) -> tuple[str, str]:
    """Feed the release's loggers one verify step at a time (accepted drafts per step, per request) and
    return its /metrics page and its printed stats lines."""
    import prometheus_client

    stats_mod = sys.modules["lmdeploy.metrics.stats"]
    prom = loggers.PrometheusStatLogger(model_name="tiny-llama", max_model_len=2048)
    printed = loggers.LoggingStatLogger()
    out = io.StringIO()
    n = 0
    for accepted, prompt in zip(steps, prompt_tokens):
        for i, a in enumerate(accepted):
            it = stats_mod.IterationStats()
            it.prompt_tokens = prompt if i == 0 else 0
            it.new_generation_tokens = a + 1
            sd = stats_mod.SpeculativeDecodingStats(num_spec_tokens=k)
            sd.update_per_draft(num_draft_tokens=k, num_accepted_tokens=a)
            for lg in (prom, printed):
                lg.record_iteration(it)
                lg.record_specdecode(sd)
            n += 1
            if n % log_every == 0:
                with redirect_stdout(out):
                    printed.log()
    with redirect_stdout(out):
        printed.log()
    page = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode("utf-8")
    return trim(page), out.getvalue()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "exports")
    ap.add_argument("--version", default="0.18.0")
    ap.add_argument("--steps", type=int, default=3, help="--speculative-num-draft-tokens")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--log-every", type=int, default=40, help="verify steps between two stats lines")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(2)
    engine = parse_engine(f"lmdeploy=={args.version}")
    with tempfile.TemporaryDirectory(prefix="lmdeploy-metrics-") as tmp:
        loggers = release_metrics(args.version, Path(tmp))
        for name, draft in DRAFTS.items():
            pair = load_pair(PAIR / "target", draft)
            plan = pair.served(engine)
            prompts = read_prompts(PAIR / "prompts.jsonl")
            ids = encode_prompts(pair.tokenizer, prompts)
            runs = [speculative_generate(pair.target, pair.draft, plan, p, args.max_new_tokens, k=args.steps)
                    for p in ids]
            page, log = record(loggers, [r.accepted for r in runs], args.steps, [int(p.numel()) for p in ids],
                               args.log_every)
            folder = args.out / "lmdeploy" / name
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "metrics.txt").write_text(page, encoding="utf-8")
            (folder / "lmdeploy.log").write_text(log, encoding="utf-8")
            manifest = {
                "engine": "lmdeploy", "version": args.version,
                "target": str((PAIR / "target").relative_to(REPO)), "draft": str(draft.relative_to(REPO)),
                "served_layout": list(plan.layout), "served_by": plan.source,
                "launch": f"lmdeploy serve api_server {PAIR.relative_to(REPO)}/target --backend pytorch "
                          f"--speculative-algorithm eagle3 "
                          f"--speculative-draft-model {draft.relative_to(REPO)} "
                          f"--speculative-num-draft-tokens {args.steps}",
                "written_by": f"lmdeploy {args.version}'s own {', '.join(METRICS)} (PrometheusStatLogger, "
                              f"LoggingStatLogger), run on stubs of lmdeploy.messages and lmdeploy.utils",
                "acceptance_from": "the workbook's reference engine (helpers.model.engine) serving the draft "
                                   "on the layout above, greedy, on this host's CPU kernels: LMDeploy cannot "
                                   "serve on a CPU-only host",
                "not_measured": "the log lines' throughput (Avg thr) times this recording, not a server",
                "prompts_file": str((PAIR / "prompts.jsonl").relative_to(REPO)), "prompts": len(prompts),
                "max_new_tokens": args.max_new_tokens, "temperature": 0.0,
                "verify_steps": sum(len(r.accepted) for r in runs),
                "accepted_per_step_mean": round(sum(sum(r.accepted) for r in runs)
                                                / max(1, sum(len(r.accepted) for r in runs)), 4),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "host": f"{platform.machine()}, CPU", "threads": torch.get_num_threads(),
                "command": ".venv/bin/python benchmarks/record_lmdeploy_exports.py --out tests/exports",
            }
            (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
            print(f"{name}: served {plan.layout}, {manifest['verify_steps']} verify steps, "
                  f"{manifest['accepted_per_step_mean']} accepted per step -> {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
