"""A target and its draft, loaded together, and the capture plans that matter for them.

Two plans drive the whole investigation: the *served* plan (what the engine will feed the
draft, resolved from the engine's own source by ``wiring``) and the *trained* plan (what
the draft's ``fc`` learned, from its training record or, failing that, inferred by the
layout search). Everything downstream compares the two.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from ..boundaries import CapturePlan, WiringError, check_layout, parse_layout
from ..errors import BadOption, read_text_file
from ..model.checkpoint import load_draft, read_training_record
from ..model.draft import Eagle3Draft
from ..model.target import load_target
from ..rules.conventions import DEFAULT_ENGINE, Engine, read_draft_config
from ..rules.wiring import served_plan
from .evaluate import EvalInputError, EvalText, TargetCaptures, attach_draft_probs, capture_text
from .layout_search import search
from .prompts import read_prompts  # noqa: F401  (notebooks read prompts through the pair module)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DIR = REPO / "data" / "tiny-kimi"
# Draft tokens per verify step. Acceptance decays geometrically along the chain, so past ~8 a
# step almost never pays; 16 leaves room to show that, while a typo (100000000) would ask the
# draft KV cache for hundreds of GB before anything ran.
MAX_STEPS = 16
# the engines a benchmark can run on: bench --backend, BACKEND
BACKENDS = ("reference", "vllm", "sglang", "llamacpp")


@dataclass
class Pair:
    target: torch.nn.Module
    tokenizer: object
    draft: Eagle3Draft
    target_dir: Path
    draft_dir: Path
    draft_config: dict
    record: dict | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def num_layers(self) -> int:
        return self.target.config.num_hidden_layers

    @property
    def arch(self) -> str:
        return (self.target.config.architectures or [type(self.target).__name__])[0]

    def served(self, engine: Engine = DEFAULT_ENGINE, config: dict | None = None, root=None) -> CapturePlan:
        """The layout ``engine`` will feed this draft, from its own source (``root``: a specific
        tree, e.g. a patched copy; ``config``: a rewritten draft config, e.g. fixed ids)."""
        return served_plan(self.draft_config if config is None else config, self.num_layers, self.arch,
                           engine, root=root)

    @property
    def recorded_layout(self) -> tuple[int, ...] | None:
        if self.record and self.record.get("training_boundaries") is not None:
            return tuple(self.record["training_boundaries"])
        return None


def check_steps(steps, what: str = "--steps") -> int:
    """Draft steps within 1..MAX_STEPS, refused before any model loads."""
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= MAX_STEPS:
        raise BadOption(f"{what} must be an integer from 1 to {MAX_STEPS} (draft tokens per verify step; "
                        f"acceptance beyond a few steps is negligible), got {steps!r}")
    return steps


def check_device(device: str) -> str:
    """Fail before any model loads, naming what this machine has."""
    try:
        torch.device(str(device))
    except (RuntimeError, ValueError, TypeError):
        raise BadOption(f"device {device!r} is not a torch device; expected cpu, cuda, cuda:N or "
                        f"mps") from None
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise BadOption(f"device {device!r} requested but this torch build sees no CUDA device "
                         f"(torch {torch.__version__}); use --device cpu")
    if str(device).startswith("mps") and not torch.backends.mps.is_available():
        raise BadOption(f"device {device!r} requested but MPS is not available here; use --device cpu")
    return device


def load_pair(target_dir=None, draft_dir=None, device: str = "cpu") -> Pair:
    """A target with its draft. Given a target but no draft, the draft is looked for beside the
    target (``<target>/../draft``, the layout ``build-default`` writes): pairing a user's target
    with the embedded default draft would only fail later with a confusing size mismatch."""
    check_device(device)
    if target_dir is not None and draft_dir is None:
        beside = Path(target_dir).parent / "draft"
        if not (beside / "config.json").is_file():
            raise FileNotFoundError(f"a target was given ({target_dir}) but no draft, and there is no draft "
                                    f"beside it at {beside}: pass the draft directory too (--draft / DRAFT)")
        draft_dir = beside
    target_dir = Path(target_dir or DEFAULT_DIR / "target")
    draft_dir = Path(draft_dir or DEFAULT_DIR / "draft")
    target, tok = load_target(target_dir, device)
    draft = load_draft(draft_dir, target=target, device=device)
    try:
        record = read_training_record(draft_dir)
    except ValueError as exc:  # json.JSONDecodeError is a ValueError
        raise ValueError(f"{draft_dir / 'training.json'} is not valid JSON: {exc}") from None
    return Pair(target, tok, draft, target_dir, draft_dir, read_draft_config(draft_dir), record)


def fit_prompts(pair: Pair, prompt_ids: list[torch.Tensor], max_new_tokens: int, steps: int,
                truncate: bool = False, where: str = "prompts") -> tuple[list[torch.Tensor], list[str]]:
    """Prompts that fit the target's positions with room to generate, checked before any work.

    A prompt of P tokens generating N with k draft steps runs the target at positions up to
    P + N + k (the last verify covers k+1 tokens). Past ``max_position_embeddings`` a rotary
    model extrapolates into positions it never saw and the memory for attention grows with the
    square of the length, so an oversized prompt is refused with its number and size; with
    ``truncate`` it keeps its last tokens (the part next to the continuation) and a note says so.
    """
    limit = getattr(pair.target.config, "max_position_embeddings", None)
    if not limit:
        return prompt_ids, []
    room = limit - max_new_tokens - steps
    if room < 1:
        raise BadOption(f"--max-new-tokens {max_new_tokens} + --steps {steps} leaves no room for a prompt in "
                        f"the target's {limit} positions (max_position_embeddings); expected at most "
                        f"{limit - steps - 1} new tokens")
    too_long = [(i, int(t.numel())) for i, t in enumerate(prompt_ids) if t.numel() > room]
    if not too_long:
        return prompt_ids, []
    if not truncate:
        i, n = max(too_long, key=lambda x: x[1])
        raise BadOption(f"{where}: prompt {i + 1} is {n} tokens; with --max-new-tokens {max_new_tokens} and "
                        f"--steps {steps} it needs {n + max_new_tokens + steps} positions, the target has "
                        f"{limit} (max_position_embeddings); {len(too_long)} prompt(s) too long. Shorten "
                        f"them, lower --max-new-tokens, or pass --truncate-prompts to keep each prompt's "
                        f"last {room} tokens")
    note = (f"{len(too_long)} prompt(s) truncated to their last {room} tokens to fit {limit} positions "
            f"(--truncate-prompts)")
    return [t[-room:] if t.numel() > room else t for t in prompt_ids], [note]


def default_prompts(pair: Pair) -> Path:
    for d in (pair.target_dir.parent, DEFAULT_DIR):
        if (d / "prompts.jsonl").is_file():
            return d / "prompts.jsonl"
    raise FileNotFoundError("no prompts.jsonl beside the target; pass a prompts file")


def default_text(pair: Pair) -> Path:
    for d in (pair.target_dir.parent, DEFAULT_DIR):
        if (d / "heldout.txt").is_file():
            return d / "heldout.txt"
    raise FileNotFoundError("no heldout.txt beside the target; pass a text file")


# what a diagnosis says when it falls back on the embedded pair's text: it is not the user's domain
EMBEDDED_TEXT = "the workbook's embedded held-out text, not your target's domain: pass your own with --text"


def eval_text(pair: Pair, path: Path | None = None) -> tuple[str, str, str]:
    """The text to evaluate on, where it is and why it was chosen: ``path`` (the user's), else a
    ``heldout.txt`` beside the target, else the embedded pair's (said as such)."""
    if path is not None:
        return read_text_file(path, "text file"), str(path), "--text"
    found = default_text(pair)
    origin = "beside the target" if found.parent == pair.target_dir.parent else EMBEDDED_TEXT
    return read_text_file(found, "held-out text"), str(found), origin


def _windows_of(ids, window: int, max_windows: int, min_windows: int = 2) -> torch.Tensor:
    n = min(len(ids) // window, max_windows)
    if n < min_windows:
        raise EvalInputError(f"text gives {len(ids)} tokens; need at least {min_windows * window} "
                             f"({min_windows} windows of {window}) to evaluate a draft")
    return torch.tensor(list(ids[: n * window]), dtype=torch.long).view(n, window)


def text_windows(tokenizer, text: str, window: int = 256, max_windows: int = 12,
                 min_windows: int = 2) -> torch.Tensor:
    return _windows_of(tokenizer(text, verbose=False)["input_ids"], window, max_windows, min_windows)


def _capture(pair: Pair, windows: torch.Tensor, progress: bool) -> TargetCaptures:
    caps = capture_text(pair.target, windows.to(pair.target.device), progress=progress)
    attach_draft_probs(pair.target, caps, pair.draft.draft_token_ids)
    return caps


def eval_captures(pair: Pair, text: str | None = None, window: int = 256, max_windows: int = 12,
                  progress: bool = False, *, where: str | None = None,
                  origin: str = "given") -> TargetCaptures:
    """Every boundary captured once on held-out text, with the target's draft-vocab distribution; the
    captures say which text (``where``, ``origin``; without ``text``, ``eval_text``'s choice) and how much."""
    if text is None:
        text, where, origin = eval_text(pair)
    ids = pair.tokenizer(text, verbose=False)["input_ids"]
    caps = _capture(pair, _windows_of(ids, window, max_windows), progress)
    caps.text = EvalText(where, origin, len(ids), window, caps.input_ids.shape[0], tuple(ids))
    return caps


def more_captures(pair: Pair, caps: TargetCaptures, windows: int, progress: bool = False) -> TargetCaptures:
    """``caps`` grown to ``windows`` windows of the same text (as many as it holds), capturing only the
    new ones."""
    t = caps.text
    if t is None:
        raise ValueError("these captures do not say which text they were taken on")
    n = min(windows, t.available)
    if n <= t.windows:
        return caps
    new = torch.tensor(list(t.ids[t.windows * t.window: n * t.window]), dtype=torch.long).view(-1, t.window)
    return caps.extended(_capture(pair, new, progress), replace(t, windows=n))


def plan_problems(pair: Pair, plan: CapturePlan) -> list[str]:
    """Why this plan cannot feed this draft at all (empty when it can): the engine's own wiring
    errors, or a feature count the draft's fc does not take. Such a deployment does not serve
    badly, it fails, so the notebooks report it instead of benchmarking it."""
    problems = list(plan.errors)
    if not problems and len(plan.layout) != pair.draft.cfg.num_aux:
        problems.append(f"{plan.source} feeds {len(plan.layout)} features {plan.layout}; the draft's fc "
                        f"takes {pair.draft.cfg.num_aux} ({pair.draft.cfg.fc_in} wide)")
    return problems


def trained_plan(pair: Pair, caps: TargetCaptures | None = None) -> CapturePlan:
    """From the training record; without one, the layout search's best guess (and it says so)."""
    if pair.recorded_layout is not None:
        where = pair.draft_dir / "training.json"
        try:
            layout = check_layout(pair.recorded_layout, pair.num_layers, pair.draft.cfg.num_aux)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where}: training_boundaries {list(pair.recorded_layout)} do not fit this "
                             f"pair: {exc}") from None
        return CapturePlan(layout, pair.num_layers, "training record")
    if caps is None:
        raise EvalInputError("the draft has no training record (training.json with training_boundaries), so "
                             "the training layout must be inferred from captures; or state it (--layout "
                             "a,b,c / TRAINING_LAYOUT)")
    res = search(pair.draft, caps, progress=False)
    return CapturePlan(res.best, pair.num_layers, "inferred by layout search",
                       (f"margin {res.margin:.3f} accepted tokens per verify step over the runner-up, "
                        f"z={res.z}",))


def plan_for(pair: Pair, which: str, engine: Engine = DEFAULT_ENGINE, caps=None) -> CapturePlan:
    """'served', 'trained' or an explicit 'a,b,c'."""
    if which == "served":
        return pair.served(engine)
    if which == "trained":
        if pair.recorded_layout is None and caps is None:
            caps = eval_captures(pair)  # no record: infer the layout from held-out text
        return trained_plan(pair, caps)
    layout = check_layout(parse_layout(which), pair.num_layers, pair.draft.cfg.num_aux)
    if len(set(layout)) != len(layout):
        dup = ", ".join(str(b) for b in sorted({b for b in layout if layout.count(b) > 1}))
        raise WiringError(f"layout {layout} repeats a boundary ({dup}); expected {pair.draft.cfg.num_aux} "
                          f"distinct boundaries in 0..{pair.num_layers} (each fc slot takes a different one)")
    return CapturePlan(layout, pair.num_layers, "explicit")
