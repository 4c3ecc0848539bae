"""TensorRT-LLM's rule, read from its own code (docs/conventions.md, "TensorRT-LLM").

TensorRT-LLM takes the capture ids from its speculative config only (``eagle3_layers_to_capture`` of the
options a user launches ``trtllm-serve --extra_llm_api_options FILE`` or the LLM API with), never from
the draft's config.json. Layer k's capture is its output, so id k is boundary k + 1; with no ids the
release captures ``(1, N//2-1, N-4)``; given ids are sorted; ``-1`` is the state after the final norm,
which lands first in the concatenation in one-model mode (the plain sort) and last in two-model mode (the
sort, then -1 moved to the end). Nothing checks the range: an id at or beyond N matches no layer, so its
slot of the capture buffer (allocated uninitialised) is never written.

``RECORDED`` is a cache of what was read, each fact with the file and line it was read from (the stored
copy of the public repository at ``RECORDED_COMMIT``); ``engines.trtllm.source`` reads the same facts
from a release's wheel at run time where the index serves it, and says when they disagree.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ...boundaries import Problem, ProblemKind, WiringError, WiringResult, error, warning
from ...rules.conventions import DraftIds, IdsAt, config_ids
from .options import IDS_KEY, TrtllmOptions

K = ProblemKind

RECORDED_COMMIT = "f933a608045a46426792263617475b359d568043"   # the stored copy eagle3.py was read at
EAGLE3 = "tensorrt_llm/_torch/speculative/eagle3.py"
LLM_ARGS = "tensorrt_llm/llmapi/llm_args.py"
# What was read, and where (the file's own line numbers at RECORDED_COMMIT; llm_args.py by its class and
# field, its stored copy read by offset, not by line).
RECORDED: dict[str, dict] = {
    "default_two_model": {"file": EAGLE3, "line": 136, "text": "two-model capture: no ids -> layers "
                          "(1, N//2-1, N-4); fewer than 6 layers raise (line 133)"},
    "sort_two_model": {"file": EAGLE3, "line": 139, "text": "two-model capture: given ids sorted"},
    "minus_one_last": {"file": EAGLE3, "line": 140, "text": "two-model capture: a leading -1 moved to the "
                       "end (lines 140-143)"},
    "default_one_model": {"file": EAGLE3, "line": 256, "text": "one-model capture: no ids -> layers "
                          "(1, N//2-1, N-4); fewer than 6 layers raise (line 252)"},
    "sort_one_model": {"file": EAGLE3, "line": 259, "text": "one-model capture: given ids sorted, -1 "
                       "stays first"},
    "buffer_two_model": {"file": EAGLE3, "line": 53, "text": "two-model buffer: torch.empty, hidden_size x "
                         "number of ids (uninitialised)"},
    "buffer_one_model": {"file": EAGLE3, "line": 261, "text": "one-model buffer: torch.empty, hidden_size x "
                         "number of ids (uninitialised)"},
    "write_two_model": {"file": EAGLE3, "line": 215, "text": "a slot is written only when a layer's id "
                        "equals the listed id (no range check anywhere)"},
    "write_one_model": {"file": EAGLE3, "line": 298, "text": "a slot is written only when a layer's id "
                        "equals the listed id (no range check anywhere)"},
    "options": {"file": LLM_ARGS, "line": None, "text": "EagleDecodingConfig: eagle3_layers_to_capture "
                "Optional[Set[int]] = None, eagle3_one_model = True; Eagle3DecodingConfig decoding_type "
                "'Eagle3'; validate_eagle_config checks no range; SaveHiddenStatesDecodingConfig calls -1 "
                "the final post-norm hidden state"},
}
DEFAULT = "(1, N//2-1, N-4)"
NO_OPTIONS = (f"no launch options given: TensorRT-LLM serves its default {DEFAULT} whatever the draft's "
              f"config.json says")


def recorded_lines() -> list[dict]:
    return [dict(v, commit=RECORDED_COMMIT if v["file"] == EAGLE3 else None, fact=k)
            for k, v in RECORDED.items()]


def cite(fact: str) -> str:
    r = RECORDED[fact]
    return f"{r['file'].split('/')[-1]}:{r['line']}" if r["line"] else r["file"].split("/")[-1]


def ids_trtllm_reads(cfg: dict) -> DraftIds:
    """TensorRT-LLM reads no ids from the draft's config: a key there is ignored, and said."""
    _, inner, top = config_ids(cfg)
    warnings: list[Problem] = []
    if top is not None or inner is not None:
        warnings.append(warning(K.IDS_IGNORED, f"TensorRT-LLM ignores the draft's config.json ids "
                                f"{inner if inner is not None else top}: it takes {IDS_KEY} from its "
                                f"speculative config (the launch options), never from the draft"))
    return DraftIds(None, IdsAt.NONE, warnings)


@dataclass(frozen=True)
class Capture:
    """What TensorRT-LLM does with a list of ids on an N-layer target: the capture order (its
    ``layers_to_capture``), the boundary each slot carries (None: never written), and the mode."""

    order: tuple[int, ...]
    slots: tuple[int | None, ...]
    one_model: bool

    @property
    def served(self) -> tuple[int, ...]:
        return tuple(b for b in self.slots if b is not None)

    @property
    def unwritten(self) -> list[tuple[int, int]]:
        """(slot number from 1, id) for every slot no layer writes."""
        return [(i + 1, k) for i, (k, b) in enumerate(zip(self.order, self.slots)) if b is None]


def capture(ids: Sequence[int] | None, num_layers: int, one_model: bool = True) -> Capture:
    """The release's handling of ``ids`` (None: its default), as read (``RECORDED``)."""
    n = num_layers
    if ids is None:
        order = [1, n // 2 - 1, n - 4]
    else:
        order = sorted(set(ids))                   # a Set in the options, then sorted
        if not one_model and order[0] == -1:
            order = order[1:] + [-1]               # two-model: -1 goes last
    slots = tuple(n if k == -1 else k + 1 if 0 <= k < n else None for k in order)
    return Capture(tuple(order), slots, one_model)


def _ids_problems(ids: Sequence[int], cap: Capture, n: int) -> list[Problem]:
    out: list[Problem] = []
    if len(set(ids)) != len(ids):
        out.append(error(K.REPEATED, f"ids {list(ids)} repeat a layer: {IDS_KEY} is a set, so TensorRT-LLM "
                                     f"captures {len(cap.order)} states for the fc's {len(ids)} slots"))
    if cap.unwritten:
        where = ", ".join(f"slot {s} of {len(cap.order)} (id {k})" for s, k in cap.unwritten)
        out.append(error(K.NEVER_CAPTURED, f"ids {[k for _, k in cap.unwritten]} name no layer of this "
                         f"{n}-layer target (0..{n - 1}, or -1): TensorRT-LLM checks no range, no layer "
                         f"writes {where}, and the capture buffer is allocated uninitialised "
                         f"({cite('buffer_one_model' if cap.one_model else 'buffer_two_model')}), so the "
                         f"draft's fc reads uninitialised memory there; list ids below {n} in {IDS_KEY}"))
    if -1 in cap.order:
        pos = "first" if cap.one_model else "last"
        out.append(warning(K.POST_NORM_STATE, f"id -1 is the final state after the norm, {pos} in the "
                           f"concatenation ({'one' if cap.one_model else 'two'}-model mode, "
                           f"{cite('sort_one_model' if cap.one_model else 'minus_one_last')}): served as "
                           f"boundary {n}, but post-norm; a draft trained on boundary {n} before the norm "
                           f"would see a different state"))
    return out


def _chosen(ids, cfg, options: TrtllmOptions | None) -> tuple[list[int] | None, str, list[Problem]]:
    """The ids TensorRT-LLM is launched with, where they come from, and notes on the draft's own ids."""
    notes: list[Problem] = []
    if options is not None and ids is not None:
        raise WiringError("give either explicit ids or TensorRT-LLM launch options, not both")
    if options is not None:
        found = list(options.ids) if options.ids is not None else None
        source = f"{IDS_KEY} in {options.path}" if found is not None else \
            f"{options.path} (no {IDS_KEY}: the release's default {DEFAULT})"
    elif ids is not None:
        found, source = list(ids), IdsAt.EXPLICIT.value
    else:
        found, source = None, "TensorRT-LLM's default (no launch options)"
        notes.append(warning(K.IDS_READ, NO_OPTIONS))
    if cfg is not None:
        _, inner, top = config_ids(cfg)
        own = inner if inner is not None else top
        if own is not None and (found is None or sorted(own) != sorted(found)):
            notes.append(warning(K.IDS_IGNORED, f"TensorRT-LLM ignores the draft's config.json ids {own}: it "
                                 f"takes {IDS_KEY} from its launch options' speculative config only"))
    return found, source, notes


def resolve_trtllm(version: str | None, arch: str, num_layers: int, ids: Sequence[int] | None,
                   cfg: dict | None, options: TrtllmOptions | None = None, read=None,
                   why: str = "") -> WiringResult:
    """TensorRT-LLM serving ``ids`` (or its launch ``options``' ids, else its default) on an
    ``num_layers``-layer target. ``read``: the release's own files checked now (``source.ReadRelease``);
    None: the recorded rule judges, and says so."""
    n = num_layers
    for k in ids or []:
        if isinstance(k, bool) or not isinstance(k, int):
            raise WiringError(f"layer ids must be integers, got {k!r}")
    if ids is not None and not list(ids):
        raise WiringError("the id list is empty")
    found, source, notes = _chosen(ids, cfg, options)
    one_model = options.one_model if options is not None else True
    cap = capture(found, n, one_model)
    problems = _ids_problems(found, cap, n) if found is not None else []
    if found is None and n <= 5:
        problems.append(error(K.NO_CAPTURE, f"TensorRT-LLM raises for its default capture on a {n}-layer "
                              f"target (fewer than 6 layers, {cite('default_one_model')})",
                              f"list {IDS_KEY} in the launch options"))
        cap = Capture((), (), one_model)
    lines = read.lines if read is not None else recorded_lines()
    basis = read.problems if read is not None else [warning(
        K.RULE_NOT_RUN, f"TensorRT-LLM's rule as recorded from its source ({EAGLE3} at "
        f"{RECORDED_COMMIT[:10]}); not read from this release now" + (f" ({why[:200]})" if why else ""))]
    return WiringResult(engine="trtllm" + (f"=={version}" if version else ""), version=version, arch=arch,
                        num_layers=n, served_layout=cap.served, layers_to_capture=list(cap.order),
                        ids_used=found, ids_source=source, problems=problems + notes + basis,
                        source_lines=lines)
