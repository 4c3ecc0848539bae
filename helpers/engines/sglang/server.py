"""A live SGLang server: its launch command with EAGLE-3 flags, its process group from start to stop (on every
exit path, its shared memory reclaimed), and what ``/server_info`` says about speculation.

It never imports ``sglang`` (which needs CUDA) and works with an SGLang installed in a different Python
than the notebook's: ``engines.sglang.engine`` drives it, and ``engines.sglang.bench`` measures through it
(the paired, interleaved design of ``live.timing``).

Names read from SGLang's source (0.5.9 and 0.5.23 wheels):
- CLI flags: ``srt/server_args.py`` (0.5.9); ``srt/arg_groups/fields/{model,spec,parallel,
  schedule,serving}.py`` (0.5.23, where flags are generated from dataclass field names).
- HTTP routes ``/health``, ``/health_generate``, ``/generate``, ``/server_info`` and the
  deprecated ``/get_server_info``: ``srt/entrypoints/http_server.py``.
- ``meta_info`` keys ``prompt_tokens``, ``completion_tokens``, ``e2e_latency``,
  ``spec_verify_ct``, ``spec_accept_length``: ``srt/managers/tokenizer_manager.py``.
- ``internal_states[i]["avg_spec_accept_length"]``: ``srt/managers/scheduler.py`` (0.5.9),
  ``srt/managers/scheduler_components/internal_state.py`` (0.5.23).
"""
from __future__ import annotations

import atexit
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ... import net
from ...errors import check_loopback
from ...live.stopping import reclaim_shm, shm_names

DEFAULT_PORT = 30000
HEALTH_PATH = "/health_generate"  # runs a one-token generation, so 200 means it can decode
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")  # new name first; old kept as alias

# --------------------------------------------------------------------------- launch spec


def default_python() -> str:
    return os.environ.get("SGLANG_PYTHON") or sys.executable


@dataclass
class ServerSpec:
    """Everything needed to start one SGLang server; ``command`` replaces the built one.

    ``draft_tokens=None`` means ``steps + 1``: with top-k 1 the draft tree is a chain, and
    SGLang wants the number of draft tokens to be the chain length plus the root.
    """

    target: str
    draft: str | None = None
    port: int = DEFAULT_PORT
    host: str = "127.0.0.1"
    python: str = field(default_factory=default_python)
    steps: int = 3
    topk: int = 1
    draft_tokens: int | None = None
    tp_size: int = 1
    mem_fraction: float | None = None
    extra_args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    command: list[str] | None = None

    def __post_init__(self) -> None:
        check_loopback(self.host)
        self.target = str(self.target)
        self.draft = None if self.draft is None else str(self.draft)
        self.extra_args = tuple(str(a) for a in self.extra_args)
        if self.steps < 1 or self.topk < 1:
            raise ValueError(f"steps and topk must be >= 1, got steps={self.steps} topk={self.topk}")

    @property
    def num_draft_tokens(self) -> int:
        return self.draft_tokens if self.draft_tokens is not None else self.steps + 1

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"


def build_launch_command(spec: ServerSpec, speculative: bool = True) -> list[str]:
    """The ``sglang.launch_server`` argv; the baseline is the same command minus the draft.

    Keeping both from one builder means the two servers differ only in speculation, so the
    tok/s ratio measures the draft and nothing else.
    """
    cmd = [
        spec.python, "-m", "sglang.launch_server",
        "--model-path", spec.target,
        "--host", spec.host,
        "--port", str(spec.port),
        "--tp-size", str(spec.tp_size),
    ]
    if spec.mem_fraction is not None:
        cmd += ["--mem-fraction-static", str(spec.mem_fraction)]
    if speculative:
        if not spec.draft:
            raise ValueError("a speculative server needs a draft model path")
        cmd += [
            "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", spec.draft,
            "--speculative-num-steps", str(spec.steps),
            "--speculative-eagle-topk", str(spec.topk),
            "--speculative-num-draft-tokens", str(spec.num_draft_tokens),
        ]
    return cmd + list(spec.extra_args)


def find_free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now; racy by nature, good enough for one local server."""
    check_loopback(host)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- HTTP


MAX_ANSWER_BYTES = 256 * net.MB    # a /generate answer with its hidden states, or /server_info


def http_json(url: str, payload: dict | None = None, timeout: float = 600.0) -> Any:
    """GET (payload None) or POST JSON; SGLang answers errors with a JSON body worth showing. Any failure is
    a RuntimeError naming the request."""
    method = "GET" if payload is None else "POST"
    try:
        if payload is None:
            resp = net.get(url, deadline_s=timeout, max_bytes=MAX_ANSWER_BYTES)
        else:
            resp = net.post_json(url, payload, deadline_s=timeout, max_bytes=MAX_ANSWER_BYTES)
        return resp.json()
    except net.HTTPStatus as e:
        body = e.body.decode(errors="replace")[:500]
        raise RuntimeError(f"{method} {url} -> HTTP {e.code}: {body}") from None
    except (net.NetError, ValueError) as e:
        raise RuntimeError(f"{method} {url}: {e}") from None


def _is_healthy(url: str, timeout: float = 5.0) -> bool:
    return net.healthy(url, deadline_s=timeout)


# --------------------------------------------------------------------------- server lifecycle


class ServerStartError(RuntimeError):
    """The server exited or never became healthy; the message carries its log tail."""


def _proc_state(pid: int) -> tuple[str, int] | None:
    """(state letter, process group) from /proc, or None when the pid is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8")
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # the command name may hold spaces
    return fields[0], int(fields[2])


def _group_alive(pgid: int) -> bool:
    """Zombies do not count: in a container nothing may reap orphaned SGLang workers."""
    if Path("/proc/self/stat").exists():
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                st = _proc_state(int(entry.name))
                if st and st[1] == pgid and st[0] not in ("Z", "X"):
                    return True
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _read_tail(path: Path, lines: int) -> str:
    try:
        text = path.read_text(errors="replace", encoding="utf-8")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


# What an SGLang group killed before its own cleanup leaves in /dev/shm (0.5.23): the load snapshot's slot
# file (managers/load_snapshot.py), pid-stamped segments, and Python multiprocessing's semaphores
SHM_PREFIXES = ("sglang_loads_", "sgl_shm_", "sem.mp-")


class SGLangServer:
    """One server process group, stopped on every way out of the ``with`` block.

    SGLang forks scheduler and detokenizer processes; killing only the launcher leaves them
    holding the GPU. So the server gets its own session (process group) and the whole group
    is terminated, then killed after ``grace_s``. ``atexit`` covers a notebook kernel that
    exits without leaving the block; a SIGKILL of this process is not covered.
    """

    def __init__(
        self,
        spec: ServerSpec,
        speculative: bool = True,
        log_path: str | os.PathLike | None = None,
        startup_timeout: float = 900.0,
        poll_interval: float = 1.0,
        grace_s: float = 20.0,
        health_path: str = HEALTH_PATH,
    ) -> None:
        self.spec = spec
        self.speculative = speculative
        self.command = list(spec.command) if spec.command else build_launch_command(spec, speculative)
        self.startup_timeout = startup_timeout
        self.poll_interval = poll_interval
        self.grace_s = grace_s
        self.health_path = health_path
        self.log_path = Path(log_path) if log_path else self._temp_log()
        self.proc: subprocess.Popen | None = None
        self._pgid: int | None = None
        self._shm_before: frozenset[str] = frozenset()

    @staticmethod
    def _temp_log() -> Path:
        fd, name = tempfile.mkstemp(prefix="sglang-server-", suffix=".log")
        os.close(fd)
        return Path(name)

    @property
    def base_url(self) -> str:
        return self.spec.base_url

    def log_tail(self, lines: int = 40) -> str:
        return _read_tail(self.log_path, lines)

    def start(self) -> "SGLangServer":
        """Launch and block until healthy; any failure stops the group before raising."""
        if self.proc is not None:
            raise RuntimeError("server already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **{k: str(v) for k, v in self.spec.env.items()}}
        self._shm_before = shm_names()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, start_new_session=True,
            )
        self._pgid = self.proc.pid  # new session: the leader's pid is the group id
        atexit.register(self.stop)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        url = self.base_url + self.health_path
        deadline = time.monotonic() + self.startup_timeout
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerStartError(self._failure(f"exited with code {code} before becoming healthy"))
            # /health_generate may wait on a real one-token generation; give it time.
            if _is_healthy(url, timeout=max(1.0, min(30.0, deadline - time.monotonic()))):
                return
            if time.monotonic() >= deadline:
                raise ServerStartError(self._failure(f"not healthy at {url} after "
                                                     f"{self.startup_timeout:.0f} s"))
            time.sleep(self.poll_interval)

    def _failure(self, what: str) -> str:
        return (
            f"SGLang server {what}.\n  command: {shlex.join(self.command)}\n  log: {self.log_path}\n"
            f"--- last lines of the log ---\n{self.log_tail()}"
        )

    def stop(self) -> None:
        """Terminate the group, kill it after the grace period; safe to call twice."""
        if self.proc is None:
            return
        atexit.unregister(self.stop)
        pgid, proc = self._pgid, self.proc
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + self.grace_s
        while time.monotonic() < deadline:
            proc.poll()
            if proc.returncode is not None and not _group_alive(pgid):
                break
            time.sleep(0.1)
        _signal_group(pgid, signal.SIGKILL)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        self.proc = None
        if not _group_alive(pgid):
            reclaim_shm(self._shm_before, SHM_PREFIXES)

    def __enter__(self) -> "SGLangServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# --------------------------------------------------------------------------- what /server_info says


@dataclass
class ServerInfo:
    """What /server_info says about speculation; ``raw`` keeps the rest."""

    version: str | None
    speculative_algorithm: str | None
    avg_spec_accept_length: float | None
    raw: dict


def parse_server_info(info: dict) -> ServerInfo:
    """avg_spec_accept_length lives in internal_states (one dict per DP rank); average them."""
    states = info.get("internal_states") or []
    values = [s["avg_spec_accept_length"] for s in states if isinstance(s, dict)
              and s.get("avg_spec_accept_length") is not None]
    if not values and info.get("avg_spec_accept_length") is not None:
        values = [info["avg_spec_accept_length"]]
    return ServerInfo(
        version=info.get("version"),
        speculative_algorithm=info.get("speculative_algorithm"),
        avg_spec_accept_length=float(statistics.fmean(values)) if values else None,
        raw=info,
    )


def read_server_info(base_url: str, timeout: float = 30.0) -> ServerInfo:
    """Try /server_info, then the older /get_server_info alias."""
    errors = []
    for path in SERVER_INFO_PATHS:
        try:
            return parse_server_info(http_json(base_url.rstrip("/") + path, timeout=timeout))
        except RuntimeError as e:
            errors.append(f"{path}: {e}")
    raise RuntimeError("no server info endpoint answered: " + "; ".join(errors))
