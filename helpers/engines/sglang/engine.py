"""A real SGLang engine, started from the workbook in its own venv and process group, stopped on every exit.

``SGLangEngine`` has the public shape of ``helpers.engines.vllm.engine.VllmEngine``: a context manager started
with bounded memory and threads and a progress line while it loads (10-25 s on a 2-core CPU),
``generate(prompts, max_tokens) -> Generation`` with SGLang's own counters, ``close()``. It drives
``python -m sglang.launch_server`` from ``.venv-sglang`` through ``helpers.engines.sglang.server`` (HTTP only:
sglang is never imported here). On a CPU host each launch carries the workbook's accommodations
(``helpers.engines.sglang.cpu``), recorded in ``record()``; with ``capture_rule="0.5.9"`` the target runs that
release's own ``set_eagle3_layers_to_capture`` (runtime 0.5.23, capture rule 0.5.9). The process group
is stopped on ``close()``, on leaving a ``with`` block, at interpreter exit and on SIGTERM
(``helpers.live.stopping``: the handler is installed when the first engine starts, not at import).
"""
from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from ...errors import InputError
from ...live import guard
from ...live.settings import GPU_SHARE, SGLANG_RESOLVED, THREAD_ENV, argv_settings, resolved_settings
from ...live.stopping import Stoppable, track, untrack
from ...rules.conventions import read_draft_config, read_target
from . import cpu
from . import hooks as hooks_mod
from .install import ROOT, SglangInstall
from .server import (
    ServerSpec,
    ServerStartError,
    SGLangServer,
    build_launch_command,
    find_free_port,
    http_json,
    read_server_info,
)

GUARD_SITE = Path(__file__).with_name("site")   # the guard alone, for releases without plugins


class EngineStartError(InputError):
    """SGLang would not start (or died): the one line says why, the log file says the rest."""


@dataclass
class Generation:
    """What one ``generate`` call produced, with SGLang's own per-request counters summed."""

    tokens: list[list[int]]            # per prompt, the generated ids
    seconds: list[float]               # per prompt, wall time of its request
    drafts: int = 0                    # verify rounds (meta_info spec_verify_ct; 0 without speculation)
    draft_tokens: int = 0              # drafts proposed (spec_num_proposed_drafts)
    accepted_tokens: int = 0           # drafts accepted (spec_num_correct_drafts)
    accepted_per_position: list[int] = field(default_factory=list)   # from spec_correct_drafts_histogram
    completion_tokens: int = 0
    meta: list[dict] = field(default_factory=list)                   # each request's meta_info, as sent

    @property
    def accept_length(self) -> float:
        """Tokens per verify round, 1 + accepted drafts per round: the definition the reference engine
        and vLLM use, from SGLang's counters."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else 1.0

    @property
    def tok_s(self) -> float:
        total = sum(self.seconds)
        return sum(len(t) for t in self.tokens) / total if total > 0 else 0.0


@dataclass
class SglangLaunch:
    """What one engine serves: a target alone, with an EAGLE-3 draft, or capturing aux hidden states."""

    target: Path
    draft: Path | None = None
    steps: int = 3
    topk: int = 1
    dtype: str = "float32"
    context_length: int = 1024
    max_total_tokens: int = 8192          # bounds the KV pool (SGLang sizes it from free memory otherwise)
    capture_ids: tuple[int, ...] | None = None   # capture-only mode: these ids, through the setter
    capture_rule: str | None = None       # a release whose own setter replaces the runtime's, e.g. '0.5.9'
    probe: bool = False                   # save what the draft's fc receives (measured slots)
    extra_args: tuple[str, ...] = ()
    guard: guard.Mode = guard.Mode.WARN   # the engine guard in this launch (docs/guard.md)
    enable_metrics: bool = False          # serve Prometheus text at /metrics (--enable-metrics)
    decode_log_interval: int | None = None   # a "Decode batch ... accept len" log line every N batches

    def __post_init__(self):
        self.target = Path(self.target).resolve()
        self.draft = Path(self.draft).resolve() if self.draft is not None else None
        if self.draft is not None and self.capture_ids is not None:
            raise InputError("capture-only mode runs the target without a draft (SGLang refuses both)")

    @property
    def label(self) -> str:
        if self.capture_ids is not None:
            return f"{self.target.name}, capturing ids {list(self.capture_ids)}"
        return self.target.name + (f" + {self.draft.name} (k={self.steps})" if self.draft else "")


def rules_label(version: str, capture_rule: str | None) -> str:
    """How a row says which runtime ran and whose id-to-layer rule it applied."""
    return f"runtime {version}" + (f", capture rule {capture_rule}" if capture_rule else "")


def setter_rule(release: str, arch: str) -> dict:
    """The named release's own ``set_eagle3_layers_to_capture`` for ``arch``, as text with its place,
    read from that release's wheel (``helpers.engines.sglang.source`` fetches and caches it)."""
    from .classes import class_for_arch, find_method
    from .resolve import source_for
    from .sites import SETTER

    src = source_for(release, None)
    top = class_for_arch(src, arch)
    found = find_method(src, top, SETTER)
    if found is None:
        raise InputError(f"sglang {release}'s {arch} has no {SETTER}; no capture rule to install")
    owner, fn = found
    lines = owner.path.read_text(encoding="utf-8").splitlines()
    text = "\n".join(lines[fn.lineno - 1: fn.end_lineno])
    return {"release": release, "arch": arch, "owner": owner.name, "file": src.rel(owner.path),
            "line": fn.lineno, "source": text}


def hook_env(install: SglangInstall, report_path: Path, *, accommodations: bool) -> dict[str, str]:
    """What puts the workbook inside SGLang's processes. The CPU accommodations (and with them the stand-in
    ``sgl_kernel``) only where they apply: a CPU host, ``accommodations`` True. Elsewhere the release's own
    plugin framework loads ``helpers.engines.sglang.plugin`` through the installed entry point and nothing
    goes on PYTHONPATH; a release without the framework gets the guard's own site folder
    (``helpers/engines/sglang/site``: no ``sgl_kernel`` in it)."""
    env = {hooks_mod.REPORT_ENV: str(report_path)}
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if accommodations:
        env[hooks_mod.HOOKS_ENV] = "cpu"
        env["PYTHONPATH"] = os.pathsep.join([str(cpu.SITE), str(ROOT)] + inherited)
    elif not install.plugins:
        env["PYTHONPATH"] = os.pathsep.join([str(GUARD_SITE), str(ROOT)] + inherited)
    return env


# How long a stopped engine's group gets after SIGTERM before SIGKILL. Nothing is in flight when the workbook
# closes an engine, and SGLang's own shutdown spends 5 s asleep either way (0.5.23: a graceful drain ends in
# kill_process_tree after it; a group SIGTERM reads as a crashed scheduler and sleeps "before crash
# diagnostics"), measured here at 5.5-6.0 s per stop; 1 s lets a quick exit happen and no more.
STOP_GRACE_S = 1.0


class SGLangEngine(Stoppable):
    """One running SGLang server. ``with SGLangEngine(install, spec) as e: e.generate(...)``."""

    def __init__(self, install: SglangInstall, spec: SglangLaunch, *, threads: int | None = 2,
                 start_timeout: float = 600.0, progress: bool = True, log_dir: Path | None = None):
        self.install, self.spec = install, spec
        self.device = install.device
        if self.device == "cpu" or spec.capture_rule:
            cpu.check_release(install.version)
        if not install.project:
            raise EngineStartError(f"{install.venv} lacks this project (the guard and the hooks import "
                                   f"helpers there); set it up again with bash workbook.sh sglang")
        self.threads = threads
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="eagle3-sglang-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        stem = f"sglang-{os.getpid()}-{id(self):x}"
        self.log_path = self.log_dir / f"{stem}.log"
        self.report_path = self.log_dir / f"{stem}.hooks.jsonl"
        self.probe_dir = self.log_dir / f"{stem}.fc" if spec.probe else None
        self.rule: dict | None = None
        self.target_spec = read_target(spec.target)      # one reader, one set of one-line errors
        self.launch_notes: list[dict] = []
        self.server: SGLangServer | None = None
        self.start_seconds = 0.0
        self.meta_log: list[dict] = []
        self.version = install.version
        self._start(start_timeout, progress)

    # -- launch ------------------------------------------------------------------------------

    def _args_and_env(self) -> tuple[list[str], dict[str, str]]:
        spec, notes = self.spec, self.launch_notes
        args = ["--dtype", spec.dtype, "--context-length", str(spec.context_length),
                "--max-total-tokens", str(spec.max_total_tokens), "--max-running-requests", "4",
                "--disable-radix-cache", "--skip-server-warmup", "--random-seed", "0", "--log-level", "info"]
        env = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "SGLANG_DISABLE_REQUEST_LOGGING": "1"}
        accommodations = False
        rule_file = None
        if self.device != "cpu":     # two servers share the GPU in a paired benchmark (settings.GPU_SHARE)
            args += ["--mem-fraction-static", str(GPU_SHARE)]
        if self.device == "cpu":
            threads = self.threads or 2
            args += ["--device", "cpu", "--attention-backend", "intel_amx"]
            env.update(SGLANG_USE_CPU_ENGINE="1", OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
            notes.extend(cpu.launch_accommodations(threads))
            accommodations = True
            archs = set(self.target_spec.architectures)
            if spec.draft is not None:
                archs |= set(read_draft_config(spec.draft).get("architectures") or [])
            skipped, kept = cpu.unneeded_model_modules(self.install.venv, archs)
            if skipped:
                env["SGLANG_DISABLED_MODEL_ARCHS"] = ",".join(skipped)
                notes.append(cpu.registry_note(skipped, kept))
            # both sides of a comparison alike: SGLang itself turns the overlap schedule off for speculative
            # decoding on a CPU (srt/arg_groups/speculative_hook.py:66-75 in 0.5.23, "Overlap schedule is not
            # implemented for speculative decoding on CPU"), so the baseline is launched without it too
            args.append("--disable-overlap-schedule")
            notes.append({"name": "no-overlap-schedule",
                          "what": "--disable-overlap-schedule (every CPU launch, with or without a draft)",
                          "why": "SGLang runs speculative decoding on a CPU without "
                          "the overlap schedule (speculative_hook.py:66-75), so the baseline it is compared "
                          "with runs without it as well: one scheduler on both sides of the ratio (without a "
                          "draft, the overlap thread also starved the forward on 2 cores: 1.4 tok/s against "
                          "45.5, tiny pair, 2026-12-01)"})
        elif self.threads:
            env["OMP_NUM_THREADS"] = str(self.threads)
        deepseek = any("Deepseek" in a for a in self.target_spec.architectures)
        if deepseek and "moe_layer_freq" not in self.target_spec.config:
            override = json.dumps({"moe_layer_freq": 1})
            args += ["--json-model-override-args", override]
            notes.append({"name": "moe_layer_freq", "what": f"--json-model-override-args '{override}'",
                          "why": "the target's config lacks the key srt/models/deepseek_v2.py:2791 reads "
                                 "(real DeepSeek-V3 configs carry it); 1 = every layer past the dense "
                                 "ones is MoE, as HF builds it"})
        if spec.capture_rule:
            self.rule = setter_rule(spec.capture_rule, self.target_spec.arch or "")
            rule_file = self.log_dir / f"{self.log_path.stem}.rule.json"
            rule_file.write_text(json.dumps(self.rule), encoding="utf-8")
        if spec.capture_ids is not None:
            args += ["--enable-return-aux-hidden-states", "--speculative-algorithm", "EAGLE3",
                     "--return-aux-hidden-state-layer-ids", *map(str, spec.capture_ids)]
        if self.probe_dir is not None:
            self.probe_dir.mkdir(parents=True, exist_ok=True)
        if spec.enable_metrics:
            args.append("--enable-metrics")
        if spec.decode_log_interval is not None:
            args += ["--decode-log-interval", str(int(spec.decode_log_interval))]
        env[guard.GUARD_ENV] = str(spec.guard)
        env.update(hook_env(self.install, self.report_path, accommodations=accommodations))
        if spec.capture_rule:
            env[hooks_mod.RULE_ENV] = str(rule_file)
        if self.probe_dir is not None:
            env[hooks_mod.PROBE_ENV] = str(self.probe_dir)
        return args + list(spec.extra_args), env

    def _start(self, start_timeout: float, progress: bool) -> None:
        args, env = self._args_and_env()
        spec = self.spec
        sspec = ServerSpec(target=str(spec.target), draft=str(spec.draft) if spec.draft else None,
                           port=find_free_port(), python=str(self.install.python), steps=spec.steps,
                           topk=spec.topk, extra_args=tuple(args), env=env)
        self.server = SGLangServer(sspec, speculative=spec.draft is not None, log_path=self.log_path,
                                   startup_timeout=start_timeout, grace_s=STOP_GRACE_S)
        self._settings = argv_settings(build_launch_command(sspec, spec.draft is not None),
                                       {k: env[k] for k in THREAD_ENV if k in env})
        track(self)
        started = time.perf_counter()
        bar = tqdm(total=None, desc=f"starting SGLang {self.version} ({spec.label})", disable=not progress,
                   bar_format="{desc}: {elapsed}", mininterval=5.0)
        done = threading.Event()

        def tick():
            while not done.wait(5.0):
                bar.update(0)

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            self.server.start()
        except ServerStartError as exc:
            self.close()
            raise EngineStartError(self._why(str(exc))) from None
        except BaseException:
            self.close()
            raise
        finally:
            done.set()
            bar.close()
        self.start_seconds = round(time.perf_counter() - started, 2)
        try:        # what the server resolved, beside what it was asked for (settings.SGLANG_RESOLVED)
            self._settings |= resolved_settings(read_server_info(self.base_url).raw, SGLANG_RESOLVED)
        except Exception:       # noqa: BLE001 - a server that cannot say leaves the requested settings
            pass
        unjudged = guard.unjudged_launch(spec.guard, self.guard_verdict(), engine=f"SGLang {self.version}",
                                         log=self.log_path) if spec.draft is not None else None
        if unjudged:                     # before a single request: no token is served unjudged
            self.close()
            raise EngineStartError(f"SGLang {self.version} refused {spec.label}: {unjudged}")

    def _why(self, message: str) -> str:
        lines = [ln for ln in message.splitlines() if ln.strip()]
        refused = guard.refusal(self.guard_verdict())
        if refused:                      # the engine guard refused: the line its report holds is the reason
            return f"SGLang {self.version} refused {self.spec.label}: {refused} (log: {self.log_path})"
        errors = [ln.strip() for ln in lines if "Error" in ln or "error" in ln or "eagle3-workbook" in ln]
        tail = (errors or lines or [""])[-1][:300]
        return f"SGLang {self.version} would not start {self.spec.label}: {tail} (log: {self.log_path})"

    def close(self) -> None:
        """Stop the server's whole process group; safe to call twice."""
        self.resume()                    # a paused group cannot act on the stop signal
        server, self.server = self.server, None
        if server is not None:
            server.stop()
        untrack(self)

    @property
    def pid(self) -> int | None:
        return self.server.proc.pid if self.server and self.server.proc else None

    @property
    def base_url(self) -> str:
        if self.server is None:
            raise EngineStartError(f"SGLang is not running (log: {self.log_path})")
        return self.server.base_url

    # -- requests ----------------------------------------------------------------------------

    def _post(self, payload: dict, timeout: float = 600.0) -> dict:
        if self.server is None or self.server.proc is None or self.server.proc.poll() is not None:
            raise EngineStartError(f"SGLang is not running (log: {self.log_path})")
        try:
            body = http_json(self.base_url + "/generate", payload, timeout=timeout)
        except (RuntimeError, OSError) as exc:
            raise EngineStartError(f"SGLang failed a request: {str(exc)[:300]} "
                                   f"(log: {self.log_path})") from None
        return body[0] if isinstance(body, list) else body

    def generate(self, prompts: list[list[int]], max_tokens: int) -> Generation:
        """Greedy, one prompt at a time (the latency speculative decoding is for), timed per prompt,
        exactly ``max_tokens`` new tokens each (EOS ignored, as the reference engine does)."""
        params = {"max_new_tokens": int(max_tokens), "temperature": 0.0, "ignore_eos": True}
        gen = Generation([], [])
        hist: list[int] = []
        for ids in prompts:
            t0 = time.perf_counter()
            body = self._post({"input_ids": [int(i) for i in ids], "sampling_params": params})
            gen.seconds.append(time.perf_counter() - t0)
            meta = body.get("meta_info", {})
            gen.tokens.append([int(t) for t in body.get("output_ids", [])])
            gen.meta.append(meta)
            self.meta_log.append(meta)
            gen.completion_tokens += int(meta.get("completion_tokens", len(gen.tokens[-1])))
            gen.drafts += int(meta.get("spec_verify_ct") or 0)
            gen.accepted_tokens += int(meta.get("spec_num_correct_drafts") or 0)
            gen.draft_tokens += int(meta.get("spec_num_proposed_drafts") or 0)
            h = [int(x) for x in meta.get("spec_correct_drafts_histogram") or []]
            hist += [0] * max(len(h) - len(hist), 0)
            for j, count in enumerate(h):
                hist[j] += count
        # rounds with j correct drafts -> how many rounds accepted the draft at position p (p < j). SGLang's
        # histogram ends at the longest run it saw, so positions past it are 0, stated for every draft step
        positions = max(len(hist) - 1, self.spec.steps if self.spec.draft is not None else 0)
        gen.accepted_per_position = [sum(hist[p + 1:]) for p in range(positions)]
        return gen

    def hidden_states(self, prompts: list[list[int]]) -> list:
        """Capture-only mode: per prompt, the aux hidden states SGLang concatenates for an EAGLE-3 draft,
        as a float tensor [tokens, slots * hidden] (prompt positions)."""
        import torch

        if self.spec.capture_ids is None:
            raise InputError("hidden_states needs an engine started with capture_ids (capture-only mode)")
        out = []
        for ids in prompts:
            body = self._post({"input_ids": [int(i) for i in ids], "return_hidden_states": True,
                               "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}})
            states = body.get("meta_info", {}).get("hidden_states")
            if not states:
                raise EngineStartError(f"SGLang returned no hidden states (log: {self.log_path})")
            nested = isinstance(states[0], list) and states[0] and isinstance(states[0][0], list)
            out.append(torch.tensor(states[0] if nested else states, dtype=torch.float32))
        return out

    def fc_inputs(self) -> dict[int, "object"]:
        """What the draft's fc received, by row count (``probe=True``): the live engine's fused features."""
        import torch

        if self.probe_dir is None:
            return {}
        return {int(p.stem.split("-")[1]): torch.load(p) for p in sorted(self.probe_dir.glob("fc-*.pt"))}

    def pause(self) -> None:
        """Stop the server's processes (SIGSTOP to its group) while another engine works: an idle SGLang
        scheduler polls and keeps a whole core busy (measured: 1.0 CPU-second per second idle on this
        host), which on 2 cores halves the engine being timed. ``resume`` continues it."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: int) -> None:
        pid = self.pid
        if pid is None:
            return
        try:
            os.killpg(pid, sig)          # the server leads a session of its own: its pid is the group id
        except (ProcessLookupError, PermissionError):
            pass

    def settings(self) -> dict[str, str]:
        """Every engine setting of this launch, flag by flag (and the thread variables): what a speed
        ratio's two sides are held to share, except speculation (``live.bench.side_by_side``)."""
        return dict(self._settings)

    def fixes_report(self) -> list[dict]:
        """The accommodations in the shape ``helpers.live.bench`` reports vLLM's plugin fixes: fix, state,
        why."""
        return [{"fix": a["name"], "state": "applied", "why": a.get("why", "")}
                for a in self.accommodations()]

    def metrics_text(self) -> str:
        """Every request's ``meta_info`` so far, as the JSON list ``diagnose --metrics`` reads (SGLang's
        Prometheus scrape has no per-position counts; its responses do)."""
        return json.dumps(self.meta_log)

    def server_info(self) -> dict:
        info = read_server_info(self.base_url)
        return {"version": info.version, "avg_spec_accept_length": info.avg_spec_accept_length}

    # -- the record --------------------------------------------------------------------------

    def _hook_rows(self) -> list[dict]:
        if not self.report_path.is_file():
            return []
        return [json.loads(ln) for ln in self.report_path.read_text(encoding="utf-8").splitlines()
                if ln.strip()]

    def accommodations(self) -> list[dict]:
        """Every accommodation this launch carried: the engine's own, then what the hooks did inside
        SGLang's processes (once each, however many processes applied it)."""
        seen = {a["name"]: a for a in self.launch_notes}
        for row in self._hook_rows():
            if row.get("event") not in ("capture", "guard") and row["name"] not in seen:
                seen[row["name"]] = {k: row[k] for k in ("name", "what", "why", "where") if row.get(k)}
        return list(seen.values())

    def captures(self) -> list[dict]:
        """Each call of the target's setter: the ids it got and the ``layers_to_capture`` it left."""
        return [{k: r[k] for k in ("ids", "layers_to_capture")} for r in self._hook_rows()
                if r.get("event") == "capture"]

    def guard_verdict(self) -> dict | None:
        """What the engine guard judged inside SGLang at load (``helpers.live.guard``), or None (off, or no
        draft)."""
        rows = [r["verdict"] for r in self._hook_rows() if r.get("event") == "guard"]
        return rows[-1] if rows else None

    @property
    def rules(self) -> str:
        return rules_label(self.version, self.spec.capture_rule)

    def record(self) -> dict:
        return {"engine": "sglang", "version": self.version, "device": self.device, "rules": self.rules,
                "capture_rule": self.rule and {k: self.rule[k] for k in ("release", "file", "line")},
                "start_seconds": self.start_seconds, "accommodations": self.accommodations(),
                "captures": self.captures(), "log": str(self.log_path)}


def probe_each(install: SglangInstall, launches: list[SglangLaunch], prompt: list[int], new_tokens: int, *,
               log_dir: Path | None = None) -> list[tuple[object | None, dict]]:
    """One probe engine per launch, all started at once (nothing here is timed, and each launch bounds its
    memory), each asked the same ``prompt``: per launch, the fc inputs it recorded for that prompt (None
    where it recorded none) and its record. Every engine is stopped however this returns."""
    def one(spec: SglangLaunch):
        with SGLangEngine(install, spec, log_dir=log_dir) as e:
            e.generate([prompt], new_tokens)
            return e.fc_inputs().get(len(prompt)), e.record()

    with ThreadPoolExecutor(max(1, len(launches))) as pool:
        return list(pool.map(one, launches))
