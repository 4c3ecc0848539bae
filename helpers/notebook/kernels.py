"""The symptom on a real engine's kernels: notebooks 01 and 06's chapter ``KERNELS``.

The embedded targets sit in a CPU's caches, where a verify of k+1 tokens costs what its arithmetic costs,
so their speed ratios say little about a deployment (docs/timing.md). This chapter measures the same
miswiring where a decode step waits on memory, as a large target's does, on llama.cpp's own kernels:

- the pair is the Llama sibling ``data/tiny-llama`` (llama.cpp's graph feeds no DeepSeek draft): its draft
  was trained on (0, 3, 7), and llama.cpp's converter serves it the config's ids (2, 6, 9);
- its target is widened (``model.widen``: feed-forward blocks ``WIDEN`` times as wide, zero-padded, the
  same function, checked on its text) and converted by llama.cpp's own converter;
- ``llama-server`` serves it in the weight type and with the k draft tokens per round chosen on the host
  (``choose_regime``: each weight type's verify costs measured on its own server, the draft's acceptance
  per position on the reference engine, the pair that predicts the most), notebook 06 taking notebook
  01's choice: the
  deployed draft (notebook 01), fix A
  (``fixes deploy``'s copy for this build) and fix B (the draft retrained on the served layout) (notebook
  06), each against the same baseline, paired and interleaved, with the round's costs in decode steps
  (``engines.llamacpp.costs``) and the reference engine's accept length on the same layout beside it.

What the choice and the rows measured on this host (each weight type's verify curve, the draft step) is
kept for the next run here (``notebook.host_costs``), which uses it and names the run that measured it.

``bash workbook.sh run`` builds ``llama-server`` in the background while the venvs install; the runner waits
for it before the first notebook that times a speed (``await_build``, a progress bar), and ``server`` waits
on the build's lock too (``engines.llamacpp.build.await_server``), at most ``BUILD_WAIT_S``, and never
builds. Outcomes are data (``KernelsRun``), the sentences are built here, and the
notebooks print them.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tqdm.auto import tqdm

from ..engines.llamacpp.bench import host_threads
from ..engines.llamacpp.build import LlamacppUnavailable, ServerBuild, await_server, build_progress
from ..engines.llamacpp.convert import convert
from ..engines.llamacpp.costs import VerifyCurve, verify_curve
from ..engines.llamacpp.engine import LlamacppEngine, LlamacppEngineError, ServerLaunch
from ..errors import CacheError
from ..investigation.fixes import deploy
from ..investigation.pair import REPO, load_pair, trained_plan
from ..investigation.prompts import read_prompts
from ..live.backends import Backend, choose
from ..live.bench import LiveRow, LiveWiring
from ..live.reference import encode_prompts, reference_figures, run_bench
from ..model.checkpoint import load_draft
from ..model.engine import position_acceptance, speculative_generate
from ..model.widen import Widened, same_function, widen
from ..rules.conventions import read_draft_config
from ..rules.wheels import cache_root
from .durations import BUILD_LOG_ENV
from .host_costs import CurveMemory, remember_draft_costs, remembered_draft_costs
from .reports import kernel_rows

PAIR = REPO / "data" / "tiny-llama"
WIDEN = 96          # 272 MiB of weights read per decode step in f16, where the original reads 3
OUTTYPE = "f16"     # half what f32 reads; on CPUs with fast f16 kernels a verify of 4 costs ~1.4 decodes
# the weight types the choice tries, in this order, until one predicts ENOUGH: f16 first (the fastest
# verify on the Intel AMX host), then the others, whose kernels may batch better on another CPU
WEIGHT_TYPES = ("f16", "bf16", "f32", "q8_0")
ENOUGH = 1.7        # a prediction at which the fixes clear 1.5x measured: draft steps, where not counted in
                    # it, cost a tenth to a fifth (1.88-1.99x predicted, 1.64-1.71x measured; docs/timing.md)
BETTER = 1.1        # another weight type replaces the first only when it predicts this much more: two
                    # within a tenth of each other are within the timing's noise (docs/timing.md)
STEPS = 3           # draft tokens per round where the host's costs cannot be measured
MAX_STEPS = 5       # the longest round the choice considers (a verify of 6)
CHOICE_PROMPTS = 2  # prompts the choice measures on: its costs are medians, its acceptance pooled
BUILD_WAIT_S = 60 * 60   # a build takes 4-8 min on 2 cores; one still holding its lock after an hour hangs
NAMES = ("deployed", "fix A", "fix B")
ENGINES = ("llamacpp",)


@dataclass(frozen=True)
class Chapter:
    """The notebooks' ``KERNELS`` parsed: how much wider the target is, and the weight type where the user
    fixed it (None: chosen on the host)."""

    widen_by: int
    outtype: str | None = None


def parse(text) -> Chapter | None:
    """The notebooks' ``KERNELS`` (``"llamacpp x96"``: the engine, then how much wider the target is, then
    optionally the weight type, ``"llamacpp x96 f16"``); None skips the chapter. Raises ``ValueError``
    naming what was expected."""
    if text is None:
        return None
    parts = str(text).split()
    if (len(parts) in (2, 3) and parts[0] in ENGINES and parts[1][:1] == "x" and parts[1][1:].isdigit()
            and int(parts[1][1:]) >= 1 and (len(parts) == 2 or parts[2] in WEIGHT_TYPES)):
        return Chapter(int(parts[1][1:]), parts[2] if len(parts) == 3 else None)
    raise ValueError(f"KERNELS must be None or 'llamacpp xFACTOR' with an optional weight type of "
                     f"{', '.join(WEIGHT_TYPES)} (e.g. 'llamacpp x{WIDEN}' or 'llamacpp x{WIDEN} "
                     f"{OUTTYPE}'), got {text!r}")


@dataclass
class KernelsRun:
    """What the chapter measured: a row per wiring on llama-server, what the target is, and the settings
    a later notebook compares before it reuses a row; ``unavailable`` says why nothing was measured."""

    rows: list[LiveRow] = field(default_factory=list)
    engine: str = ""                      # llama.cpp's build, as its rows name it
    target: dict | None = None            # ``Widened.to_dict``: what a decode step reads
    target_sentence: str = ""
    settings: dict = field(default_factory=dict)
    unavailable: str | None = None
    lines: list[str] = field(default_factory=list)   # what was done, for the folded log
    choice: dict | None = None            # ``RegimeChoice.to_dict``: how weight type and round were chosen

    def to_dict(self) -> dict:
        return {"rows": [r.to_dict() for r in self.rows], "engine": self.engine, "target": self.target,
                "target_sentence": self.target_sentence, "settings": self.settings,
                "unavailable": self.unavailable, "choice": self.choice, "lines": list(self.lines)}

    @classmethod
    def from_dict(cls, d: dict | None) -> KernelsRun | None:
        if not d:
            return None
        return cls([LiveRow.from_dict(r) for r in d.get("rows", [])], d.get("engine", ""), d.get("target"),
                   d.get("target_sentence", ""), d.get("settings", {}), d.get("unavailable"),
                   list(d.get("lines", [])), choice=d.get("choice"))


def settings(num_prompts: int, max_new_tokens: int, repeats: int, widen_by: int = WIDEN,
             outtype: str | None = OUTTYPE, steps: int | None = STEPS) -> dict:
    return {"pair": str(PAIR), "widen": widen_by, "outtype": outtype, "steps": steps,
            "prompts": num_prompts, "max_new_tokens": max_new_tokens, "repeats": repeats}


def server(progress: bool = True, wait_s: float = BUILD_WAIT_S, *, tick: Callable[[], None] | None = None,
           waiting: Callable[[str], None] | None = None) -> ServerBuild | str:
    """The llama-server this host has, waiting first on the lock of a build another process holds (the one
    ``bash workbook.sh run`` started in the background), at most ``wait_s`` seconds; else why there is none,
    in one line. ``tick`` is called at each poll while waiting; ``waiting`` says the one line a wait starts
    with (default: the lock's own, printed where ``progress``)."""
    log = os.environ.get(BUILD_LOG_ENV, "")
    say = waiting or (print if progress else (lambda line: None))
    try:
        found = await_server(wait_s=wait_s, log=say, tick=tick)
    except (LlamacppUnavailable, CacheError) as exc:
        return f"{exc}" + (f" (its log: {log})" if log else "")
    if found is not None:
        return found
    if log:
        return f"llama-server's build did not complete on this host (its log: {log})"
    return choose("llamacpp").unavailable or "llama-server is not built on this host"


def await_build(progress: bool = True, wait_s: float = BUILD_WAIT_S,
                stopped: Callable[[], bool] = lambda: False) -> str | None:
    """Wait, with a progress bar, for the llama-server build that ``bash workbook.sh run`` started beside
    this run (its log named by ``BUILD_LOG_ENV``), so that no pair is timed beside a compiler: on 2 cores a
    pair timed beside the build took 5-8 times as long and gave no usable interval (docs/timing.md), while
    the build uses both cores itself, so waiting idles nothing. Returns ``server``'s line saying why there
    is no server (the chapter says the same later), None otherwise; no build started: returns at once.
    ``stopped`` (Ctrl-C, asked at each poll) ends the wait with ``KeyboardInterrupt``."""
    log = os.environ.get(BUILD_LOG_ENV, "")
    if not log:
        return None
    bar = tqdm(total=100, desc="llama-server build", unit="%", disable=not progress, leave=False,
               bar_format="{desc}: {percentage:3.0f}% of its compile step|{bar}| {elapsed}")

    def tick() -> None:
        if stopped():
            raise KeyboardInterrupt
        done = build_progress()
        if done > bar.n:
            bar.update(done - bar.n)

    def waiting(_line: str) -> None:     # said only when the build still holds its lock
        if progress:
            print(f"[llamacpp] llama-server is still being built ({log}); the notebooks that time a speed "
                  f"start when it is done, so that no pair runs beside a compiler", flush=True)

    try:
        found = server(progress, wait_s, tick=tick, waiting=waiting)
    finally:
        bar.close()
    return found if isinstance(found, str) else None


def wide_target(widen_by: int = WIDEN) -> Widened:
    """The widened copy of the pair's target, written once into the cache and checked to compute what the
    original does."""
    wide = widen(PAIR / "target", cache_root("widened") / f"{PAIR.name}-target-x{widen_by}", widen_by)
    same_function(wide)
    return wide


def measure(names, reports: Path, *, num_prompts: int, max_new_tokens: int, repeats: int,
            reuse: KernelsRun | None = None, widen_by: int = WIDEN, outtype: str | None = None,
            steps: int | None = None, progress: bool = True) -> KernelsRun:
    """``names`` (of ``NAMES``) on llama-server at a real target's cost; a row of ``reuse`` (notebook 01's
    run) stands in for its wiring when it was measured with the same settings. ``outtype`` and ``steps``
    None: notebook 01's choice where ``reuse`` was measured with the same settings otherwise, else chosen
    here (``choose_regime``)."""
    want = settings(num_prompts, max_new_tokens, repeats, widen_by, outtype, steps)
    run = KernelsRun(settings=want)
    found = server(progress)
    if isinstance(found, str):
        run.unavailable = found
        return run
    backend = Backend("llamacpp", found.engine, found)
    run.engine = backend.label
    wide = wide_target(widen_by)
    run.target, run.target_sentence = wide.to_dict(), wide.sentence()
    pair = load_pair(PAIR / "target", PAIR / "draft", "cpu")
    prompt_ids = encode_prompts(pair.tokenizer, read_prompts(PAIR / "prompts.jsonl")[:num_prompts], "cpu")
    if steps is None or outtype is None:
        prior = reuse.settings if reuse else {}
        if (reuse and prior.get("steps") and prior.get("outtype") and _apart_from_choice(prior) ==
                _apart_from_choice(want) and want["steps"] in (None, prior["steps"])
                and want["outtype"] in (None, prior["outtype"])):
            steps, outtype, run.choice = int(prior["steps"]), str(prior["outtype"]), reuse.choice
            run.lines.append(f"weights {outtype}, draft steps {steps}: notebook 01's choice on this host")
        else:
            try:
                choice = choose_regime(found, wide, pair, prompt_ids, max_new_tokens,
                                       outtypes=WEIGHT_TYPES if outtype is None else (outtype,), steps=steps,
                                       draft_costs=remembered_draft_costs(backend.label, PAIR.name, widen_by),
                                       curves=CurveMemory(backend.label, PAIR.name, widen_by))
                steps, outtype, run.choice = choice.steps, choice.outtype, choice.to_dict()
                run.lines.append(f"weights and draft steps: {choice.sentence()}")
            except LlamacppUnavailable as exc:
                steps, outtype = steps or STEPS, outtype or OUTTYPE
                run.lines.append(f"weights {outtype}, draft steps {steps}: not chosen on this host ({exc})")
        want["steps"], want["outtype"] = steps, outtype
    out = Path(reports) / "kernels"
    kept = {r.wiring: r for r in (reuse.rows if reuse and reuse.settings == want else [])}
    todo = []
    for name in names:
        if name in kept:
            run.rows.append(kept[name])
            run.lines.append(f"{name}: notebook 01's measurement (same pair and settings), not measured "
                             f"twice")
            continue
        draft_dir = _draft_for(name, pair, backend, out, run.lines)
        if draft_dir is None:
            continue
        draft = pair.draft if name == "deployed" else load_draft(draft_dir, target=pair.target, device="cpu")
        plan = pair.served(backend.engine, config=read_draft_config(draft_dir))
        run.lines.append(f"{name:9s} {plan.label:22s} {plan.source}")
        ref = run_bench(pair.target, draft, plan, prompt_ids, steps=steps, max_new_tokens=max_new_tokens,
                        repeats=1, progress=False, label=name)
        todo.append((LiveWiring(name, draft_dir, tuple(plan.layout)), ref))
    if todo:
        rows = backend.bench(wide.path, [w for w, _ in todo], [p.tolist() for p in prompt_ids], steps=steps,
                             max_new_tokens=max_new_tokens, repeats=repeats, log_dir=out / "logs",
                             progress=progress, outtype=str(outtype))
        for row, (_, ref) in zip(rows, todo):
            row.reference = reference_figures(ref)
        run.rows += rows
    order = {n: i for i, n in enumerate(NAMES)}
    run.rows.sort(key=lambda r: order.get(r.wiring, len(order)))
    remember_draft_costs(run.engine, PAIR.name, run.settings, run.rows)
    return run


def _apart_from_choice(st: dict) -> dict:
    return {k: v for k, v in st.items() if k not in ("steps", "outtype")}


@dataclass(frozen=True)
class RegimeChoice:
    """The weight type llama.cpp runs the target in and how many draft tokens a round gets on this host,
    and why: for each weight type tried, the accept length the draft reaches on the layout it was trained on
    (the reference engine, per position) over a verify of k+1 tokens in decode steps (llama.cpp's own
    timings here), for each k; the pair that predicts the most."""

    steps: int
    outtype: str
    engine: str
    decode_ms: float
    acceptance: tuple[float, ...]        # P(draft position i accepted), pooled over the choice's prompts
    options: tuple[dict, ...]            # per k, in the chosen weight type: tau, verify_decodes, predicted
    tried: tuple[dict, ...] = ()         # per weight type tried, in order: its best k and prediction, its
                                         # decode step, or why it could not be measured

    def to_dict(self) -> dict:
        return {"steps": self.steps, "outtype": self.outtype, "engine": self.engine,
                "decode_ms": round(self.decode_ms, 3), "acceptance": [round(a, 3) for a in self.acceptance],
                "options": list(self.options), "tried": list(self.tried),
                "draft_steps_counted": any("draft_decodes" in o for o in self.options)}

    def sentence(self) -> str:
        return choice_sentence(self.to_dict())


def choice_sentence(d: dict) -> str:
    """``RegimeChoice.to_dict`` in words: the weight type and k chosen, what each k predicted, and what the
    other weight types tried predicted or why they could not be measured."""
    best = next(o for o in d["options"] if o["k"] == d["steps"])
    rest = ", ".join(f"k={o['k']} {o['predicted']:.2f}x" for o in d["options"] if o["k"] != d["steps"])
    acc = ", ".join(f"{a:.2f}" for a in d["acceptance"])
    outtype = d.get("outtype", OUTTYPE)
    others = [t for t in d.get("tried", []) if t.get("outtype") != outtype]
    said = "; ".join(f"{t['outtype']} weights {t['predicted']:.2f}x at best (k={t['k']})" if "predicted" in t
                     else f"{t['outtype']} weights passed over ({t['error']})" if t.get("passed_over")
                     else f"{t['outtype']} weights not measured ({t['error']})" for t in others)
    chosen = next((t for t in d.get("tried", []) if t.get("outtype") == outtype), {})
    known = chosen.get("draft_step")
    steps = (f" and a draft step {known['decodes']:.2f} (this host's earlier run, {known['measured']})"
             if known else "")
    when = chosen.get("verify_measured")
    verify = f" (this host's earlier run, {when})" if when else ""
    counted = "" if known else "; draft steps not counted: none measured here yet, the table measures them"
    cost = f"{best['verify_decodes']:.2f} decode steps{verify}{steps}"
    return (f"{outtype} weights and {d['steps']} draft tokens per round, chosen from this host's costs: a "
            f"verify of {d['steps'] + 1} tokens costs {cost} on {d['engine']}, and the draft on the layout "
            f"it was trained on accepts its positions with probability {acc} on the reference engine, so "
            f"k={d['steps']} predicts {best['predicted']:.2f}x "
            f"(accept length {best['tau']:.2f}), the most of any k ({rest}{counted})"
            + (f"; also tried: {said}" if said else ""))


def _curve(found: ServerBuild, wide: Widened, outtype: str, ids: list) -> VerifyCurve:
    """The verify curve of the widened target in ``outtype`` on a baseline ``llama-server`` of its own."""
    tgt = convert(wide.path, outtype=outtype, log=lambda line: None)
    longest = max(int(p.numel()) for p in ids)
    ctx = -(-(longest + max(32, MAX_STEPS + 1) + 64) // 256) * 256
    with LlamacppEngine(found, ServerLaunch(tgt.gguf, None, 1, host_threads(), ctx)) as base:
        return verify_curve(base, [p.tolist() for p in ids], list(range(2, MAX_STEPS + 2)))


def _reason(exc: Exception) -> str:
    """Why a weight type could not be measured, in a clause: the message's first line without the log
    excerpt or path a server's failure carries."""
    line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    line = line.split(" (log: ")[0]
    return line.split(": ")[0] if len(line) > 100 else line


def choose_regime(found: ServerBuild, wide: Widened, pair, prompt_ids, max_new_tokens: int, *,
                  outtypes: tuple[str, ...] = WEIGHT_TYPES, steps: int | None = None,
                  draft_costs: dict[str, dict] | None = None,
                  curves: CurveMemory | None = None) -> RegimeChoice:
    """The weight type (of ``outtypes``, tried in order until one predicts ``ENOUGH``) and round length k
    (1..``MAX_STEPS``, or ``steps`` where given) whose accept length over its verify cost is highest here,
    the first type measured kept unless another predicts ``BETTER`` times as much:
    the verify costs from a baseline ``llama-server`` on the widened target (``costs.verify_curve``), the
    acceptance from the reference engine serving the draft its training layout, k = ``MAX_STEPS``; each
    round's k draft steps counted at the cost an earlier run on this host measured for that weight type
    (``draft_costs``, from ``remembered_draft_costs``), and left out, said, where none did. A weight type
    this build cannot convert or serve is said, and the next tried, as is one whose verify of some n tokens
    costs under one decode step (there a decode runs a slower kernel than a batch, as no real target's
    does, and a useless draft would look fast; a single type in ``outtypes``, the one named, is kept); none
    at all raises ``LlamacppUnavailable``. ``curves``: the verify curves an earlier run on this host
    measured (``CurveMemory``), used instead of measuring again and named where used (one lacking a size
    this choice weighs is measured again); each curve measured here is kept in it."""
    ids = list(prompt_ids[:CHOICE_PROMPTS])
    plan = trained_plan(pair)
    results = [speculative_generate(pair.target, pair.draft, plan, p, max_new_tokens, k=MAX_STEPS)
               for p in ids]
    acc = position_acceptance(results)
    ks = range(1, MAX_STEPS + 1) if steps is None else (steps,)
    tried, measured = [], []
    for outtype in outtypes:
        kept = curves.get(outtype, ids) if curves is not None else None
        if kept is not None and all(n in kept[0].verify for n in range(2, MAX_STEPS + 2)):
            curve, when = kept
        else:
            try:
                curve, when = _curve(found, wide, outtype, ids), None
            except (LlamacppEngineError, LlamacppUnavailable) as exc:
                tried.append({"outtype": outtype, "error": _reason(exc)})
                continue
            if curves is not None:
                curves.put(outtype, ids, curve)
        earlier = {"verify_measured": when} if when else {}
        cheap = min(range(2, MAX_STEPS + 2), key=curve.over_decode)
        # batches faster than one token: not a real target's regime, passed over where there is a choice
        # (a weight type the person named is what they asked to see)
        if curve.over_decode(cheap) < 1.0 and len(outtypes) > 1:
            tried.append(earlier | {"outtype": outtype, "passed_over": True, "error": (
                f"a verify of {cheap} tokens costs {curve.over_decode(cheap):.2f} decode steps, under one: "
                f"this CPU decodes one token on a slower kernel than it verifies a batch, which no real "
                f"target's memory-bound decode does, and a useless draft would look fast")})
            continue
        known = (draft_costs or {}).get(outtype)
        options = steps_options(acc, {k: curve.over_decode(k + 1) for k in ks},
                                known["decodes"] if known else None)
        best = max(options, key=lambda o: (o["predicted"], -o["k"]))
        tried.append(earlier | {"outtype": outtype, "k": best["k"], "predicted": best["predicted"],
                                "decode_ms": round(curve.decode, 3)}
                     | ({"draft_step": known} if known else {}))
        measured.append((best, outtype, curve, options))
        if best["predicted"] >= ENOUGH:
            break
    if not measured:
        raise LlamacppUnavailable("the weight type and round's length could not be chosen: "
                                  + "; ".join(f"{t['outtype']}: {t['error']}" for t in tried))
    first = measured[0][0]["predicted"]
    best, outtype, curve, options = max(measured, key=lambda m: m[0]["predicted"] if m is measured[0] or
                                        m[0]["predicted"] >= BETTER * first else 0.0)
    return RegimeChoice(best["k"], outtype, curve.engine, curve.decode, tuple(acc), tuple(options),
                        tuple(tried))


def steps_options(acceptance, verify_decodes: dict[int, float], draft_decodes: float | None = None
                  ) -> list[dict]:
    """For each k: the accept length a round of k reaches (1 + the acceptance of its first k positions)
    and what that predicts over the round's cost in decode steps: a verify of k+1 tokens, and k draft steps
    of ``draft_decodes`` each where that is known (left out where it is not)."""
    out = []
    for k, over in sorted(verify_decodes.items()):
        tau = 1.0 + sum(acceptance[:k])
        cost = over + k * (draft_decodes or 0.0)
        out.append({"k": k, "tau": round(tau, 3), "verify_decodes": round(over, 3),
                    "predicted": round(tau / cost, 3)}
                   | ({"draft_decodes": round(draft_decodes, 4)} if draft_decodes is not None else {}))
    return out


def _draft_for(name: str, pair, backend: Backend, out: Path, lines: list[str]) -> Path | None:
    """The draft folder each wiring serves: the deployed draft as it ships, fix A the copy ``fixes deploy``
    writes for this build (its rules run on the copy first), fix B the retrained draft."""
    if name == "deployed":
        return Path(pair.draft_dir)
    if name == "fix B":
        retrained = PAIR / "draft-retrained"
        if not retrained.is_dir():
            lines.append(f"fix B: no retrained draft at {retrained}")
            return None
        return retrained
    dest = out / "fix-a"
    shutil.rmtree(dest, ignore_errors=True)
    dep = deploy(pair.draft_dir, dest, [backend.engine], target=pair.target_dir)
    fix = dep.fixes[0]
    if not dep.ok:
        lines.append(f"fix A: {fix.verdict}")
        return None
    lines.append(f"fix A: python -m helpers fixes deploy --draft {pair.draft_dir} --target {pair.target_dir} "
                 f"--engine {backend.engine} --out {dest}: ids {list(fix.ids)} ({fix.key}); {fix.verdict}")
    return fix.folder


# --------------------------------------------------------------------------------------
# The sentences


def regime(run: KernelsRun) -> str:
    """What the target is and why a round costs what it does here, from the first row's own costs."""
    row = next((r for r in run.rows if r.costs), None)
    if row is None:
        return run.target_sentence
    c = row.costs
    per_token = (run.target or {}).get("bytes_per_token")
    rate = (f" ({per_token / c['decode'] / 1e6:.1f} GB/s of weights: a decode step waits on reading them, "
            f"as a large target's does)" if per_token and c["decode"] else "")
    return (f"{run.target_sentence[0].upper()}{run.target_sentence[1:]}; llama.cpp runs it converted to "
            f"{run.settings.get('outtype', OUTTYPE)}. On this CPU it decodes a token in {c['decode']:.1f} ms"
            f"{rate} and verifies {row.steps + 1} in {c['verify']:.1f} ms ({c['verify_over_decode']:.2f} "
            f"decode steps: one read of the weights serves them all); {_draft_step_clause(c, row.steps)}, so "
            f"a round of {row.steps} draft steps breaks even at an accept length of {c['break_even_tau']:.2f}"
            + _sentence(choice_sentence(run.choice) if run.choice else "") + _sentence(short_of_goal(run)))


def _draft_step_clause(c: dict, steps: int) -> str:
    """The draft step's cost, derived as (round - verify) / k; where the round served cost less than the
    verify measured alone, the derivation fails and the clause says so rather than give a negative cost."""
    if c.get("draft_step") is not None and c["draft_step"] >= 0:
        return f"a draft step costs {c['draft_step']:.2f} ms"
    return (f"a draft step's cost cannot be derived here (a round as served, {c['round']:.1f} ms with its "
            f"{steps} draft steps, cost less than the verify of {steps + 1} measured alone: that measurement "
            f"overstates the verify)")


def _sentence(text: str) -> str:
    return f". {text[0].upper()}{text[1:]}" if text else ""


GOAL = 1.5      # the speedup a fix should clear where the host allows it


def short_of_goal(run: KernelsRun, goal: float = GOAL) -> str:
    """Where a fix falls short of ``goal``x, one sentence why, from the run's own costs: the best accept
    length any wiring reached over this host's break-even bounds what a fix can give here. Empty where every
    fix clears it (or none was measured)."""
    fixes = [r for r in run.rows if r.wiring != "deployed" and r.costs and r.costs.get("break_even_tau")]
    short = [r for r in fixes if r.speedup < goal]
    if not short:
        return ""
    best = max(fixes, key=lambda r: r.accept_length)
    c = best.costs
    ceiling = best.accept_length / c["break_even_tau"]
    step = (f" and a draft step {c['draft_step'] / c['decode']:.2f}" if c.get("draft_step") is not None
            and c["draft_step"] >= 0 else "")
    cause = (f"a verify of {best.steps + 1} tokens costs {c['verify_over_decode']:.2f} decode steps{step}, "
             f"so a round of {best.steps} breaks even at {c['break_even_tau']:.2f} tokens")
    names = " and ".join(r.wiring for r in short)
    if ceiling < goal:
        return (f"{names} cannot clear {goal:g}x on this CPU: {cause}, and the best accept length "
                f"measured ({best.accept_length:.2f}, {best.wiring}) predicts at most {ceiling:.2f}x")
    return (f"{names} measured under {goal:g}x here, though {cause} and {best.wiring}'s accept length "
            f"{best.accept_length:.2f} predicts {ceiling:.2f}x: this run's timing fell short of its costs")


def prediction(row: LiveRow) -> float | None:
    """The speedup a round's costs predict for this row's accept length: accept length / break-even."""
    if not row.costs or not row.costs.get("break_even_tau"):
        return None
    return row.accept_length / row.costs["break_even_tau"]


def table(run: KernelsRun) -> list[dict]:
    """One row per wiring, columns in words with units (``tables.words`` renders them)."""
    out = []
    for r in run.rows:
        c = r.costs or {}
        p = prediction(r)
        out.append({"wiring": r.wiring, "layout": r.served_layout, "accept_length": round(r.accept_length, 3),
                    "ref_tau": (r.reference or {}).get("tau"),
                    "decode_ms": c.get("decode"), "verify_ms": c.get("verify"),
                    "verify_decodes": c.get("verify_over_decode"),
                    "draft_step_ms": c.get("draft_step") if (c.get("draft_step") or 0) >= 0 else None,
                    "break_even_tau": c.get("break_even_tau"),
                    "predicted_speedup": None if p is None else round(p, 3),
                    "speedup": round(r.speedup, 3), "speedup_interval": r.speedup_interval,
                    "timing": r.timing_verdict, "lossless": r.lossless})
    return out


def summary_rows(run: KernelsRun | None) -> list[dict]:
    """The chapter's rows in ``reports.Summary.table``'s shape (``reports.kernel_rows``)."""
    return kernel_rows(None if run is None else run.to_dict())


def _ratio(row: LiveRow) -> str:
    """``0.76x [0.72, 0.80] of no speculation``, the side the whole interval lies on, and a timing that is
    not clean."""
    lo, hi = row.speedup_interval
    side = ("slower than" if hi < 1 else "faster than" if lo > 1 else "not separable from")
    flag = "" if row.timing_verdict == "ok" else f", timing {row.timing_verdict}"
    return f"{side} no speculation, {row.speedup:.2f}x [{lo:.2f}, {hi:.2f}]{flag}"


def finding(run: KernelsRun) -> str:
    """The chapter in one sentence: each wiring's speed against no speculation, its accept length and the
    break-even, on llama.cpp's kernels."""
    if run.unavailable or not run.rows:
        return f"Not measured on llama.cpp's kernels: {run.unavailable or 'no wiring could be served'}."
    parts = []
    for r in run.rows:
        be = (r.costs or {}).get("break_even_tau")
        parts.append(f"{r.wiring} {tuple(r.served_layout)} runs {_ratio(r)}, at an accept length of "
                     f"{r.accept_length:.2f}"
                     + (f" against a break-even of {be:.2f}" if be else ""))
    st = run.settings
    where = f"{PAIR.name} x{st.get('widen')} {st.get('outtype')}, {st.get('steps')} draft steps"
    return (f"On the kernels of {run.engine}, at a real target's cost ({where}): " + "; ".join(parts)
            + ".")
