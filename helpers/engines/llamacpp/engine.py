"""``llama-server`` as a live engine: one process on this host's CPU, started, asked, counted and stopped.

The engine ``live.bench`` drives (``LiveEngine``): a target GGUF alone (the baseline) or with an EAGLE-3
draft GGUF (``--spec-type draft-eagle3``), the two launches sharing every setting but the draft's flags
(``settings()``). Each request is one prompt's token ids to ``/completion``, greedy (temperature 0), the
end-of-text token ignored, no prompt cache, so every request does the same work on both sides and the
output is compared id for id. The draft counters are llama.cpp's own: its ``/metrics`` page (``--metrics``)
read before and after each request gives the drafts, drafted and accepted tokens and the accepted count
per draft position, and the response's ``timings.draft_n`` / ``draft_n_accepted`` are kept beside them.

One slot (``--parallel 1``): llama.cpp orders the captured layer inputs per batch, and upstream issue
#29019 (several sequences sharing a batch) is open. The process is stopped by its pid on every exit path
(``live.stopping``). The guard runs before the launch (llama.cpp has no plugin system): the draft GGUF's
``eagle3.target_layers`` against its training record (``engines.llamacpp.bench``).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ... import net
from ...errors import InputError, check_loopback
from ...investigation.exports import parse_prometheus
from ...live.settings import argv_settings
from ...live.stopping import Stoppable, track, untrack
from .build import ServerBuild

HOST = "127.0.0.1"
START_TIMEOUT_S = 300.0
REQUEST_TIMEOUT_S = 600.0
MAX_ANSWER_BYTES = 64 * net.MB      # a completion with its per-token details
PREFIX = "llamacpp:spec_decode_"


class LlamacppEngineError(InputError):
    """llama-server exited, never became healthy, answered a request with an error, or was refused by the
    guard before it started; one line (with its log's path), exit 2 at a command's edge."""


@dataclass
class Generation:
    """What one ``generate`` call produced, with llama.cpp's own counters over it."""

    tokens: list[list[int]]            # per prompt, the generated ids
    seconds: list[float]               # per prompt, wall time of its request
    drafts: int = 0                    # draft rounds (llamacpp:spec_decode_num_drafts)
    draft_tokens: int = 0              # drafted tokens (..._num_draft_tokens)
    accepted_tokens: int = 0           # accepted drafted tokens (..._num_accepted_tokens)
    accepted_per_position: list[int] = field(default_factory=list)   # ..._per_pos{position}
    timings: list[dict] = field(default_factory=list)   # each response's ``timings``, as sent

    @property
    def accept_length(self) -> float:
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else 1.0


@dataclass(frozen=True)
class ServerLaunch:
    """One ``llama-server`` launch: the files, the draft's chain length, the CPU it may use."""

    target_gguf: Path
    draft_gguf: Path | None = None
    steps: int = 3                     # --spec-draft-n-max: draft tokens per round (one chain)
    threads: int = 2
    ctx_size: int = 1024

    def argv(self, server: Path, port: int) -> list[str]:
        cmd = [str(server), "--model", str(self.target_gguf), "--host", HOST, "--port", str(port),
               "--threads", str(self.threads), "--threads-batch", str(self.threads),
               "--ctx-size", str(self.ctx_size), "--parallel", "1", "--metrics", "--no-webui",
               "--seed", "0", "--log-verbosity", "3"]
        if self.draft_gguf is not None:
            cmd += ["--model-draft", str(self.draft_gguf), "--spec-type", "draft-eagle3",
                    "--spec-draft-n-max", str(self.steps), "--spec-draft-n-min", "0",
                    "--spec-draft-p-min", "0", "--spec-draft-threads", str(self.threads),
                    "--spec-draft-threads-batch", str(self.threads)]
        return cmd


def _free_port() -> int:
    check_loopback(HOST)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


class LlamacppEngine(Stoppable):
    """A started ``llama-server``; ``with LlamacppEngine(build, launch) as e: e.generate(...)``."""

    def __init__(self, build: ServerBuild, launch: ServerLaunch, *, log_dir: Path | None = None,
                 guard: dict | None = None) -> None:
        self.build = build
        self.launch = launch
        self.version = build.build
        self.port = _free_port()
        self.argv = launch.argv(build.server, self.port)
        if log_dir is not None:
            log_dir.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix="llama-server-", suffix=".log",
                                    dir=None if log_dir is None else str(log_dir))
        os.close(fd)
        self.log_path = Path(name)
        self._guard = guard
        self.proc: subprocess.Popen | None = None
        t0 = time.perf_counter()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        track(self)
        try:
            self._wait_healthy()
        except BaseException:
            self.close()
            raise
        self.start_seconds = round(time.perf_counter() - t0, 2)

    # ----------------------------------------------------------------------------- lifecycle

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            code = self.proc.poll()
            if code is not None:
                raise LlamacppEngineError(f"llama-server exited with code {code} before it was ready: "
                                          f"{self.log_tail()} (log: {self.log_path})")
            if net.healthy(self.base_url + "/health", deadline_s=5):
                return
            if time.monotonic() > deadline:
                raise LlamacppEngineError(f"llama-server not ready after {START_TIMEOUT_S:.0f} s "
                                          f"(log: {self.log_path})")
            time.sleep(0.2)

    def log_tail(self, lines: int = 1) -> str:
        try:
            text = [ln.strip() for ln in self.log_path.read_text(encoding="utf-8", errors="replace")
                    .splitlines() if ln.strip()]
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def close(self) -> None:
        """SIGTERM to its pid, SIGKILL after 10 s; safe to call twice."""
        proc, self.proc = self.proc, None
        untrack(self)
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGCONT)   # a paused server cannot act on SIGTERM
        except (ProcessLookupError, PermissionError):
            pass
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP while the other engine is timed; ``resume`` continues it."""
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None:
            os.kill(self.proc.pid, signal.SIGCONT)

    # ----------------------------------------------------------------------------- requests

    def _post(self, path: str, payload: dict) -> dict:
        try:
            return net.post_json(self.base_url + path, payload, deadline_s=REQUEST_TIMEOUT_S,
                                 max_bytes=MAX_ANSWER_BYTES).json()
        except net.HTTPStatus as exc:
            body = exc.body.decode(errors="replace")[:300]
            raise LlamacppEngineError(f"POST {path} -> HTTP {exc.code}: {body}") from None
        except (net.NetError, ValueError) as exc:
            raise LlamacppEngineError(f"POST {path}: {exc} (log: {self.log_path})") from None

    def metrics_text(self) -> str | None:
        try:
            return net.get(self.base_url + "/metrics", deadline_s=30, max_bytes=4 * net.MB).text()
        except net.NetError:
            return None

    def _counters(self) -> tuple[float, float, float, dict[int, float]]:
        """llama.cpp's draft counters now; an unreadable page is an error, never zero drafts."""
        text = self.metrics_text()
        s = None if text is None else parse_prometheus(text, "llama-server /metrics")
        if s is None:
            raise LlamacppEngineError(f"llama-server's /metrics did not answer with its counters "
                                      f"(log: {self.log_path})")
        if s.total(PREFIX + "num_drafts") is None:
            return 0.0, 0.0, 0.0, {}          # the series not written yet: nothing counted
        return (s.total(PREFIX + "num_drafts") or 0.0, s.total(PREFIX + "num_draft_tokens") or 0.0,
                s.total(PREFIX + "num_accepted_tokens") or 0.0,
                s.by_label(PREFIX + "num_accepted_tokens_per_pos", "position"))

    def completion(self, prompt: list[int], max_tokens: int) -> dict:
        """One greedy ``/completion`` of ``max_tokens`` ids after ``prompt``'s ids: the response as sent."""
        return self._post("/completion", {
            "prompt": [int(t) for t in prompt], "n_predict": int(max_tokens), "temperature": 0.0,
            "top_k": 1, "ignore_eos": True, "cache_prompt": False, "return_tokens": True, "seed": 0,
            "stream": False})

    def generate(self, prompts: list[list[int]], max_tokens: int) -> Generation:
        speculative = self.launch.draft_gguf is not None
        out = Generation([], [])
        before = self._counters() if speculative else None
        for p in prompts:
            t0 = time.perf_counter()
            body = self.completion(p, max_tokens)
            out.seconds.append(time.perf_counter() - t0)
            toks = body.get("tokens")
            if not isinstance(toks, list):
                raise LlamacppEngineError(f"/completion answered without 'tokens' (keys {sorted(body)[:8]})")
            out.tokens.append([int(t) for t in toks])
            out.timings.append(body.get("timings") or {})
        if speculative:
            after = self._counters()
            out.drafts = int(after[0] - before[0])
            out.draft_tokens = int(after[1] - before[1])
            out.accepted_tokens = int(after[2] - before[2])
            width = max([*after[3], *before[3], -1]) + 1
            out.accepted_per_position = [int(after[3].get(i, 0) - before[3].get(i, 0)) for i in range(width)]
        return out

    # ----------------------------------------------------------------------------- what the row says

    def settings(self) -> dict[str, str]:
        s = argv_settings(self.argv[1:])
        for k in ("--model", "--model-draft"):
            if k in s:
                s[k] = Path(s[k]).name
        return s

    def fixes_report(self) -> list[dict]:
        return []            # the workbook changes nothing inside llama.cpp

    def guard_verdict(self) -> dict | None:
        return self._guard
