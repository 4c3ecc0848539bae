"""``python -m helpers sglang-bench``: a live SGLang server on a GPU host, the same prompts with and without
the draft, for each wiring; ``live.sglang.server`` starts, measures and stops the server.
"""
from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Sequence

from .. import cli
from ..errors import print_json
from ..investigation.prompts import read_prompts
from ..live.sglang.server import (
    DEFAULT_PORT,
    DEFAULT_PROMPTS,
    LiveBenchComparison,
    default_python,
    draft_wiring_notes,
    live_bench,
    looks_local,
    sglang_available,
)

EXIT_UNAVAILABLE = 2


def _parser():
    p = cli.parser("sglang-bench", "Serve a target with SGLang, without and with an EAGLE-3 draft; compare "
                                   "tok/s and accept length.")
    cli.add_pair_args(p, target="target model directory (or HF id)",
                      draft="EAGLE-3 draft directory (or HF id)", engine=None, device=False, json=False,
                      required=True, paths=False)
    p.add_argument("--prompts", help="JSONL with a 'prompt' field per line, or .txt one per line")
    p.add_argument("--steps", type=int, default=3, help="--speculative-num-steps")
    p.add_argument("--topk", type=int, default=1, help="--speculative-eagle-topk")
    p.add_argument("--draft-tokens", type=int, help="--speculative-num-draft-tokens (default steps+1)")
    p.add_argument("--python", help="python that has sglang (default $SGLANG_PYTHON or this one)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--mem-fraction", type=float)
    p.add_argument("--no-baseline", action="store_true", help="only run the speculative server")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--log-dir", help="where server logs go (default: a new temp dir)")
    p.add_argument("--dry-run", action="store_true", help="print the launch commands and exit")
    cli.add_pair_args(p, target=None, draft=None, engine=None, device=False)
    return p


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _print_report(cmp: LiveBenchComparison) -> None:
    for res in (cmp.baseline, cmp.speculative):
        if res is None:
            continue
        print(f"{res.label:12s} median {res.median_tok_s:8.1f} tok/s  accept length median "
              f"{_fmt(res.median_accept_length)} pooled {_fmt(res.pooled_accept_length)} "
              f"server {_fmt(res.server_avg_accept_length)}  ({len(res.rows)} requests)")
    if cmp.speedup is not None:
        print(f"speedup      {cmp.speedup:.2f}x")
    for name, path in cmp.log_paths.items():
        print(f"log {name}: {path}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    for flag in ("steps", "topk", "max_new_tokens", "tp_size"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    if args.draft_tokens is not None and args.draft_tokens < 2:
        parser.error(f"--draft-tokens must be at least 2 (one verified token plus a draft), got "
                     f"{args.draft_tokens}")
    python = args.python or default_python()
    try:
        for what in ("target", "draft"):
            ref = getattr(args, what)
            if looks_local(ref) and not (Path(ref).expanduser() / "config.json").is_file():
                raise FileNotFoundError(f"--{what} {ref}: no config.json there (a local model directory or a "
                                        f"hub id like org/name is expected)")
        beside = Path(args.target).parent / "prompts.jsonl"
        prompts = (read_prompts(args.prompts) if args.prompts else
                   read_prompts(beside) if beside.is_file() else list(DEFAULT_PROMPTS))
        notes = draft_wiring_notes(args.draft)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    kwargs = dict(
        steps=args.steps, topk=args.topk, draft_tokens=args.draft_tokens, python=python, port=args.port,
        max_new_tokens=args.max_new_tokens, baseline=not args.no_baseline, tp_size=args.tp_size,
        mem_fraction=args.mem_fraction, startup_timeout=args.startup_timeout, log_dir=args.log_dir,
    )
    if args.dry_run:
        cmp = live_bench(args.target, args.draft, prompts, dry_run=True, **kwargs)
        if args.json:
            print_json({"commands": {k: shlex.join(v) for k, v in cmp.commands.items()},
                        "wiring_notes": notes},
                       indent=2)
        else:
            for name, cmd in cmp.commands.items():
                print(f"# {name}\n{shlex.join(cmd)}")
            for n in notes:
                print(f"# wiring: {n}")
        return 0
    ok, reason = sglang_available(python)
    if not ok:
        print(f"sglang-bench: cannot run live: {reason}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    cmp = live_bench(args.target, args.draft, prompts, **kwargs)
    if args.json:
        print_json(cmp.to_dict(), indent=2, default=str)  # a live server's NaN accept length stays out
    else:
        _print_report(cmp)
    return 0
