"""Boundaries, layouts and the id conventions of each system.

Every part of the workbook speaks *boundaries*: boundary ``b`` (0 <= b <= L) is the
residual stream entering decoder layer ``b`` -- boundary 0 is the embedding output and
boundary L the final hidden state before the final norm. Engines and trainers number
layers in their own ways; those numbers are converted here, at the edges, and nowhere
else. A *layout* is the ordered tuple of boundaries concatenated into the draft's ``fc``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

from .errors import BadOption

Layout = tuple[int, ...]


class WiringError(BadOption):
    """A layout, id list or boundary that cannot mean what was asked of it."""


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


@dataclass(frozen=True)
class CapturePlan:
    """Which boundaries are captured and how they are concatenated for the draft.

    ``layout`` is the order of the concatenation; ``verifier`` the boundary whose state
    gives the target's own next-token distribution (always L for a real engine). This is
    the object the reference engine, the isolated test and the reports share.
    """

    layout: Layout
    num_layers: int
    source: str = ""
    notes: tuple[str, ...] = field(default=())
    errors: tuple[str, ...] = field(default=())     # why the engine cannot capture this layout at all
    warnings: tuple[str, ...] = field(default=())   # what it silently does differently (ignored ids, flags)

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
                "warnings": list(self.warnings)}


@dataclass
class WiringResult:
    """What one engine release will feed the draft's fc for one target, and whether it can at all.

    ``errors`` mean the deployment fails (or drops features); ``warnings`` that it silently differs
    from what the config says. ``hazards`` carry the structured form of errors a caller can act on
    (today: boundary 0 meeting ``residual = None``), so advice is attached where it is known.
    """

    engine: str
    version: str | None
    arch: str
    num_layers: int
    served_layout: Layout
    layers_to_capture: list[int]
    ids_used: list[int] | None
    ids_source: str
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    source_lines: list[dict] = field(default_factory=list)
    hazards: list[dict] = field(default_factory=list)

    @property
    def capturable(self) -> bool:
        return not self.errors

    @property
    def label(self) -> str:
        return layout_label(self.served_layout, self.num_layers)

    def plan(self) -> CapturePlan:
        """The served layout as the plan the reference engine and the reports share."""
        source = (f"{self.engine} {self.arch}: ids {self.ids_used} ({self.ids_source}) -> "
                  f"layers_to_capture {self.layers_to_capture} -> served {self.served_layout}")
        return CapturePlan(self.served_layout, self.num_layers, source, errors=tuple(self.errors),
                           warnings=tuple(self.warnings))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["served_layout"] = list(self.served_layout)
        d["ids_source"] = str(self.ids_source)
        d["capturable"] = self.capturable
        d["label"] = self.label
        return d
