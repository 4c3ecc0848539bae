"""Boundaries, layouts and the id conventions of each system.

Every part of the workbook speaks *boundaries*: boundary ``b`` (0 <= b <= L) is the
residual stream entering decoder layer ``b`` -- boundary 0 is the embedding output and
boundary L the final hidden state before the final norm. Engines and trainers number
layers in their own ways; those numbers are converted here, at the edges, and nowhere
else. A *layout* is the ordered tuple of boundaries concatenated into the draft's ``fc``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import IntEnum, StrEnum
from typing import Iterable, Sequence

from .errors import BadOption

Layout = tuple[int, ...]


class ExitCode(IntEnum):
    """One exit-code convention for every command that judges a wiring: ``check``, ``diagnose`` (a target,
    a dump, an export) and ``fixes deploy``."""

    OK = 0            # served = trained (or a difference that costs nothing measurable)
    PROBLEM = 1       # a problem found: a mismatch, a blocked deployment, a gate failed
    BAD_INPUT = 2     # what was expected, what came; nothing changed
    UNDECIDED = 3     # the evidence cannot decide


class ProblemKind(StrEnum):
    """What a resolver found, as data: callers group, filter and fix by kind, never by reading a
    message back (issue #29). Values are the spellings JSON outputs carry."""

    # errors: the engine cannot serve the ids as given
    NO_MODEL_CLASS = "no-model-class"          # the release registers no model class for the target
    DRAFT_CLASS = "draft-class"                # the release builds no draft class for the draft's config
    SOURCE_UNAVAILABLE = "source-unavailable"  # the release's source could not be fetched or cached
    NO_CAPTURE = "no-capture"                  # the release cannot turn EAGLE-3 capture on for the target
    CAPTURE_UNREAD = "capture-unread"          # the setter chain or capture site could not be read
    SETTER_RAISES = "setter-raises"            # the release's own setter raises: loading the model fails
    NOT_BOUNDARIES = "not-boundaries"          # the captured features are not residual-stream boundaries
    NEVER_CAPTURED = "never-captured"          # an index the capture loop never reaches: a feature dropped
    FEATURE_COUNT = "feature-count"            # fewer features concatenated than the fc has slots
    REPEATED = "repeated"                      # ids repeat a boundary
    NEGATIVE_ID = "negative-id"                # an id below 0, which names no boundary
    WRONG_LAYER = "wrong-layer"                # a negative index that Python reads as another layer
    BOUNDARY0_RESIDUAL_NONE = "boundary0-residual-none"   # boundary 0 adds a residual that is still None
    BOUNDARY0_UNVERIFIED = "boundary0-unverified"         # boundary 0 with a capture style not recognised
    AUX_OFF = "aux-off"                        # the draft turns aux hidden-state capture off
    POST_NORM_STATE = "post-norm-state"        # TensorRT-LLM's -1: the state after the final norm
    ID_COUNT = "id-count"                      # the engine takes a fixed number of ids (llama.cpp: 3)
    LAYER_INPUT_MISSING = "layer-input-missing"   # llama.cpp aborts: no such layer input tensor
    # warnings: it serves, but otherwise than the config says, or on an assumption
    IDS_IGNORED = "ids-ignored"                # the draft's ids never reach the engine: defaults served
    SETTER_TAKES_NO_IDS = "setter-takes-no-ids"   # SGLang: the release's setter has no ids parameter
    IDS_READ = "ids-read"                      # how the ids were read (key, fallback, format of the draft)
    DRAFT_FORMAT = "draft-format"              # a draft format or forward flag the engine handles otherwise
    STUB_PLACEHOLDERS = "stub-placeholders"    # the setter's stub supplied placeholders
    RULE_ASSUMED = "rule-assumed"              # a release, class or build not read: a neighbour's rule
    NEWER_THAN_READ = "newer-than-read"        # a release newer than those read: the newest rule assumed
    RULE_NOT_RUN = "rule-not-run"              # the rule is recorded from docs or sources, not run
    SOURCE_CHECKED = "source-checked"          # the rule checked against the release's own files: it holds
    SOURCE_DISAGREES = "source-disagrees"      # the release's own files disagree with the recorded rule
    # check's own findings, from the deployment's files (``investigation.gate``)
    LAYOUT_MISMATCH = "layout-mismatch"        # the engine serves other boundaries than training's
    TRAINING_UNKNOWN = "training-unknown"      # nothing states the training layout
    ENGINE_CANNOT_CAPTURE = "engine-cannot-capture"   # a resolver's blocking problem, as check reports it
    FC_WIDTH = "fc-width"                      # the fc's input width is not the features the ids give
    IDS_KEY = "ids-key"                        # the ids sit where this engine does not read them
    IDS_MISSING = "ids-missing"                # no ids where this engine reads them: its default is served
    SPECULATORS_FORMAT = "speculators-format"  # a speculators-format draft this engine does not load
    TRAINER = "trainer"                        # the named trainer's rule cannot be run on these ids
    ALGORITHM = "algorithm"                    # the draft is not an EAGLE-3 draft
    CONFIG_VS_TRAINER = "config-vs-trainer"    # the config's ids and the trainer's rule disagree
    RECORD_VS_TRAINER = "record-vs-trainer"    # the training record and the trainer's rule disagree
    MEASURED_DIFFERS = "measured-differs"      # what the engine captured is not what its rule predicts
    TOPOLOGY = "topology"                      # tensor or pipeline parallel sizes the target cannot take
    VOCAB = "vocab"                            # the draft's vocabulary does not fit the target's
    # forward flags the draft was trained with that the engine never runs (``rules.flags``)
    NORM_BEFORE_RESIDUAL = "norm-before-residual"
    NORM_BEFORE_FC = "norm-before-fc"
    FC_NORM = "fc-norm"
    NORM_OUTPUT = "norm-output"
    OTHER = "other"


@dataclass(frozen=True)
class Problem:
    """One finding: its ``kind`` (a :class:`ProblemKind`: a resolver's, or one of ``check``'s own), the
    sentence for people, and ``fix``: what to do, or None. A resolver's fix is a command to run (the
    boundary-0 patch); ``check``'s own problems carry an instruction.

    ``advice`` is extra text shown in parentheses after the message (the patch's advice for a boundary-0
    capture); ``str()`` is the sentence as it has always been printed. ``blocking`` False: a warning."""

    kind: str
    message: str
    fix: str | None = None
    blocking: bool = True
    advice: str = ""

    def __str__(self) -> str:
        return f"{self.message} ({self.advice})" if self.advice else self.message


def error(kind: ProblemKind, message: str, fix: str | None = None) -> Problem:
    return Problem(kind, message, fix)


def warning(kind: ProblemKind, message: str) -> Problem:
    return Problem(kind, message, blocking=False)


class WiringError(BadOption):
    """A layout, id list or boundary that cannot mean what was asked of it. ``kind`` says which, where a
    caller tells them apart (a release without the target's model class: ``NO_MODEL_CLASS``)."""

    def __init__(self, message: str = "", kind: ProblemKind = ProblemKind.OTHER):
        super().__init__(message)
        self.kind = kind


def check_boundary(b: int, num_layers: int) -> int:
    if not isinstance(b, int) or isinstance(b, bool):
        raise WiringError(f"boundary must be an int, got {b!r}")
    if not 0 <= b <= num_layers:
        raise WiringError(
            f"boundary {b} is outside 0..{num_layers} for a target with {num_layers} layers "
            f"(0 = embedding output, {num_layers} = final state before the norm)"
        )
    return b


def check_layout(layout: Iterable[int], num_layers: int, width: int | None = None) -> Layout:
    out = tuple(int(b) for b in layout)
    for b in out:
        check_boundary(b, num_layers)
    if width is not None and len(out) != width:
        raise WiringError(f"layout {out} has {len(out)} slots; the draft's fc expects {width}")
    return out


def parse_layout(text: str | Sequence[int]) -> Layout:
    """'0,3,7', '0 3 7', '(0, 3, 7)' or a sequence -> (0, 3, 7)."""
    if isinstance(text, str):
        parts = [p for p in text.replace("(", " ").replace(")", " ").replace(",", " ").split() if p]
        try:
            return tuple(int(p) for p in parts)
        except ValueError:
            raise WiringError(f"cannot read a layout from {text!r}; expected integers like '0,3,7'") from None
    return tuple(int(b) for b in text)


def boundary_label(b: int, num_layers: int) -> str:
    """Human label: 'embed' for 0, 'final' for L, 'b{n}' otherwise."""
    if b == 0:
        return "embed"
    if b == num_layers:
        return "final"
    return f"b{b}"


def layout_label(layout: Sequence[int], num_layers: int) -> str:
    return "(" + ", ".join(boundary_label(b, num_layers) for b in layout) + ")"


def capture_name(b: int) -> str:
    """The one name used for a capture point everywhere (hooks, caches, tables)."""
    return f"resid.{b}"


class HasProblems:
    """``errors``, ``warnings`` and ``kinds`` of a result, rendered from its ``problems``: the sentences are
    for people, never parsed back. ``_seq`` is the container the result has always returned."""

    _seq = list

    @property
    def errors(self):
        return self._seq(str(p) for p in self.problems if p.blocking)

    @property
    def warnings(self):
        return self._seq(str(p) for p in self.problems if not p.blocking)

    def kinds(self) -> set[str]:
        """The kinds of the blocking problems."""
        return {p.kind for p in self.problems if p.blocking}


@dataclass(frozen=True)
class CapturePlan(HasProblems):
    """Which boundaries are captured and how they are concatenated for the draft.

    ``layout`` is the order of the concatenation; ``verifier`` the boundary whose state
    gives the target's own next-token distribution (always L for a real engine). This is
    the object the reference engine, the isolated test and the reports share.
    """

    layout: Layout
    num_layers: int
    source: str = ""
    notes: tuple[str, ...] = field(default=())
    # blocking: why the engine cannot capture this layout at all; advisory: what it silently does
    # differently (ignored ids, flags)
    problems: tuple[Problem, ...] = field(default=())

    _seq = tuple

    def __post_init__(self):
        check_layout(self.layout, self.num_layers)

    @property
    def boundaries(self) -> Layout:
        """Every boundary a forward pass must capture (layout plus the verifier state)."""
        return tuple(sorted(set(self.layout) | {self.num_layers}))

    @property
    def label(self) -> str:
        return layout_label(self.layout, self.num_layers)

    def to_dict(self) -> dict:
        return {"layout": list(self.layout), "num_layers": self.num_layers, "source": self.source,
                "label": self.label, "notes": list(self.notes), "errors": list(self.errors),
                "warnings": list(self.warnings), "problems": [asdict(p) for p in self.problems]}


@dataclass
class WiringResult(HasProblems):
    """What one engine release will feed the draft's fc for one target, and whether it can at all.

    ``problems`` are typed (:class:`Problem`): blocking ones mean the deployment fails (or drops
    features), advisory ones that it silently differs from what the config says; ``errors`` and
    ``warnings`` are their sentences. ``hazards`` locate errors a caller can act on (today: boundary 0
    meeting ``residual = None``: arch and file), so advice is attached where it is known.
    """

    engine: str
    version: str | None
    arch: str
    num_layers: int
    served_layout: Layout
    layers_to_capture: list[int]
    ids_used: list[int] | None
    ids_source: str
    problems: list[Problem] = field(default_factory=list)
    source_lines: list[dict] = field(default_factory=list)
    hazards: list[dict] = field(default_factory=list)


    @property
    def capturable(self) -> bool:
        return not self.errors

    @property
    def rule_basis(self) -> str:
        """How the engine's rule was had: its release's own code run or read now, or a recorded rule (a
        cache of what was read from its releases), as on an air-gapped host."""
        kinds = {p.kind for p in self.problems}
        read = ProblemKind.RULE_NOT_RUN not in kinds and (bool(self.source_lines)
                                                          or ProblemKind.SOURCE_CHECKED in kinds)
        return "read from the release now" if read else "recorded, not read now"

    @property
    def label(self) -> str:
        return layout_label(self.served_layout, self.num_layers)

    def plan(self) -> CapturePlan:
        """The served layout as the plan the reference engine and the reports share."""
        source = (f"{self.engine} {self.arch}: ids {self.ids_used} ({self.ids_source}) -> "
                  f"layers_to_capture {self.layers_to_capture} -> served {self.served_layout}")
        return CapturePlan(self.served_layout, self.num_layers, source, problems=tuple(self.problems))

    def to_dict(self) -> dict:
        d = {}
        for k, v in asdict(self).items():   # errors and warnings where they always were, problems last
            if k == "problems":
                d.update(errors=self.errors, warnings=self.warnings)
            else:
                d[k] = v
        d["problems"] = [asdict(p) for p in self.problems]
        d["served_layout"] = list(self.served_layout)
        d["ids_source"] = str(self.ids_source)
        d["capturable"] = self.capturable
        d["label"] = self.label
        return d
