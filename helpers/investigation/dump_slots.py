"""Which boundary each slot of a trainer's dump holds: the dump's own record, the user's statement, or a
measurement against the target's own states (its final norm and head, or its forward where it runs)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from ..errors import BadOption
from ..model.capture import decoder_parts, run_and_capture
from .dumps import Dump, check_token_ids


@dataclass
class SlotIdentity:
    slot: int
    boundary: int | None
    how: str                         # record / stated / measured: ... / format / unknown
    evidence: dict = field(default_factory=dict)


# --------------------------------------------------------------------------------------
# Naming the slots


@torch.no_grad()
def measure_slots(dump: Dump, heads=None, target=None, probe_tokens: int = 256) -> list[dict]:
    """Per slot, on the first record: distance to the embedding lookup, the next-token accuracy
    and cross-entropy of ``lm_head(norm(slot))``, and (when the target can run) the boundary whose
    capture it matches. Each is a fact about the slot's content, not about any naming."""
    rec = next(dump.records(max_records=1))
    vocab = (heads.embed.weight.shape[0] if heads is not None
             else target.config.vocab_size if target is not None else None)
    if vocab is not None:
        check_token_ids(rec, vocab)
    n = min(rec.tokens, probe_tokens)
    ids, slots = rec.token_ids[:n], rec.slots[:n]
    out = [{"slot": s} for s in range(dump.num_slots)]
    if heads is not None:
        emb = heads.boundary0(ids).to(slots.dtype).float()
        nxt = ids[1:]
        for s in range(dump.num_slots):
            x = slots[:, s].float()
            out[s]["embed_rel_diff"] = float((x - emb).abs().max() / (emb.abs().max() + 1e-12))
            logits = heads.logits(heads.final_norm(x[:-1]))
            out[s]["next_acc"] = float((logits.argmax(-1) == nxt).float().mean())
            out[s]["next_ce"] = float(F.cross_entropy(logits, nxt))
            if rec.final_normed is not None:
                fin = rec.final_normed[:n].float()
                diff = (heads.final_norm(x) - fin).abs().max()
                out[s]["final_norm_rel_diff"] = float(diff / (fin.abs().max() + 1e-12))
    if target is not None:
        L = len(decoder_parts(target)[1])
        dev = next(target.parameters()).device
        _, store = run_and_capture(target, ids[None].to(dev), range(L + 1), use_cache=False)
        for s in range(dump.num_slots):
            x = slots[:, s].float()
            errs = {b: float((store[b][0].float().cpu() - x).abs().max() / (x.abs().max() + 1e-12))
                    for b in store}
            b = min(errs, key=errs.get)
            out[s]["capture_match"] = b
            out[s]["capture_rel_diff"] = errs[b]
    return out


def identify_slots(dump: Dump, heads=None, target=None, stated=None,
                   num_layers: int | None = None) -> tuple[list[SlotIdentity], list[str]]:
    """Each slot's boundary, with how it is known, and notes on disagreements.

    Precedence: stated by the user, then the target's own capture (exact), then the dump's own
    record, then exact tests against the embedding (boundary 0) and the final norm/head
    (boundary L), then the format's promise (speculators >= 0.5 puts boundary L last)."""
    notes: list[str] = []
    k = dump.num_slots
    meas = (measure_slots(dump, heads, target) if (heads is not None or target is not None)
            else [{} for _ in range(k)])
    L = num_layers if num_layers is not None else (heads.num_layers if heads is not None else None)
    ids: list[SlotIdentity] = [SlotIdentity(s, None, "unknown", meas[s]) for s in range(k)]
    if stated is not None:
        if len(stated) != k:
            raise BadOption(f"--slot-boundaries names {len(stated)} boundaries {tuple(stated)}; the dump's "
                            f"records hold {k} slots")
        for s, b in enumerate(stated):
            ids[s].boundary, ids[s].how = (None if b is None else int(b)), "stated"
    if target is not None:
        for s in range(k):
            if ids[s].boundary is None and meas[s].get("capture_rel_diff", 1.0) < 2e-2:
                ids[s].boundary, ids[s].how = (meas[s]["capture_match"],
                                               "measured: matches the target's capture")
    if dump.recorded_boundaries is not None:
        for s, b in enumerate(dump.recorded_boundaries):
            if ids[s].boundary is None:
                ids[s].boundary, ids[s].how = b, "record"
            elif ids[s].boundary != b:
                notes.append(f"slot {s}: the dump's record says boundary {b}, {ids[s].how} says "
                             f"{ids[s].boundary}")
    if heads is not None:
        best_final = min(range(k), key=lambda s: meas[s]["next_ce"])
        for s in range(k):
            m = meas[s]
            exact0 = m["embed_rel_diff"] < 1e-3
            exact_final = m.get("final_norm_rel_diff", 1.0) < 2e-2
            reproduces = s == best_final and m["next_acc"] >= 0.9
            if exact0:
                found, why = 0, "measured: equals embed_tokens[token_ids]"
            elif exact_final:
                found, why = L, "measured: its norm equals the dump's post-norm hidden_state"
            elif reproduces:
                found, why = L, f"measured: lm_head(norm(x)) reproduces {m['next_acc']:.0%} of next tokens"
            else:
                continue
            if ids[s].boundary is None:
                ids[s].boundary, ids[s].how = found, why
            elif ids[s].boundary != found:
                notes.append(f"slot {s}: {ids[s].how} says boundary {ids[s].boundary}, but it "
                             f"{why.split(': ')[1]} (boundary {found})")
        zero = [s for s in range(k) if meas[s]["embed_rel_diff"] < 1e-3]
        if not zero and any(i.boundary == 0 for i in ids):
            s0 = next(i.slot for i in ids if i.boundary == 0)
            notes.append(f"slot {s0} is named boundary 0 ({ids[s0].how}) but does not equal "
                         f"embed_tokens[token_ids] (relative difference {meas[s0]['embed_rel_diff']:.3g})")
    fs = dump.final_slot_by_format
    if fs is not None and ids[fs].boundary is None and L is not None:
        ids[fs].boundary, ids[fs].how = L, "format: speculators >= 0.5 saves the final boundary last"
    unknown = [i.slot for i in ids if i.boundary is None]
    if unknown:
        how = ("let the target run (--run-target yes) to match every slot against its capture"
               if heads is not None
               else "pass --target DIR to measure boundary 0 and the final boundary from its embedding, norm "
                    "and head")
        notes.append(f"slot(s) {unknown} stayed unknown: name them with --slot-boundaries, or {how}")
    return ids, notes
