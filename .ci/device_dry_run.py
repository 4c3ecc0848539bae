"""``bash .ci/device-check.sh --dry-run``: what the GPU rehearsal would run, checked on a host without a GPU.

Three checks, each line prefixed ``[dry-run]``, exit 1 when any fails:
  parse   every ``python -m helpers <command> ...`` the script would run goes through that command's own
          argument parser (the command's ``main`` is entered and stopped as its parser returns: nothing runs);
  paths   every path the script names exists (the pair's folders, requirements files, the options' paths);
  sglang  the environment a CUDA SGLang launch would get, from the workbook's own launcher
          (``helpers.engines.sglang.engine.SGLangEngine._args_and_env`` on an install whose torch is a CUDA
          build, started with its ``_start`` stubbed out), holds no CPU stand-in: the CPU site folder
          (``helpers/engines/sglang/cpu/site``, with the stand-in ``sgl_kernel``) is not on PYTHONPATH, no
          entry there holds an ``sgl_kernel``, EAGLE3_WORKBOOK_SGLANG_HOOKS is not ``cpu``, no CPU engine
          flag.
  memory  every CUDA launch of a paired benchmark (vLLM's ``gpu_memory_utilization``, SGLang's
          ``--mem-fraction-static``) holds an explicit budget, and baseline plus speculative fit one GPU;
Then notes (never failures) on what the device needs that this host cannot check: registry, source cache.

    python .ci/device_dry_run.py COMMANDS_FILE [--path P ...]
COMMANDS_FILE: one run a line, ``NAME<TAB>ARGV`` with ARGV shell-quoted (the script writes it).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import io
import os
import shlex
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))        # the checkout's helpers: what the device runs (installed editable there)

HOOKS_ENV = "EAGLE3_WORKBOOK_SGLANG_HOOKS"
PATH_OPTIONS = ("target", "draft", "prompts", "target_config", "measured", "sglang_root")


def say(kind: str, text: str) -> None:
    print(f"[dry-run] {kind:<6} {text}", flush=True)


class Parsed(Exception):
    def __init__(self, namespace, extras):
        super().__init__("parsed")
        self.namespace, self.extras = namespace, extras


def parse_only(command: str, argv: list[str]):
    """(namespace, None) when ``python -m helpers command argv`` parses, else (None, argparse's own words).
    The command's ``main`` runs up to its parser: ``parse_known_args`` (which ``parse_args`` and
    subparsers go through) raises once the outermost parse returns, before any work."""
    from helpers.__main__ import COMMANDS

    if command not in COMMANDS:
        return None, f"unknown command {command!r} (python -m helpers knows {', '.join(COMMANDS)})"
    module = importlib.import_module(COMMANDS[command][0])
    original = argparse.ArgumentParser.parse_known_args
    depth = 0

    def stop(self, args=None, namespace=None):
        nonlocal depth
        depth += 1
        try:
            namespace, extras = original(self, args, namespace)
        finally:
            depth -= 1
        if depth == 0:
            raise Parsed(namespace, extras)
        return namespace, extras

    err = io.StringIO()
    argparse.ArgumentParser.parse_known_args = stop
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            module.main(list(argv))
    except Parsed as p:
        if p.extras:
            return None, f"unrecognized arguments: {' '.join(p.extras)}"
        return p.namespace, None
    except SystemExit as exc:
        lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
        return None, (lines[-1] if lines else f"exit {exc.code}")
    except Exception as exc:  # noqa: BLE001 - anything before the parser is a failure to report
        return None, f"{type(exc).__name__}: {exc}"
    finally:
        argparse.ArgumentParser.parse_known_args = original
    return None, "main returned without parsing its options (it would have run)"


def sglang_pin() -> str:
    for line in (ROOT / "requirements-sglang-cuda.txt").read_text().splitlines():
        if line.strip().startswith("sglang=="):
            return line.split("==", 1)[1].split()[0]
    raise SystemExit("[dry-run] FAIL   requirements-sglang-cuda.txt pins no sglang==VERSION")


def cuda_launch_env(ns, plugins: bool) -> tuple[list[str], dict[str, str], str]:
    """(args, env, capture rule) the workbook's launcher gives a CUDA SGLang for this bench's options."""
    from helpers import cli
    from helpers.engines.sglang import engine as se
    from helpers.engines.sglang.bench import capture_rule_for
    from helpers.engines.sglang.install import SglangInstall
    from helpers.live import guard

    values = {"venv": ROOT / ".venv-sglang", "python": ROOT / ".venv-sglang" / "bin" / "python",
              "version": sglang_pin(), "torch": "cuda build (requirements-sglang-cuda.txt)", "project": True,
              "plugins": plugins}
    names = {f.name for f in dataclasses.fields(SglangInstall)}
    install = SglangInstall(**{k: v for k, v in values.items() if k in names})
    assert install.device == "cuda", install
    named = cli.engine_value(ns.engine).version if getattr(ns, "engine", None) else None
    rule = capture_rule_for(install, named)
    mode = guard.Mode(str(ns.guard)) if getattr(ns, "guard", None) else guard.Mode.WARN
    spec = se.SglangLaunch(Path(ns.target), Path(ns.draft), steps=ns.steps, capture_rule=rule, guard=mode)
    started = se.SGLangEngine._start
    se.SGLangEngine._start = lambda self, *a, **k: None          # build the launch, start nothing
    try:
        with tempfile.TemporaryDirectory(prefix="dry-run-sglang-") as logs:
            eng = se.SGLangEngine(install, spec, progress=False, log_dir=Path(logs))
            args, env = eng._args_and_env()
    finally:
        se.SGLangEngine._start = started
    return args, env, rule or "none"


def vllm_budgets(ns) -> tuple[float | None, float | None]:
    """(baseline, speculative) ``gpu_memory_utilization`` the workbook's launcher gives vLLM on CUDA for this
    bench's options (``LaunchSpec.llm_kwargs``: what the worker's ``LLM(...)`` receives)."""
    from helpers.engines.vllm.engine import LaunchSpec

    base = LaunchSpec(Path(ns.target), None, device="cuda").llm_kwargs()
    spec = LaunchSpec(Path(ns.target), Path(ns.draft), steps=ns.steps, device="cuda").llm_kwargs()
    return base.get("gpu_memory_utilization"), spec.get("gpu_memory_utilization")


def budget_line(name: str, engine: str, base, spec, key: str) -> tuple[bool, str]:
    """Both sides of a paired CUDA benchmark hold an explicit memory budget, and together they fit one GPU
    (the baseline stays up while the speculative engine starts)."""
    if base is None or spec is None:
        return False, (f"FAIL {name} on CUDA: {engine} launched without {key} (baseline {base}, "
                       f"speculative {spec})")
    total = float(base) + float(spec)
    ok = total <= 0.9
    return ok, (f"{'ok  ' if ok else 'FAIL'} {name} on CUDA: {key} {base} (baseline) + {spec} (speculative) "
                f"= {total:.2f} of one GPU, both up at once")


def stand_ins(args: list[str], env: dict[str, str]) -> list[str]:
    from helpers.engines.sglang import cpu

    found = []
    entries = [Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if any(p.resolve() == cpu.SITE.resolve() for p in entries):
        found.append(f"the CPU site folder {cpu.SITE.relative_to(ROOT)} is on PYTHONPATH")
    found += [f"{p} on PYTHONPATH holds an sgl_kernel" for p in entries if (p / "sgl_kernel").exists()]
    if env.get(HOOKS_ENV) == "cpu":
        found.append(f"{HOOKS_ENV}=cpu")
    if "SGLANG_USE_CPU_ENGINE" in env or ("--device" in args and args[args.index("--device") + 1] == "cpu"):
        found.append("a CPU engine flag (SGLANG_USE_CPU_ENGINE / --device cpu)")
    return found


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="device_dry_run.py")
    ap.add_argument("commands", type=Path)
    ap.add_argument("--path", action="append", default=[], help="a path the script names")
    a = ap.parse_args(argv)
    # a launch inherits these; the device has neither
    for var in ("PYTHONPATH", "EAGLE3_WORKBOOK_SGLANG_DEVICE"):
        os.environ.pop(var, None)
    failed = 0
    for p in a.path:
        ok = (ROOT / p).exists()
        failed += not ok
        say("paths", f"{'ok  ' if ok else 'MISSING'} {p}")
    runs = [ln.split("\t", 1) for ln in a.commands.read_text().splitlines() if ln.strip()]
    sglang_runs = []
    for name, line in runs:
        argv_ = shlex.split(line)
        if argv_[1:3] != ["-m", "helpers"] or len(argv_) < 4:
            failed += 1
            say("parse", f"FAIL {name}: not a python -m helpers command: {line}")
            continue
        py = argv_[0]
        if not (ROOT / py).exists():
            say("paths", f"note {py} (made by the script's setup step; absent here)")
        ns, why = parse_only(argv_[3], argv_[4:])
        if ns is None:
            failed += 1
            say("parse", f"FAIL {name}: {shlex.join(argv_[3:])}: {why}")
            continue
        say("parse", f"ok   {name}: {shlex.join(argv_[3:])}")
        for opt in PATH_OPTIONS:
            value = getattr(ns, opt, None)
            if value is not None and not (ROOT / str(value)).exists():
                failed += 1
                say("paths", f"MISSING {name}: --{opt.replace('_', '-')} {value}")
        if getattr(ns, "backend", None) == "sglang":
            sglang_runs.append((name, ns))
        if getattr(ns, "backend", None) == "vllm":
            ok, line = budget_line(name, "vLLM", *vllm_budgets(ns), "gpu_memory_utilization")
            failed += not ok
            say("memory", line)
    for name, ns in sglang_runs:
        for plugins in (True, False):
            how = "a release with the plugin framework" if plugins else "a release without it"
            try:
                args, env, rule = cuda_launch_env(ns, plugins)
            except Exception as exc:  # noqa: BLE001 - the launcher's own refusal is the finding
                failed += 1
                say("sglang", f"FAIL {name} ({how}): the launcher raised {type(exc).__name__}: {exc}")
                continue
            bad = stand_ins(args, env)
            path = [str(Path(p).relative_to(ROOT)) if Path(p).is_relative_to(ROOT) else p
                    for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
            what = (f"capture rule {rule}, guard {env.get('EAGLE3_WORKBOOK_GUARD')}, "
                    f"{HOOKS_ENV}={env.get(HOOKS_ENV, '(unset)')}, PYTHONPATH={path or '(unset)'}")
            failed += bool(bad)
            say("sglang", f"{'FAIL' if bad else 'ok  '} {name} on CUDA ({how}): {what}"
                + (f": CPU stand-in: {'; '.join(bad)}" if bad else ": no CPU stand-in"))
            if plugins:       # the same launcher builds the baseline (no draft): one budget, both sides
                flag = "--mem-fraction-static"
                share = args[args.index(flag) + 1] if flag in args else None
                ok, line = budget_line(name, "SGLang", share, share, flag)
                failed += not ok
                say("memory", line)
    if not os.environ.get("WHEELHOUSE"):
        say("note", "the device reaches no registry: without WHEELHOUSE the engine venvs are not made there "
                    "and their runs are skipped (docs/install.md)")
    say("done", f"{len(runs)} runs, {failed} failure(s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
