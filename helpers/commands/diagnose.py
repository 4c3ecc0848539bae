"""``python -m helpers diagnose``: which layout was this draft trained on, and what is it served?

Answers without being told the training layout: every boundary is captured once on
held-out text, every candidate layout is scored, and the best is compared with the layout
the engine resolves for the draft's config. A large gap is the wiring bug.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

from .. import cli
from ..boundaries import layout_label
from ..errors import BadOption, InputError, fail, print_json, read_text_file
from ..investigation.diagnosis import diagnose_text
from ..investigation.evaluate import EvalInputError
from ..investigation.exports import parse_duration, read_served
from ..investigation.metrics import metrics_verdict
from ..investigation.metrics_report import export_engine, render_metrics, served_profile_file
from ..investigation.pair import MAX_STEPS, eval_captures, load_pair
from ..investigation.verdict import candidate_table
from ..judgement import MIN_BLOCKS
from ..profile import NAME as PROFILE_NAME
from ..profile import read_profile, write_profile
from .dump import run_dump_diagnosis

SERVED_PROFILE = "served_profile.json"
WINDOWS, MAX_WINDOWS = 12, 96     # 256-token windows evaluated first, and at most while not settled


def served_profile_path(where: Path, draft: Path) -> Path:
    """Where a served profile goes: a folder gets ``served_profile.json``, never the draft's own
    ``speculation_profile.json`` (what the draft should reach, which a served window must not replace)."""
    path = where / SERVED_PROFILE if where.is_dir() else where
    if path.name == PROFILE_NAME:
        raise BadOption(f"--write-profile {where}: {PROFILE_NAME} is the draft's own expectation; a served "
                        f"window is written under another name (a folder gets {SERVED_PROFILE})")
    return path


def main(argv=None) -> int:
    ap = _parser()
    a = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    engine_named, target_named = a.engine is not None, a.target is not None

    if not 1 <= a.steps <= MAX_STEPS:
        ap.error(f"--steps must be from 1 to {MAX_STEPS}, got {a.steps}")
    given = a.windows is not None
    a.windows = WINDOWS if a.windows is None else a.windows
    if a.windows < 2:
        ap.error(f"--windows must be at least 2 (the ranking's confidence needs more than one window), got "
                 f"{a.windows}")
    a.max_windows = max(a.max_windows or (a.windows if given else MAX_WINDOWS), a.windows)
    try:   # a typo in --engine fails before any weights load; none given: the stated default, said first
        a.engine, assumed = cli.stated_engine(a.engine)
    except InputError as exc:
        return fail(exc)
    assumed_engine = str(a.engine) if assumed else None
    if a.metrics is not None:
        if a.data is not None:
            return fail(BadOption("--metrics and --data answer different questions; pass one of them"))
        return run_metrics_diagnosis(a, engine_named, target_named)
    if a.data is not None:
        return run_dump_diagnosis(a, assumed_engine)
    try:
        if a.text is not None and not a.text.is_file():
            raise FileNotFoundError(f"no text file at {a.text}")

        text = read_text_file(a.text, "text file") if a.text else None  # before the models load
        pair = load_pair(a.target, a.draft, a.device)
        caps = (eval_captures(pair, text, max_windows=a.windows, where=str(a.text), origin="--text") if text
                else eval_captures(pair, max_windows=a.windows))
        d = diagnose_text(pair, caps, a.engine, a.steps, budget=a.max_windows, progress=not a.json)
        d.assumed_engine = assumed_engine
    except (FileNotFoundError, ValueError, EvalInputError) as exc:  # InputError is a ValueError
        return fail(exc)
    if a.json:
        print_json(d.to_dict())
        return d.exit_code
    if assumed:
        print(assumed)
    print(render_diagnosis(d, a.engine))
    return d.exit_code


def _parser():
    ap = cli.parser("diagnose", __doc__)
    cli.add_pair_args(ap)
    ap.add_argument("--text", type=Path, default=None,
                    help="your own text to evaluate on, as your users send it (default: heldout.txt beside "
                         "the target, else the workbook's embedded text, which is said)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--windows", type=int, default=None,
                    help=f"256-token windows of text to evaluate (default {WINDOWS}, doubled up to "
                         f"--max-windows while the verdict is not settled; given, exactly that many)")
    ap.add_argument("--max-windows", type=int, default=None,
                    help=f"windows to grow to, doubling, while the verdict is not settled (default "
                         f"{MAX_WINDOWS}, or --windows when that is given)")
    dump = ap.add_argument_group("from a trainer's hidden-state dump (no target forward; see docs/dumps.md)")
    dump.add_argument("--data", type=Path, default=None,
                      help="dump folder: hs_*.safetensors, data_*.pt + data_config.json, or "
                           "rows_*/data_*.ckpt[.gz]")
    dump.add_argument("--slot-boundaries", default=None,
                      help="each slot's boundary, e.g. 0,3,7,12 ('?' for unknown); default: the dump's "
                           "record or measured")
    dump.add_argument("--max-records", type=int, default=None)
    dump.add_argument("--max-tokens", type=int, default=None)
    dump.add_argument("--run-target", choices=("auto", "yes", "no"), default="auto",
                      help="match slots against the target's own capture (auto: when its weights are "
                           "under 4 GB)")
    metrics = ap.add_argument_group("from a serving deployment's metrics (see docs/metrics.md)")
    metrics.add_argument("--metrics", action="append", default=None, metavar="SOURCE",
                         help="an export: a Prometheus /metrics scrape (file or loopback URL) from vLLM, "
                              "SGLang or llama.cpp, an engine's log, JSON responses (SGLang /generate or /v1 "
                              "with spec details, vLLM per-request metrics, llama.cpp /completion) or "
                              "SGLang's /server_info; twice (BEFORE, AFTER): the window between two scrapes")
    metrics.add_argument("--window", default=None, metavar="DURATION",
                         help="with a URL: scrape it twice this far apart (60s, 5m, 1h); diagnose the window")
    metrics.add_argument("--temperature", type=float, default=None,
                         help="the traffic's sampling temperature (default: from the responses, else 0 "
                              "assumed and the figure at 1.0 given beside it)")
    metrics.add_argument("--baseline", type=Path, default=None, metavar="PROFILE",
                         help="a speculation_profile.json (a healthy window's, or the training "
                              "evaluation's): exit 1 when the accept length or a position falls below it "
                              "beyond the intervals")
    metrics.add_argument("--write-profile", type=Path, default=None, metavar="PATH",
                         help="write this window's served profile as a speculation_profile.json (a baseline)")
    metrics.add_argument("--draft-tokens", type=int, default=None, metavar="K",
                         help="draft tokens per verify step, where the export does not say (llama.cpp's "
                              "--spec-draft-n-max for its /completion timings)")
    metrics.add_argument("--served-on", choices=("cpu", "gpu"), default=None,
                         help="what the engine ran on, where the export does not say: SGLang verifies "
                              "greedily on a CPU at any temperature (its /server_info says)")
    return ap


def render_diagnosis(d, engine) -> str:
    """The lines a person reads: the verdict first, then the evidence (the ranking, the served layout, the
    record, the candidates)."""
    out = []
    L = d.num_layers
    out.append("\n".join(d.wiring.head if d.wiring else [d.verdict]))
    if d.text is not None:
        out.append(d.text.line + (f"; {d.growth}" if d.growth else ""))
    out.append("evidence:")
    out.append(f"ranked by {d.ranked_by}")
    out.append(f"best: {layout_label(d.best_layout, L)} = {d.best_layout}   accept length "
               f"{d.best_accept:.3f}   step-0 acc {d.best_acc:.3f}   ce {d.best_ce:.3f}")
    sr = d.search
    if sr.runner_up is not None:
        why = ("confident" if sr.confident else
               f"NOT confident: {sr.blocks} blocks are too few, evaluate on more text"
               if sr.blocks < MIN_BLOCKS else "NOT confident: evaluate on more text")
        out.append(f"   runner-up {sr.runner_up}: {sr.margin:.3f} accepted tokens per step behind, "
                   f"z = {sr.z:.1f} over {sr.blocks} blocks of tokens ({why})")
    if len(d.confident_set) > 1:
        out.append(f"   within noise of the best: {d.confident_set}")
    if d.served_errors:
        label = layout_label(d.served_layout, L) if d.served_layout else "nothing"
        out.append(f"served by {engine}: {label} = {d.served_layout}   [{d.served_source}]  "
                   f"CANNOT FEED THIS DRAFT")
        for e in d.served_errors:
            out.append(f"   error: {e}")
    else:
        out.append(f"served by {engine}: {layout_label(d.served_layout, L)} = {d.served_layout}   "
                   f"accept length {d.served_accept:.3f}   step-0 acc {d.served_acc:.3f}   "
                   f"ce {d.served_ce:.3f}   [{d.served_source}]")
    for n in d.served_notes:
        out.append(f"   note: {n}")
    if d.recorded_layout:
        out.append(f"training record says: {d.recorded_layout}"
                   + ("  (the search prefers another layout: stale record, or evaluate on more text)"
                      if d.record_disagrees else "  (the search agrees)"))
    w = d.wiring
    if w and w.candidates and not w.trained_known:
        out.append("\n".join(candidate_table(w.candidates, engine, L)))
    return "\n".join(out)


# --------------------------------------------------------------------------------------
# python -m helpers diagnose --metrics SOURCE [--metrics AFTER | --window 60s]


def run_metrics_diagnosis(a, engine_named: bool, target_named: bool) -> int:
    try:
        if a.draft is None:
            raise BadOption("--metrics needs --draft DIR: the draft the engine serves")
        if a.temperature is not None and not (math.isfinite(a.temperature) and a.temperature >= 0):
            raise BadOption(f"--temperature must be a number >= 0, got {a.temperature}")
        if a.draft_tokens is not None and a.draft_tokens < 1:
            raise BadOption(f"--draft-tokens must be at least 1, got {a.draft_tokens}")
        seconds = parse_duration(a.window) if a.window is not None else None
        baseline = read_profile(a.baseline, required=True) if a.baseline is not None else None
        profile = read_served(a.metrics, seconds, num_spec_tokens=a.draft_tokens)
        engine, line = export_engine(profile.engine, a.engine if engine_named else None)
        text = read_text_file(a.text, "text file") if a.text else None
        v = metrics_verdict(profile, a.draft, a.target if target_named else None, engine, text, a.windows,
                            a.device, temperature=a.temperature, baseline=baseline, steps=a.steps,
                            served_on=a.served_on)
        written = write_profile(served_profile_path(a.write_profile, a.draft),
                                served_profile_file(v)) if a.write_profile else None
    except (FileNotFoundError, ValueError, EvalInputError) as exc:
        return fail(exc)
    if a.json:
        print_json({"engine_line": line, "written_profile": None if written is None else str(written)}
                   | v.to_dict())
        return v.exit_code
    if line:
        print(line)
    for out in render_metrics(v):
        print(out)
    if written:
        print(f"wrote {written} (the served profile: pass it as --baseline to gate later windows)")
    return v.exit_code
