"""The served layout measured, not inferred: which boundary each slot of an engine's capture really is.

An engine hands its EAGLE-3 draft ``k`` slots of aux hidden states per token. Two ways to name them:

- ``match_boundaries``: each slot against the workbook's own fp32 forward of the target at every boundary
  on the same tokens (``model.capture``); the boundary it equals within float noise, or None. This is
  what ``capture --backend vllm|sglang`` writes into ``capture.json`` as ``measured_boundaries``.
- ``match_slots``: each slot of one dump against the slots of another dump of known boundaries on the
  same text (``capture --engine-url ... --reference DUMP``), when the target cannot be run here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import BadText
from ..model.capture import run_and_capture
from .dumps import open_dump

# A slot equals a boundary when their difference is within float noise of the state's own scale.
MATCH_REL = 1e-3


@dataclass
class SlotMatch:
    slot: int
    layer_id: int                  # the id the engine was given for this slot (ascending, as engines capture)
    boundary: int | None           # the boundary whose state it equals, None when none does
    max_abs_diff: float            # against that boundary (or the nearest one)
    rel_diff: float


@torch.no_grad()
def match_boundaries(target, records: list[tuple[torch.Tensor, torch.Tensor]], ids: list[int]
                     ) -> list[SlotMatch]:
    """Each slot of ``records`` (token ids [T], states [T, k, H]) against every boundary of the
    workbook's own fp32 forward on the same tokens."""
    num_layers = target.config.num_hidden_layers
    boundaries = list(range(num_layers + 1))
    worst = torch.zeros(len(ids), len(boundaries))
    scale = torch.zeros(len(ids))
    for tokens, states in records:
        _, ref = run_and_capture(target, tokens[None].long(), boundaries)
        for s in range(len(ids)):
            x = states[:, s].float()
            scale[s] = max(float(scale[s]), float(x.abs().max()))
            for j, b in enumerate(boundaries):
                worst[s, j] = max(float(worst[s, j]), float((x - ref[b][0].float()).abs().max()))
    out = []
    for s, layer_id in enumerate(ids):
        j = int(worst[s].argmin())
        rel = float(worst[s, j]) / max(float(scale[s]), 1e-12)
        out.append(SlotMatch(s, layer_id, boundaries[j] if rel < MATCH_REL else None,
                             round(float(worst[s, j]), 8), round(rel, 8)))
    return out


@torch.no_grad()
def match_slots(captured, reference, max_records: int = 4) -> list[dict]:
    """For each slot of ``captured``, the ``reference`` slot it equals on the same tokens: with the
    reference's boundaries known, this measures which boundaries the engine really captured."""
    a, b = open_dump(captured), open_dump(reference)
    if a.hidden != b.hidden:
        raise BadText(f"{a.root} is {a.hidden} wide, {b.root} is {b.hidden}: not the same target")
    errs = torch.full((a.num_slots, b.num_slots), 0.0)
    pairs = 0
    for ra, rb in zip(a.records(max_records), b.records(max_records)):
        n = min(ra.tokens, rb.tokens)
        if not torch.equal(ra.token_ids[:n], rb.token_ids[:n]):
            raise BadText(f"{ra.path} and {rb.path} hold different tokens: capture the same text for both")
        x, y = ra.slots[:n].float(), rb.slots[:n].float()
        for s in range(a.num_slots):
            for r in range(b.num_slots):
                errs[s, r] = max(errs[s, r],
                                 float((x[:, s] - y[:, r]).abs().max() / (y[:, r].abs().max() + 1e-12)))
        pairs += 1
    if not pairs:
        raise BadText(f"{a.root} and {b.root} share no records")
    bounds = b.recorded_boundaries
    out = []
    for s in range(a.num_slots):
        r = int(errs[s].argmin())
        ok = float(errs[s, r]) < 2e-2
        out.append({"slot": s, "matches_reference_slot": r if ok else None,
                    "boundary": (bounds[r] if bounds and ok else None),
                    "rel_diff": round(float(errs[s, r]), 5)})
    return out
