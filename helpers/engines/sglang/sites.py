"""What the inspector finds in a version's source: setter sites, the capture site, cited lines."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum

from .classes import parse_file

SETTER = "set_eagle3_layers_to_capture"

# --------------------------------------------------------------------------------------
# What the inspector returns.


@dataclass
class SourceLine:
    """One line of engine source, cited by its path inside the distribution."""

    file: str
    line: int
    text: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SetterSite:
    """A ``set_eagle3_layers_to_capture`` definition on the path from the architecture."""

    cls: str
    file: str
    path: str
    line: int
    end_line: int
    source: str
    delegates_to: str | None = None  # "language_model" when it hands the ids on
    last_rank_only: bool = False  # returns early unless pp_group.is_last_rank


class CaptureStyle(StrEnum):
    """How a forward loop captures a feature; see :class:`CaptureSite`."""

    INLINE_ADD = "inline-add"
    INLINE_GUARDED = "inline-guarded"
    INLINE_HIDDEN_ONLY = "inline-hidden-only"
    DELEGATED = "delegated"
    UNKNOWN = "unknown"


@dataclass
class CaptureSite:
    """Where the forward loop of the model class appends to the aux hidden states.

    ``style`` is ``inline-add`` (the loop itself evaluates ``hidden_states + residual``,
    unguarded at i == 0), ``inline-guarded`` (same, but the missing residual is handled),
    ``inline-hidden-only`` (the loop appends ``hidden_states`` alone while the layers hand
    the residual back separately, so past layer 0 the feature is one layer's output branch,
    not a boundary), ``delegated`` (the loop hands a collector to the layer, whose boundary
    code captures the residual stream itself) or ``unknown``.

    Which layers capture is decided either by the loop index (``i in self.layers_to_capture``)
    or, in the Qwen-MoE family, by a per-layer attribute that the setter sets
    (``setattr(self.layers[k], "_is_layer_to_capture", True)``); ``flag`` names that
    attribute, and then ``self.layers[k]`` indexing, negative k included, decides the boundary.
    """

    cls: str
    file: str
    path: str
    line: int
    end_line: int
    source: str
    style: CaptureStyle
    loop_line: int
    loop_text: str
    loop_range: tuple[str, str] | None = None
    residual_none: SourceLine | None = None
    first_rank: SourceLine | None = None
    unguarded_add: SourceLine | None = None
    post_loop: list[SourceLine] = field(default_factory=list)
    post_loop_exprs: list[str] = field(default_factory=list)  # e.g. 'self.end_layer'
    handler: list[SourceLine] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    flag: str | None = None  # per-layer attribute tested instead of the index (Qwen-MoE family)
    layer_call: SourceLine | None = None  # where the decoder layer hands the collector on
    split_residual: SourceLine | None = None  # `hidden_states, residual = layer(...)` (hidden-only)
    index_offset: int = 0  # the loop captures under index i + offset (after layer i when it is 1)

    @property
    def boundary0_hazard(self) -> bool:
        """True when capturing before layer 0 on the first PP rank raises TypeError."""
        return self.unguarded_add is not None and self.residual_none is not None


@dataclass
class ModelWiring:
    """The capture machinery of one architecture in one SGLang version."""

    version: str
    arch: str
    entry_file: str
    entry_class: str
    chain: list[str]
    setters: list[SetterSite]
    capture: CaptureSite | None
    owner: str | None
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def boundary0_capturable(self) -> bool:
        return self.capture is not None and not self.capture.boundary0_hazard and \
            self.capture.style != CaptureStyle.UNKNOWN

    def source_lines(self) -> list[SourceLine]:
        out: list[SourceLine] = []
        for s in self.setters:
            out.append(SourceLine(s.file, s.line, s.source.splitlines()[0] if s.source else ""))
        c = self.capture
        if c is not None:
            out.append(SourceLine(c.file, c.loop_line, c.loop_text))
            out.append(SourceLine(c.file, c.line, parse_file(c.path).line(c.line).strip()))
            out.extend(x for x in (c.unguarded_add, c.first_rank, c.residual_none, c.split_residual,
                                   c.layer_call) if x)
            out.extend(c.post_loop)
            out.extend(c.handler)
        return dedupe(out)

    def to_dict(self) -> dict:
        d = asdict(self)
        if self.capture is not None:
            d["capture"]["boundary0_hazard"] = self.capture.boundary0_hazard
        d["boundary0_capturable"] = self.boundary0_capturable
        return d


def dedupe(lines: list[SourceLine]) -> list[SourceLine]:
    seen, out = set(), []
    for ln in lines:
        key = (ln.file, ln.line)
        if key not in seen:
            seen.add(key)
            out.append(ln)
    return out


