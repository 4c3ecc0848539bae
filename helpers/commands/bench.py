"""``python -m helpers bench``: baseline against speculative throughput, and accept length, for one layout.

``--backend reference`` (the default) runs the workbook's own engine in this process
(``live.reference.run_bench``); ``--backend vllm|sglang`` runs the real engine from its venv, and
``--backend llamacpp`` the ``llama-server`` the workbook built (the target and draft converted by
llama.cpp's own converter); each puts the reference engine's figures for the same layout beside it.
``--engine NAME[==VERSION]`` is whose rules say what "served" means: left out, a live run takes the
installed release's own and the reference engine the stated default (said first). ``--guard`` left out
is ``EAGLE3_WORKBOOK_GUARD`` when set, else warn.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import torch

from .. import cli
from ..engines.llamacpp.convert import OUTTYPES
from ..errors import BadOption, InputError, fail, print_json
from ..investigation.fixes import with_engine_ids
from ..investigation.pair import (
    BACKENDS,
    DEFAULT_DIR,
    MAX_STEPS,
    check_device,
    default_prompts,
    fit_prompts,
    load_pair,
    plan_for,
    plan_problems,
)
from ..investigation.prompts import read_prompts
from ..live import guard
from ..live.backends import choose
from ..live.bench import LiveWiring
from ..live.reference import BenchResult, encode_prompts, reference_figures, run_bench
from ..live.timing import speed_phrase
from ..model.draft import run_as
from ..rules.conventions import DEFAULT_ENGINE


def main(argv=None) -> int:
    ap = _parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    a = ap.parse_args(cli.glue_option_values(argv, "--layout"))
    if not 1 <= a.steps <= MAX_STEPS:
        ap.error(f"--steps must be from 1 to {MAX_STEPS} (draft tokens per verify step), got {a.steps}")
    if a.repeats < 1:
        ap.error("--repeats must be at least 1 (a warm-up pass runs before them)")
    if a.max_new_tokens < 1:
        ap.error(f"--max-new-tokens must be at least 1, got {a.max_new_tokens}")
    if a.num_prompts is not None and a.num_prompts < 1:
        ap.error(f"--num-prompts must be at least 1, got {a.num_prompts}")
    if a.outtype is not None and a.backend != "llamacpp":
        ap.error(f"--outtype is the GGUF weight type llama.cpp runs; --backend {a.backend} runs the "
                 f"checkpoint's own weights")
    backend, assumed = None, None
    try:
        a.guard = guard_mode(a.guard, os.environ)
        if a.backend == "reference":    # the reference engine: --engine, or the stated default (said first)
            a.engine, assumed = cli.stated_engine(a.engine)
        else:
            named = None if a.engine is None else cli.engine_value(a.engine)   # a typo fails here
            # vLLM runs its own release's rules; SGLang the named release's (its setter installed live),
            # else the installed release's own
            backend = choose(a.backend, named)
            if not backend.live:        # one line and exit 2 when this host has no such engine
                raise BadOption(backend.unavailable)
            if backend.refuses(named):
                raise BadOption(backend.refuses(named))
            a.engine = backend.engine
        check_device(a.device)          # a typo in --device fails before any model loads (--engine: cli)
        if a.prompts is not None:
            read_prompts(a.prompts)
        if a.widen is not None:
            wide = _widened(a)
            print(f"[widen] {wide.sentence()}", file=sys.stderr)
        pair = load_pair(a.target, a.draft, a.device)
        plan = plan_for(pair, a.layout, a.engine)
        problems = plan_problems(pair, plan)
        if problems:
            raise ValueError(f"layout {plan.layout} ({plan.source}) cannot feed this draft: "
                             f"{'; '.join(problems)}")
        prompts = read_prompts(a.prompts or default_prompts(pair))[: a.num_prompts]
        prompt_ids, fit_notes = fit_prompts(pair, encode_prompts(pair.tokenizer, prompts, a.device),
                                            a.max_new_tokens, a.steps, a.truncate_prompts,
                                            str(a.prompts or default_prompts(pair)))
    except (FileNotFoundError, InputError, ValueError) as exc:
        return fail(exc)
    for n in fit_notes:
        print(f"warning: {n}", file=sys.stderr)
    torch.manual_seed(0)
    try:
        with run_as(pair.draft, a.engine) as engine_notes:  # the engine's forward, not only its wiring
            res = run_bench(pair.target, pair.draft, plan, prompt_ids, a.steps,
                            a.max_new_tokens, a.repeats if backend is None else 1,
                            progress=not a.json, label=a.layout)
        if backend is not None:
            notes = list(plan.warnings) + fit_notes + engine_notes
            return _live(a, backend, pair, plan, res, prompt_ids, notes)
    except InputError as exc:
        return fail(exc)
    engine_notes = list(plan.warnings) + fit_notes + engine_notes
    if a.json:
        print_json({"assumed_engine": str(a.engine) if assumed else None} | res.to_dict()
                   | {"engine": str(a.engine), "engine_notes": engine_notes})
    else:
        if assumed:
            print(assumed)
        print(render_reference(res, plan, engine_notes, a.steps, len(prompts), a.repeats))
    return 0 if res.lossless else 1


def _parser():
    ap = cli.parser("bench", __doc__)
    ap.add_argument("--layout", default="served", help="served | trained | a,b,c (boundaries)")
    ap.add_argument("--steps", type=int, default=5, help="draft tokens per verify step")
    ap.add_argument("--prompts", type=Path, default=None,
                    help="JSONL with a 'prompt' field, or one prompt per line")
    cli.add_pair_args(ap, engine="whose rules decide what 'served' means: sglang==VERSION, vllm[==VERSION]"
                                 "[:v1|:v2], ...; default: a live --backend's installed release, else "
                                 f"{DEFAULT_ENGINE} (said in the output's first line)")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=4,
                    help="timed passes over the prompts; even, so each prompt runs each side first equally "
                         "often")
    ap.add_argument("--num-prompts", type=int, default=None)
    ap.add_argument("--truncate-prompts", action="store_true",
                    help="keep each prompt's last tokens so prompt + new tokens fit the target's positions")
    ap.add_argument("--backend", choices=BACKENDS, default="reference",
                    help="the runtime that runs: reference (this workbook's, in process), vllm (the real "
                         "engine from .venv-vllm, its own process, under its own release's rules) or "
                         "sglang (the real engine from .venv-sglang; --engine defaults to its release, and "
                         "--engine sglang==0.5.9 runs that release's own capture rule on the installed "
                         "runtime) or llamacpp (llama-server as `bash workbook.sh llamacpp` built it; "
                         "the layout is the converted GGUF's eagle3.target_layers)")
    ap.add_argument("--widen", type=int, default=None, metavar="FACTOR",
                    help="bench a copy of the target whose feed-forward blocks are FACTOR times as wide, "
                         "zero-padded (the same function, checked; model.widen): a decode step that waits on "
                         "memory as a large target's does. Written once into the cache")
    ap.add_argument("--outtype", choices=OUTTYPES, default=None,
                    help="--backend llamacpp: the target GGUF's weight type (default f32, the pair's weights "
                         "exactly; f16 or bf16 read half as much per decode step, and which is cheaper to "
                         "verify with depends on the CPU: docs/timing.md)")
    ap.add_argument("--guard", choices=[str(m) for m in guard.Mode], default=None,
                    help=f"the engine guard inside a live engine (docs/guard.md): warn (the engine starts, "
                         f"the mismatch is measured), refuse (a miswired draft never starts: exit 2, no "
                         f"token served) or off; default: ${guard.GUARD_ENV} when set, else warn")
    return ap


def render_reference(res, plan, engine_notes: list[str], steps: int, prompts: int, repeats: int) -> str:
    """The reference engine's run as a person reads it: the speed with its interval, then the deterministic
    figures and the costs."""
    t = res.timing
    return "\n".join([
        f"reference engine (this workbook's), layout {plan.label} ({plan.source}), {steps} draft steps, "
        f"{prompts} prompts x {repeats} repeats",
        *(f"  note: {n}" for n in engine_notes),
        f"  baseline     {res.baseline_tok_s:8.1f} tok/s",
        f"  speculative  {res.spec_tok_s:8.1f} tok/s   tau {res.tau:.2f}   accept rate {res.accept_rate:.2f}",
        f"  speedup      {speed_phrase(t)}",
        f"               paired, {t.order}, {t.pairs} pairs; {t.method}",
        f"  accept length {res.tau:.2f} (deterministic), per position {res.position_acceptance}   "
        f"lossless: {res.lossless}",
        f"  costs        decode {res.decode_ms:.1f} ms, verify {res.verify_ms:.1f} ms, draft step "
        f"{res.draft_step_ms:.2f} ms ({res.draft_cost_ratio:.2f} of a decode) "
        f"-> predicted {res.predicted_speedup:.2f}x",
        f"  break-even   tau {res.break_even_tau:.2f} (one round costs that many decode steps here); "
        f"slower than baseline on {res.slower_prompts} of {len(res.per_prompt)} prompts",
    ])


def _widened(a):
    """``--widen``: the padded copy of the target (written once into the cache), checked to compute what
    the original does; ``a.target`` then names it, and the prompts stay the original pair's."""
    from ..model.widen import same_function, widen
    from ..rules.wheels import cache_root

    source = Path(a.target) if a.target else DEFAULT_DIR / "target"
    a.draft = a.draft or str(source.parent / "draft")
    if a.prompts is None:
        for d in (source.parent, DEFAULT_DIR):
            if (d / "prompts.jsonl").is_file():
                a.prompts = d / "prompts.jsonl"
                break
    wide = widen(source, cache_root("widened") / f"{source.resolve().parent.name}-{source.name}-x{a.widen}",
                 a.widen)
    same_function(wide)
    a.target = str(wide.path)
    return wide


def guard_mode(flag: str | None, environ) -> guard.Mode:
    """``--guard``, else the user's ``EAGLE3_WORKBOOK_GUARD`` when set (a bad value: its one line, exit 2),
    else warn: a live run measures the mismatch unless told to refuse it."""
    if flag is not None:
        return guard.Mode(flag)
    text = environ.get(guard.GUARD_ENV)
    if text is None or not text.strip():
        return guard.Mode.WARN
    try:
        return guard.mode_from(text)
    except ValueError as exc:
        raise BadOption(f"{exc} (or pass --guard)") from None


def _live(a, backend, pair, plan, ref: BenchResult, prompt_ids, notes: list[str]) -> int:
    """``--backend vllm|sglang|llamacpp``: the draft the engine loads is the one given, or for another
    layout a copy whose ids (in the key the engine reads) name that layout; beside it, the reference
    engine fed the same layout."""
    with tempfile.TemporaryDirectory(prefix="eagle3-bench-") as tmp:
        draft = pair.draft_dir
        if a.layout != "served":
            draft = with_engine_ids(pair.draft_dir, Path(tmp) / "draft", list(plan.layout), engine=a.engine)
        rows = backend.bench(pair.target_dir, [LiveWiring(a.layout, draft, tuple(plan.layout))],
                             [p.tolist() for p in prompt_ids], steps=a.steps, max_new_tokens=a.max_new_tokens,
                             repeats=a.repeats, progress=not a.json, log_dir=Path(tmp) / "logs",
                             guard=a.guard, outtype=a.outtype or "f32")
    row = rows[0]
    row.reference = reference_figures(ref)
    if a.json:
        print_json(row.to_dict() | {"engine": str(a.engine), "engine_notes": notes})
        return 0 if row.lossless else 1
    print(f"{backend.label} on this host, layout {plan.label} ({plan.source}) as {row.rules} serves it, "
          f"{a.steps} draft steps, {row.prompts} prompts x {a.repeats}")
    for n in notes:
        print(f"  note: {n}")
    for f in row.fixes:
        print(f"  {backend.family} fix {f['fix']}: {f['state']} ({f['why']})")
    if row.guard:
        g = row.guard
        print(f"  guard ({g['mode']}, {g['seconds'] * 1000:.0f} ms at load): {g['kind']}: {g['line']}")
    print(f"  baseline     {row.baseline_tok_s:8.1f} tok/s")
    print(f"  speculative  {row.spec_tok_s:8.1f} tok/s   accept length {row.accept_length:.2f}   "
          f"per position {row.accepted_per_position}")
    print(f"  speedup      {speed_phrase(row.timing)}   lossless: {row.lossless}")
    print(f"  reference    accept length {ref.tau:.2f} on the same layout ({backend.family} - reference: "
          f"{row.tau_gap:+.2f}); speed {speed_phrase(ref.timing)}")
    if row.costs:
        c = row.costs
        print(f"  costs        {row.backend}: decode {c['decode']:.2f} ms, verify of {a.steps + 1} tokens "
              f"{c['verify']:.2f} ms, draft step {c['draft_step']:.2f} ms (derived), round "
              f"{c['round']:.2f} ms -> break-even accept length {c['break_even_tau']:.2f}"
              + (f"; noisy: {'; '.join(c['noisy'])}" if c["noisy"] else ""))
        print(f"               reference engine: decode {ref.decode_ms:.2f} ms, verify {ref.verify_ms:.2f} "
              f"ms, draft step {ref.draft_step_ms:.2f} ms -> break-even accept length "
              f"{ref.break_even_tau:.2f}")
    return 0 if row.lossless else 1
