"""Which engine measures, and whose rules say what it serves: the reference engine, vLLM, SGLang or llama.cpp.

A notebook or command names a backend (``BACKEND``, ``--backend``: which runtime runs) and a release whose
rules decide "served" (``ENGINE_VERSION``, ``--engine``). ``choose`` turns the two into one ``Backend``:
the live install when the host has it (else the reason it does not, and the reference engine measures),
and the rules the rows are held to:

- vLLM: its installed release's own rules (the release that runs is the release that is predicted);
- SGLang: the named release's rules, and with none named the installed release's own. When the named
  release is not the runtime (the original case's ``sglang==0.5.9`` on a 0.5.23 runtime), the runtime
  runs the named release's own ``set_eagle3_layers_to_capture`` (``capture_rule``), and every row says
  "runtime 0.5.23, capture rule 0.5.9": the setter half of the original case on a real engine. 0.5.9's
  ``None``-residual capture code has no counterpart in 0.5.23, so that half stays shown from the source
  (notebook 05). Only the embedded pair replays that case by default (``conventions.CASE_ENGINE``), and
  says so (``case_replay_line``, ``Backend.label``).
- llama.cpp: the build the workbook built (``bash workbook.sh llamacpp``) and its own rules; what a draft
  serves is read from the GGUF its converter wrote.

``Backend.bench`` runs ``helpers.live.bench.live_bench`` on whichever engine it is.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..engines.llamacpp import bench as llamacpp_bench
from ..engines.llamacpp.build import BUILD as LLAMACPP_BUILD
from ..engines.llamacpp.build import SKIP_ENV as LLAMACPP_SKIP
from ..engines.llamacpp.build import ServerBuild, find_server
from ..engines.sglang import bench as sglang_bench
from ..engines.sglang.install import EngineUnavailable as SglangUnavailable
from ..engines.sglang.install import SglangInstall, find_sglang
from ..engines.vllm import bench as vllm_bench
from ..engines.vllm.install import EngineUnavailable as VllmUnavailable
from ..engines.vllm.install import VllmInstall, find_vllm
from ..rules.conventions import CASE_ENGINE, DEFAULT_ENGINE, Engine, expect_engine
from .bench import LiveRow, LiveWiring
from .guard import Mode

FAMILIES = ("reference", "vllm", "sglang", "llamacpp")


@dataclass
class Backend:
    """What a notebook runs on: a live engine (``install``), or why not (``unavailable``)."""

    family: str                                  # reference | vllm | sglang | llamacpp: what measures
    engine: Engine                               # whose rules decide what 'served' means
    install: VllmInstall | SglangInstall | ServerBuild | None = None
    unavailable: str | None = None               # why the named live engine cannot run here
    capture_rule: str | None = None              # SGLang: the release whose setter the runtime runs

    @property
    def live(self) -> bool:
        return self.install is not None

    def own_wirings(self, pair, rules: Engine, training_layout, retrained, out_dir):
        """The investigation's wirings as this runtime must be given them, or None where the drafts notebook
        05 wrote serve as they are: vLLM reads a draft's ids elsewhere and fixes boundary 0 by the workbook's
        plugin, so its wirings are written for it (``engines.vllm.wirings``: name -> (draft folder, plan))."""
        if not isinstance(self.install, VllmInstall):
            return None
        from ..engines.vllm.wirings import vllm_wirings

        return vllm_wirings(pair, rules, self.install, training_layout, retrained, out_dir)

    @property
    def label(self) -> str:
        """Which runtime and which rules, in one phrase for every table and headline."""
        if self.install is None:
            return "the reference engine (this workbook's)"
        if isinstance(self.install, ServerBuild):
            return f"llama.cpp {self.install.build} (llama-server, cpu)"
        if isinstance(self.install, SglangInstall):
            where = f"({self.install.device}, {self.install.venv.name})"
            if self.capture_rule and str(self.engine) == str(CASE_ENGINE):
                return f"{_replay(self.engine, self.install.version)} {where}"
            rule = f", capture rule {self.capture_rule}" if self.capture_rule else ""
            return f"SGLang runtime {self.install.version}{rule} {where}"
        return f"vLLM {self.install.version} ({self.install.device}, {self.install.venv.name})"

    def bench(self, target: Path, wirings: list[LiveWiring], prompt_ids: list[list[int]], *, steps: int,
              max_new_tokens: int, repeats: int, log_dir: Path | None = None,
              progress: bool = True, guard: Mode = Mode.WARN, outtype: str = "f32") -> list[LiveRow]:
        """Each wiring against one baseline engine on this backend (``helpers.live.bench``); ``guard``: the
        engine guard's mode in every launch (``helpers.live.guard``); ``outtype``: llama.cpp's target GGUF
        weight type (the Python engines run the checkpoint's own)."""
        if isinstance(self.install, VllmInstall):
            return vllm_bench.live_bench(self.install, target, wirings, prompt_ids, steps=steps,
                                         max_new_tokens=max_new_tokens, repeats=repeats, rules=self.engine,
                                         progress=progress, log_dir=log_dir, guard=guard)
        if isinstance(self.install, SglangInstall):
            return sglang_bench.live_bench(self.install, target, wirings, prompt_ids, steps=steps,
                                           max_new_tokens=max_new_tokens, repeats=repeats,
                                           capture_rule=self.capture_rule, progress=progress, log_dir=log_dir,
                                           guard=guard)
        if isinstance(self.install, ServerBuild):
            return llamacpp_bench.live_bench(self.install, target, wirings, prompt_ids, steps=steps,
                                             max_new_tokens=max_new_tokens, repeats=repeats,
                                             rules=self.engine, progress=progress, log_dir=log_dir,
                                             guard=guard, outtype=outtype)
        raise ValueError(f"no live engine to benchmark on ({self.unavailable or self.family})")

    def refuses(self, named: Engine | None) -> str | None:
        """Why this live runtime cannot run under the rules ``named`` (``--engine``), or None: vLLM runs
        only its own release's rules, SGLang any SGLang release's (its setter installed live)."""
        if named is None or not self.live:
            return None
        if named.rules is not self.engine.rules:
            return (f"--engine {named} names another engine's rules, but --backend {self.family} runs "
                    f"{self.engine}; drop --engine (the runtime's own release), or pass the --backend that "
                    f"engine runs on")
        if named.version and named.version != self.engine.version and isinstance(self.install, ServerBuild):
            return (f"--engine {named}: the llama-server here is {self.install.build} and runs its own "
                    f"build's converter and graph; drop --engine, or name llamacpp=={self.install.build}")
        if named.version and named.version != self.engine.version:
            return (f"--engine {named}: the vLLM here is {self.install.version} and runs its own release's "
                    f"rules; drop --engine, or name vllm=={self.install.version}")
        return None


def _replay(rules: Engine, runtime: str | None) -> str:
    where = f", runtime {runtime}" if runtime else ", measured by the reference engine"
    return f"case replay: capture rule {rules.name} {rules.version}{where}"


def choose(family: str, rules: Engine | None = None) -> Backend:
    """``family`` (reference, vllm, sglang) and the named rules -> the Backend this host can run.
    ``rules`` None: a live engine's own installed release (``conventions.DEFAULT_ENGINE`` where none
    runs). A host without the engine keeps the named rules and says why in one line. The notebooks
    name ``family`` as the word ``BACKEND``; ``rules`` comes parsed from their setup (``nb.rules``)."""
    named = expect_engine(rules) if rules is not None else DEFAULT_ENGINE
    if family == "vllm":
        try:
            install = find_vllm()
        except VllmUnavailable as exc:
            return Backend("reference", named, None, str(exc))
        return Backend("vllm", install.engine, install)
    if family == "sglang":
        try:
            install = find_sglang()
        except SglangUnavailable as exc:
            return Backend("reference", named, None, str(exc))
        # the named release's rules when they are SGLang's (its setter runs live), else the runtime's own
        named = named if rules is not None else install.engine
        rules_engine = named if named.rules is install.engine.rules and named.version else install.engine
        return Backend("sglang", rules_engine, install,
                       capture_rule=sglang_bench.capture_rule_for(install, rules_engine.version))
    if family == "llamacpp":
        server = find_server()
        if server is None:
            return Backend("reference", named, None, _llamacpp_missing())
        return Backend("llamacpp", server.engine, server)
    if family != "reference":
        raise ValueError(f"unknown engine {family!r}; expected one of {', '.join(FAMILIES)}")
    return Backend("reference", named)


def _llamacpp_missing() -> str:
    if os.environ.get(LLAMACPP_SKIP, "1") == "0":
        return f"{LLAMACPP_SKIP}=0: llama.cpp is skipped on this host"
    return (f"llama.cpp {LLAMACPP_BUILD} is not built on this host; build it once with: bash workbook.sh "
            f"llamacpp (about 9 minutes on 2 cores)")


def installed(family: str) -> Engine | None:
    """The release of ``family`` (vllm, sglang, llamacpp) this host runs, as the rules it serves by, or
    None."""
    if family == "llamacpp":
        server = find_server()
        return None if server is None else server.engine
    find = {"vllm": find_vllm, "sglang": find_sglang}.get(family)
    try:
        return find().engine if find else None
    except (VllmUnavailable, SglangUnavailable):
        return None


def case_replay_line(family: str) -> str:
    """The line a run of the embedded pair under the original case's rules (``CASE_ENGINE``) opens with:
    which capture rule, inside which runtime (``family``: the backend that measures)."""
    case, runtime = CASE_ENGINE, installed(family)
    why = "the embedded pair's original case"
    if runtime is None:
        return f"[engine] {_replay(case, None)} ({why})"
    if runtime.rules is case.rules:
        return f"[engine] {_replay(case, runtime.version)} ({why})"
    return (f"[engine] case replay: rules {case} in the static notebooks ({why}); {runtime.rules.title} "
            f"{runtime.version} measures under its own release's rules")


def auto() -> tuple[str, str]:
    """``--engine auto``: the live engine this host has, SGLang first (the original case's engine), then
    vLLM, else the reference engine; with the one line that says which and why."""
    try:
        s = find_sglang()
        return "sglang", (f"[engine] SGLang {s.version} ({s.device}, {s.venv}) serves the pair, the original "
                          f"case's engine; the reference engine runs beside it")
    except SglangUnavailable as exc:
        why = str(exc)
    try:
        v = find_vllm()
        return "vllm", (f"[engine] vLLM {v.version} ({v.dist}, {v.venv}) serves the pair ({why}); the "
                        f"reference engine runs beside it")
    except VllmUnavailable as exc:
        return "reference", f"[engine] reference engine: {exc}"
