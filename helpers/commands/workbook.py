"""``python -m helpers run-workbook``, the main job: parse its options, check the notebooks' parameters and
call the notebook runner (``notebook.runner``), which executes notebooks 01-06 and renders ``reports/``.

``--backend`` is the runtime that measures (the notebooks' ``BACKEND``), ``--engine NAME[==VERSION]``
whose rules decide what "served" means (their ``ENGINE_VERSION``). Left out, ``--engine`` is the case
replay on the embedded pair (``conventions.CASE_ENGINE``), the installed release of a live backend on
a user's pair, else ``conventions.DEFAULT_ENGINE``; one line says which.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .. import cli
from ..errors import BadOption, InputError, fail
from ..investigation.pair import BACKENDS, DEFAULT_DIR
from ..live.backends import auto as auto_backend
from ..live.backends import case_replay_line, installed
from ..notebook.durations import start_line
from ..notebook.lab import SMALL
from ..notebook.parameters import rename_parameter
from ..notebook.reports import TIMED
from ..notebook.runner import (
    OUT_IS_A_FILE,
    PATH_PARAMS,
    REPO,
    check_run_inputs,
    normalise_notebook_name,
    run_kind,
    run_workbook,
)
from ..rules.conventions import (
    CASE_ENGINE,
    DEFAULT_ENGINE,
    assumed_engine_line,
)


def _backend(choice: str) -> str:
    """``--backend auto``: the real engine where this host has it, SGLang first (``backends.auto``); the
    line says which ran and why."""
    if choice != "auto":
        return choice
    family, line = auto_backend()
    print(line)
    return family


RUNTIMES = ("auto", *BACKENDS)      # --backend's words


def old_spellings(backend: str | None, engine: str | None, engine_version: str | None,
                  say=lambda line: print(line, file=sys.stderr)) -> tuple[str | None, str | None]:
    """(--backend, --engine) from the spellings of the release before: ``--engine auto|reference|vllm|
    sglang`` named the runtime and ``--engine-version`` the rules. Each still works for this release,
    with one line saying the new spelling; README.md and scripts built on it used them."""
    if engine_version is not None:
        say(f"note: --engine-version is deprecated; spell it --engine {engine_version} (whose rules)")
        if engine in RUNTIMES and backend is None:
            say(f"note: --engine {engine} beside --engine-version names the runtime; "
                f"spell it --backend {engine}")
            return engine, engine_version
        if engine is not None:
            raise BadOption(f"--engine {engine} and --engine-version {engine_version} both name the rules "
                            f"(or --backend is given too); pass --backend and --engine NAME==VERSION")
        return backend, engine_version
    if engine in RUNTIMES and backend is None:
        say(f"note: --engine {engine} names the runtime, the old spelling; spell it --backend {engine} "
            f"(--engine now names whose rules, e.g. {DEFAULT_ENGINE})")
        return engine, None
    return backend, engine


def embedded_pair(params: dict) -> bool:
    """The run is on data/tiny-kimi, the pair that replays the original case."""
    target = Path(params.get("TARGET") or DEFAULT_DIR / "target").resolve()
    draft = Path(params["DRAFT"]).resolve() if params.get("DRAFT") else target.parent / "draft"
    return target == (DEFAULT_DIR / "target").resolve() and draft == (DEFAULT_DIR / "draft").resolve()


def default_rules(params: dict, family: str) -> tuple[str, str]:
    """``--engine`` left out: (the rules, the line that says why). The embedded pair replays the original
    case (``CASE_ENGINE``); a user's pair on a live backend takes the installed release's own rules;
    else the stated default (``DEFAULT_ENGINE``)."""
    if embedded_pair(params):
        return str(CASE_ENGINE), case_replay_line(family)
    runtime = installed(family)
    if runtime is not None:
        return str(runtime), (f"[engine] rules: {runtime}, the installed {runtime.rules.title}'s own "
                              f"(no --engine given; pass --engine NAME==VERSION for yours)")
    return str(DEFAULT_ENGINE), assumed_engine_line(DEFAULT_ENGINE)


def _versioned(engine: str | None) -> str | None:
    """``--engine sglang`` (no release): the installed SGLang's, whose source is its rules."""
    if engine is None:
        return None
    eng = cli.engine_value(engine)
    runtime = installed(eng.name) if eng.rules.runs_release_source and not eng.version else None
    return str(runtime) if runtime is not None else engine


def main(argv=None) -> int:
    ap = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    a = ap.parse_args(cli.glue_option_values(argv, "--training-layout"))
    try:
        a.backend, a.engine = old_spellings(a.backend, a.engine, a.engine_version)
        a.backend = a.backend or "auto"
        engine = _versioned(a.engine)
    except InputError as exc:
        return fail(f"{exc} (nothing was run and nothing under --out was touched)")
    params: dict = dict(SMALL) if a.small else {}
    for key, val in [("TARGET", a.target), ("DRAFT", a.draft), ("RETRAINED_DRAFT", a.retrained_draft),
                     ("TRAINING_LAYOUT", a.training_layout), ("PROMPTS", a.prompts), ("DRAFT_STEPS", a.steps),
                     ("DATA", a.data)]:
        if val is not None:
            params[key] = val
    params.update(BACKEND="reference" if a.backend == "auto" else a.backend, DEVICE=a.device)
    if engine is not None:
        params["ENGINE_VERSION"] = engine
    given = _given_params(ap, a.param, params)   # what -p set
    problems = check_run_inputs(params, a.only)
    if a.out.exists() and not a.out.is_dir():
        problems.insert(0, OUT_IS_A_FILE.format(out=a.out))
    if problems:     # every problem, on the one line an error gets
        return fail("; ".join(problems) + " (nothing was run and nothing under --out was touched)")
    a.only = [normalise_notebook_name(n) for n in a.only] if a.only else a.only
    measures = a.only is None or set(TIMED) & set(a.only)
    if a.backend == "auto" and measures and "BACKEND" not in given:
        params["BACKEND"] = _backend("auto")       # only the benchmarks (01, 06) run an engine
    if "ENGINE_VERSION" not in params:            # neither --engine nor -p ENGINE_VERSION: said in one line
        params["ENGINE_VERSION"], line = default_rules(params, params["BACKEND"])
        print(line)
    for key in ("TARGET", "DRAFT", "RETRAINED_DRAFT", "PROMPTS", "DATA"):
        if params.get(key):
            params[key] = str(Path(params[key]).resolve())
    print(start_line(run_kind(params, a.only)))
    t0 = time.perf_counter()
    runs = run_workbook(a.out, params, a.only, render=not a.no_render)
    for r in runs:
        print(f"{'ok ' if r.ok else 'FAIL'} {r.name:<28} {r.seconds:6.1f}s {r.error}")
    if runs.incomplete is None:
        print(f"reports in {a.out} ({time.perf_counter() - t0:.0f}s); open {a.out / 'index.html'}")
        return 0
    bad = next((r for r in runs if not r.ok), None)
    where = ((bad.name + (f" cell {bad.cell}" if bad.cell is not None else "")) if bad
             else "before any notebook")
    what = "interrupted" if runs.interrupted else "failed"
    print(f"error: {what} at {where} ({bad.error if bad else 'no notebook ran'}); --out {a.out} left as it "
          f"was; partial run in {runs.incomplete} (marked INCOMPLETE)", file=sys.stderr)
    return 130 if runs.interrupted else 1


def _parser():
    ap = cli.parser("run-workbook", __doc__)
    ap.add_argument("--out", type=Path, default=REPO / "reports")
    cli.add_pair_args(ap, engine=None, json=False, paths=False)
    ap.add_argument("--retrained-draft", default=None)
    ap.add_argument("--training-layout", default=None,
                    help="a,b,c; default: the draft's record, else inferred")
    ap.add_argument("--backend", default=None, choices=RUNTIMES,
                    help="the runtime that measures (notebooks 01, 05, 06): sglang (the real engine in "
                         ".venv-sglang), vllm (the real engine in .venv-vllm; bash workbook.sh sets up "
                         "both), llamacpp (llama-server as bash workbook.sh built it; a Llama pair such as "
                         "data/tiny-llama), reference (this workbook's); auto (default): SGLang when it is "
                         "installed, "
                         "else vLLM, else reference (said in one line). The reference engine always runs "
                         "beside a live one, fed the layout the rules predict")
    ap.add_argument("--engine", default=None, metavar="NAME[==VERSION]",
                    help="whose wiring rules decide the served layout: sglang==VERSION, "
                         "vllm[==VERSION], ...; "
                         f"default (said in one line): on the embedded pair the case replay ({CASE_ENGINE}'s "
                         f"capture rule), else a live backend's installed release, else {DEFAULT_ENGINE}")
    ap.add_argument("--engine-version", default=None, help=argparse.SUPPRESS)   # the old --engine
    ap.add_argument("--prompts", default=None)
    ap.add_argument("--data", default=None,
                    help="a trainer's hidden-state dump: notebook 02's isolated test and ranking run from it")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--small", action="store_true",
                    help="tiny parameters: a smoke run in a couple of minutes")
    ap.add_argument("--only", nargs="*", default=None, help="run only these notebooks (names without .ipynb)")
    ap.add_argument("--no-render", action="store_true")
    ap.add_argument("-p", "--param", action="append", default=[], metavar="NAME=JSON",
                    help="any notebook parameter, e.g. -p NUM_PROMPTS=4")
    return ap


def _given_params(ap, pairs: list[str], params: dict) -> set[str]:
    """``-p NAME=VALUE`` into ``params`` (a path as text, anything else as JSON where it parses); returns the
    names given, under the parameters' current names."""
    given = set()
    for p in pairs:
        if "=" not in p:
            ap.error(f"--param expects NAME=VALUE, got {p!r}")
        k, v = p.split("=", 1)
        k = rename_parameter(k)
        given.add(k)
        if k in PATH_PARAMS:     # a path is text as written: TARGET=123 names a folder '123', not a number
            params[k] = v
            continue
        try:
            params[k] = json.loads(v)
        except json.JSONDecodeError:
            params[k] = v
    return given
