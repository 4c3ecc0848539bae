"""A real vLLM engine, started from the workbook in its own venv and process, stopped on every exit.

``VllmEngine`` is the workbook's side of ``helpers/engines/vllm/worker.py``: it finds ``.venv-vllm``
(``install.find_vllm``), starts the worker with bounded memory and threads, shows a progress line
while the engine loads (20-30 s on a 2-core CPU), and answers typed results. The process is stopped
by its process group on ``close()``, on leaving a ``with`` block, on interpreter exit and on SIGTERM
(``helpers.live.stopping``, installed when the first engine starts), so no engine outlives the notebook
cell or test that started it.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from ...errors import InputError
from ...live import guard
from ...live.settings import GPU_SHARE, THREAD_ENV, flat_settings, resolved_settings
from ...live.stopping import Stoppable, track, untrack
from .install import VllmInstall
from .plugin import FIXES, FIXES_ENV, REPORT_ENV

WORKER = Path(__file__).with_name("worker.py")
# The MLA backend every CPU launch asks for, through vLLM's own switch (``attention_config.backend``). On an
# x86 CPU with AMX tiles vLLM 0.32 otherwise picks AMX_MLA for any MLA model (vllm/platforms/cpu.py:151-164),
# whose weight packing takes bfloat16 only (amx_mla.py:125, :303) and a 576-wide latent only (:128-130); the
# workbook serves float32 and other widths. Asking for CPU_MLA gets the reference backend on every x86 host,
# AMX or not (cpu.py:156, and :251-257 keep its block size and prefill settings with it); layers that are not
# MLA (a Llama target, the EAGLE-3 draft) get CPU_ATTN whatever was asked (cpu.py:177-179). docs/vllm.md.
CPU_MLA_BACKEND = "CPU_MLA"


class EngineStartError(InputError):
    """vLLM would not start (or died): the one line says why, the log file says the rest."""


@dataclass
class Generation:
    tokens: list[list[int]]            # per prompt, the generated ids
    seconds: list[float]               # per prompt, wall time of its request
    drafts: int = 0                    # vLLM's counters over this call (0 without speculation)
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    per_request: list[dict | None] = field(default_factory=list)   # per prompt, its request id and
    # spec_decode_metrics.to_dict() (None unless the launch asked per_request_spec_decode_metrics)

    @property
    def accept_length(self) -> float:
        """Tokens per verify step, as vLLM counts them: 1 + accepted drafts per draft round."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else 1.0


@dataclass
class LaunchSpec:
    """What one engine serves: a target alone, or with an EAGLE-3 draft and ``steps`` drafts per round."""

    target: Path
    draft: Path | None = None
    steps: int = 3
    max_model_len: int = 1024
    fixes: tuple[str, ...] = ()
    dtype: str = "float32"
    extract_ids: tuple[int, ...] | None = None   # hidden-state extraction (the speculators >= 0.5 dump path)
    storage: Path | None = None                  # where extraction writes one safetensors file per request
    device: str = "cpu"
    guard: guard.Mode = guard.Mode.WARN          # the engine guard in this launch (docs/guard.md)
    per_request_spec_decode_metrics: str = "none"   # vLLM's --per-request-spec-decode-metrics: none,
                                                 # summary or detailed (each output's spec_decode_metrics)
    log_stats_interval: float | None = None      # seconds between vLLM's stats log lines (INFO level,
                                                 # "SpecDecoding metrics: ..."); None: vLLM's own (10 s)

    def llm_kwargs(self) -> dict:
        target = str(Path(self.target).resolve())      # the worker runs in its log folder
        kw = {"model": target, "tokenizer": target, "dtype": self.dtype,
              "max_model_len": self.max_model_len, "enforce_eager": True, "seed": 0,
              "disable_log_stats": False, "max_num_seqs": 4, "enable_prefix_caching": False}
        if self.device == "cpu":
            kw["attention_config"] = {"backend": CPU_MLA_BACKEND}
        else:       # two engines share the GPU in a paired benchmark: each its stated share (settings.py)
            kw["gpu_memory_utilization"] = GPU_SHARE
        if self.draft is not None:
            kw["speculative_config"] = {"method": "eagle3", "model": str(Path(self.draft).resolve()),
                                        "num_speculative_tokens": int(self.steps)}
        if self.per_request_spec_decode_metrics != "none":
            kw["per_request_spec_decode_metrics"] = self.per_request_spec_decode_metrics
        if self.extract_ids is not None:
            kw["speculative_config"] = {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                                        "draft_model_config": {"hf_config": {
                                            "eagle_aux_hidden_state_layer_ids": list(self.extract_ids)}}}
            cpu_connector = {"kv_connector": "CpuHiddenStatesConnector",
                             "kv_connector_module_path": "helpers.engines.vllm.connector"}
            connector = (cpu_connector if self.device == "cpu"
                         else {"kv_connector": "ExampleHiddenStatesConnector"})
            kw["kv_transfer_config"] = connector | {
                "kv_role": "kv_producer",
                "kv_connector_extra_config": {"shared_storage_path": str(Path(self.storage).resolve()),
                                              "use_synchronization_lock": False}}
        return kw

    @property
    def label(self) -> str:
        if self.extract_ids is not None:
            return f"{self.target.name}, extracting ids {list(self.extract_ids)}"
        return f"{self.target.name}" + (f" + {self.draft.name} (k={self.steps})" if self.draft else "")


class VllmEngine(Stoppable):
    """One running engine. ``with VllmEngine(install, spec) as e: e.generate(...)``."""

    def __init__(self, install: VllmInstall, spec: LaunchSpec, *, kv_cache_gib: int = 1,
                 threads: int | None = None, start_timeout: float = 600.0, progress: bool = True,
                 log_dir: Path | None = None):
        bad = [f for f in spec.fixes if f not in FIXES]
        if bad:
            raise InputError(f"unknown vLLM fix(es) {bad}; known: {', '.join(FIXES)}")
        self.install, self.spec = install, spec
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="eagle3-vllm-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = self.log_dir / f"vllm-{os.getpid()}-{id(self):x}.log"
        self.report_path = self.log_path.with_suffix(".fixes.jsonl")
        self.version = ""
        self.start_seconds = 0.0
        self.proc: subprocess.Popen | None = None
        self._reply = None
        self._start(kv_cache_gib, threads, start_timeout, progress)

    # -- lifecycle -------------------------------------------------------------------------

    def _env(self, kv_cache_gib: float, threads: int | None) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_", "EAGLE3_WORKBOOK_VLLM"))}
        env.update(VLLM_CPU_KVCACHE_SPACE=str(int(kv_cache_gib)), VLLM_ENABLE_V1_MULTIPROCESSING="0",
                   VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
                   TOKENIZERS_PARALLELISM="false")
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), VLLM_CPU_OMP_THREADS_BIND="nobind")
        if self.spec.log_stats_interval is not None:     # its lines are INFO: the level goes down with it
            env.update(VLLM_LOG_STATS_INTERVAL=str(float(self.spec.log_stats_interval)),
                       VLLM_LOGGING_LEVEL=os.environ.get("VLLM_LOGGING_LEVEL", "INFO"))
        for key in ("VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU"):
            if key in os.environ and key not in env:
                env[key] = os.environ[key]
        env[FIXES_ENV] = ",".join(self.spec.fixes)
        env[REPORT_ENV] = str(self.report_path)
        env[guard.GUARD_ENV] = str(self.spec.guard)
        return env

    def settings(self) -> dict[str, str]:
        """Every engine setting of this launch: the ``LLM`` arguments (flattened) and the thread and memory
        variables; what a speed ratio's two sides are held to share, except speculation."""
        return dict(self._settings)

    def _start(self, kv_cache_gib, threads, start_timeout, progress) -> None:
        env = self._env(kv_cache_gib, threads)
        self._settings = flat_settings(self.spec.llm_kwargs(), {k: env[k] for k in THREAD_ENV if k in env})
        read_fd, write_fd = os.pipe()
        log = open(self.log_path, "w", encoding="utf-8")
        try:
            self.proc = subprocess.Popen(
                [str(self.install.python), str(WORKER), "--spec", json.dumps(self.spec.llm_kwargs()),
                 "--reply-fd", str(write_fd)],
                stdin=subprocess.PIPE, stdout=log, stderr=log, pass_fds=(write_fd,), text=True,
                env=env, start_new_session=True, cwd=str(self.log_dir))
        finally:
            os.close(write_fd)
            log.close()
        self._reply = os.fdopen(read_fd, "r", encoding="utf-8")
        track(self)
        started = time.perf_counter()
        bar = tqdm(total=None, desc=f"starting vLLM ({self.spec.label})", disable=not progress,
                   bar_format="{desc}: {elapsed}", mininterval=5.0)
        try:
            while True:
                ready, _, _ = select.select([self._reply], [], [], 1.0)
                bar.update(0)
                if ready:
                    line = self._reply.readline()
                    if not line:
                        raise EngineStartError(self._died("exited while starting"))
                    msg = json.loads(line)
                    refused = guard.refusal(self.guard_verdict()) if not msg.get("ready") else None
                    if refused:       # the engine guard refused: the line its report holds is the reason
                        raise EngineStartError(f"vLLM refused {self.spec.label}: {refused} "
                                               f"(log: {self.log_path})")
                    if not msg.get("ready"):
                        raise EngineStartError(f"vLLM would not start {self.spec.label}: {msg.get('error')} "
                                               f"(log: {self.log_path})")
                    self.version = msg["vllm"]
                    self._settings |= resolved_settings(msg.get("resolved") or {})
                    unjudged = guard.unjudged_launch(self.spec.guard, self.guard_verdict(),
                                                     engine=f"vLLM {self.version}", log=self.log_path) \
                        if self.spec.draft is not None else None
                    if unjudged:
                        raise EngineStartError(f"vLLM refused {self.spec.label}: {unjudged}")
                    break
                if time.perf_counter() - started > start_timeout:
                    raise EngineStartError(f"vLLM did not start {self.spec.label} within "
                                           f"{start_timeout:.0f} s (log: {self.log_path})")
        except BaseException:
            bar.close()
            self.close()
            raise
        bar.close()
        self.start_seconds = round(time.perf_counter() - started, 2)

    def _died(self, when: str) -> str:
        code = self.proc.poll() if self.proc else None
        tail = ""
        try:
            lines = [ln for ln in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines()
                     if ln.strip()]
            errors = [ln for ln in lines if "Error" in ln or "error" in ln]
            tail = (errors or lines or [""])[-1].strip()[:300]
        except OSError:
            pass
        return f"vLLM {when} (exit status {code}): {tail} (log: {self.log_path})"

    def close(self) -> None:
        """Stop the engine's whole process group; safe to call twice."""
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            try:
                proc.stdin.write(json.dumps({"op": "stop"}) + "\n")
                proc.stdin.flush()
                proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
            for sig in (signal.SIGTERM, signal.SIGKILL):
                if proc.poll() is not None:
                    break
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=10)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass
        if proc is not None and proc.stdin:
            try:
                proc.stdin.close()
            except OSError:
                pass
        if self._reply is not None:
            self._reply.close()
            self._reply = None
        untrack(self)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def fixes_report(self) -> list[dict]:
        """What the plugin did in the engine's process: one record per fix asked for."""
        if not self.report_path.is_file():
            return []
        seen = {}
        for r in self._report_rows():
            if "fix" in r:
                seen[r["fix"]] = {"fix": r["fix"], "state": r["state"], "why": r["why"]}
        return list(seen.values())

    def _report_rows(self) -> list[dict]:
        if not self.report_path.is_file():
            return []
        return [json.loads(ln) for ln in self.report_path.read_text(encoding="utf-8").splitlines()
                if ln.strip()]

    def guard_verdict(self) -> dict | None:
        """What the engine guard judged inside vLLM at load (``helpers.live.guard``), or None (off, or no
        draft)."""
        rows = [r["guard"] for r in self._report_rows() if "guard" in r]
        return rows[-1] if rows else None

    # -- requests --------------------------------------------------------------------------

    def _ask(self, req: dict) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            raise EngineStartError(self._died("is not running"))
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self._reply.readline()
        if not line:
            raise EngineStartError(self._died(f"died during {req['op']}"))
        msg = json.loads(line)
        if not msg.get("ok"):
            raise EngineStartError(f"vLLM failed {req['op']}: {msg.get('error')} (log: {self.log_path})")
        return msg

    def generate(self, prompts: list[list[int]], max_tokens: int, *, temperature: float = 0.0,
                 seed: int | None = None) -> Generation:
        """Greedy (``temperature`` 0, the default), one prompt at a time (the latency speculative decoding
        is for), timed per prompt; ``seed`` makes a sampled run repeatable (prompt i gets ``seed + i``)."""
        req = {"op": "generate", "prompts": prompts, "max_tokens": int(max_tokens)}
        if temperature:
            req |= {"temperature": float(temperature), "seed": seed}
        msg = self._ask(req)
        before, after = msg["counters_before"], msg["counters_after"]

        def delta(key):
            return int(after.get(key, 0)) - int(before.get(key, 0))

        after_pos = after.get("accepted_per_position", [])
        before_pos = list(before.get("accepted_per_position", [])) + [0] * len(after_pos)
        per_pos = [int(a) - int(b) for a, b in zip(after_pos, before_pos)]
        return Generation(msg["tokens"], msg["seconds"], delta("drafts"), delta("draft_tokens"),
                          delta("accepted_tokens"), per_pos, msg.get("per_request", []))

    def metrics_text(self) -> str:
        """The engine's counters as its ``/metrics`` endpoint would serve them (Prometheus text): what a
        deployment's dashboard scrapes, for ``diagnose --metrics``."""
        return self._ask({"op": "metrics"})["text"]

    def prompt_logprobs(self, prompts: list[list[int]]) -> list[list[tuple[float, int]]]:
        """Per prompt, per position from 1: (log p of the actual token, the argmax token)."""
        return [[(float(a), int(t)) for a, t in rows] for rows in self._ask(
            {"op": "prompt_logprobs", "prompts": prompts})["logprobs"]]
