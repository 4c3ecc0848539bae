"""Boundaries, layouts and the id conventions of each system.

Every part of the workbook speaks *boundaries*: boundary ``b`` (0 <= b <= L) is the
residual stream entering decoder layer ``b`` -- boundary 0 is the embedding output and
boundary L the final hidden state before the final norm. Engines and trainers number
layers in their own ways; those numbers are converted here, at the edges, and nowhere
else. A *layout* is the ordered tuple of boundaries concatenated into the draft's ``fc``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
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


# --------------------------------------------------------------------------------------
# Default id lists of each system, expressed in its own numbering.


def eagle3_default_boundaries(num_layers: int) -> Layout:
    """The layout every system falls back to: inputs to layers 2, L//2 and L-3."""
    return (2, num_layers // 2, num_layers - 3)


def deployed_eagle_ids(num_layers: int) -> list[int]:
    """The ids a SpecForge/SGLang draft config usually carries: ``[2, L//2, L-3]``."""
    return [2, num_layers // 2, num_layers - 3]


# --------------------------------------------------------------------------------------
# Conversions. Each returns boundaries; the engine resolvers in ``wiring`` prefer running
# the engine's own code and only fall back on these rules.


def sglang_plus_one(ids: Sequence[int]) -> Layout:
    """SGLang's Llama/Qwen rule (0.5.x): capture before layer ``id + 1``."""
    return tuple(sorted(i + 1 for i in ids))


def vllm_ids_to_boundaries(ids: Sequence[int]) -> Layout:
    """vLLM: an id is the boundary itself (0 = embedding), captured in ascending order."""
    return tuple(sorted(int(i) for i in ids))


def speculators_v1_layers_to_boundaries(layer_ids: Sequence[int]) -> Layout:
    """speculators <= 0.4 data generation: 'layer i' is the output of layer i = boundary i+1.

    ``-1`` is how those pipelines name the embedding output (boundary 0).
    """
    return tuple(0 if i == -1 else i + 1 for i in layer_ids)


def specforge_layers_to_boundaries(layer_ids: Sequence[int]) -> Layout:
    """SpecForge ids are outputs of layers: boundary = id + 1."""
    return tuple(i + 1 for i in layer_ids)


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

    def __post_init__(self):
        check_layout(self.layout, self.num_layers)

    @property
    def boundaries(self) -> Layout:
        """Every boundary a forward pass must capture (layout plus the verifier state)."""
        return tuple(sorted(set(self.layout) | {self.num_layers}))

    @property
    def label(self) -> str:
        return layout_label(self.layout, self.num_layers)

    @property
    def errors(self) -> list[str]:
        """Reasons the engine cannot actually capture this layout (from the resolver's notes)."""
        return [n[len("error: "):] for n in self.notes if n.startswith("error: ")]

    def to_dict(self) -> dict:
        return {"layout": list(self.layout), "num_layers": self.num_layers, "source": self.source,
                "label": self.label, "notes": list(self.notes)}
