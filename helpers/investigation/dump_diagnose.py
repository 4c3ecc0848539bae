"""Diagnose a draft from its trainer's hidden-state dump: no target forward at all.

The seed's isolated test (34.1% served vs 76.9% trained) needed only the draft and the states
its pipeline had saved. This module does that at any scale: it names each slot of the dump
(from the dump's own record, the user, or measured against the target's embedding, final norm
and head), scores every ordered choice of slots the draft's ``fc`` can take, and compares the
best, the trained choice and what the engine serves. Work is streamed record by record, so
memory is the draft plus one record.

Ranking uses one measure, the one an engine rewards: the expected accepted tokens per verify
step under greedy verification (the simulated accept length, kept per token), against the
target's greedy tokens when the final state gives logits, else the dump's next tokens. A layout
counts as the answer only when no other is within noise of it, by a paired test over blocks of
tokens on that same measure; cross-entropy (over the draft steps) and step-0 accuracy are
reported beside it. docs/dumps.md explains the choices.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from ..boundaries import ExitCode, layout_label
from ..errors import BadCheckpoint, BadOption, BadText
from ..judgement import PairedTest
from ..model.checkpoint import NoEmbeddingError, load_draft
from ..model.draft import forward_verdict, run_as
from ..model.target import load_target
from ..model.target_heads import HEAD_KEYS, load_target_heads
from ..record import read_record
from ..rules.conventions import Engine, read_draft_config, read_target
from ..rules.wiring import served_plan
from . import scoring
from .dump_slots import SlotIdentity, identify_slots
from .dumps import Dump, check_token_ids
from .evaluate import RANKED_BY, accuracy_table, paired_test, token_blocks
from .evidence import training_evidence
from .scoring import score_states
from .verdict import Acceptance, Settled, WiringVerdict, by_format, judge, read_format

# --------------------------------------------------------------------------------------
# Scoring


@dataclass
class _Acc:
    ce: list = field(default_factory=list)        # per record: [n] mean-over-steps cross-entropy
    hits: list = field(default_factory=list)      # per record: list over steps of [n] bool
    masks: list = field(default_factory=list)     # per record: [n] bool, columns whose labels exist
    # per record: [n] bool, columns whose labels the draft vocab holds
    ce_masks: list = field(default_factory=list)
    accepted: list = field(default_factory=list)  # per record: [n] tokens one verify step keeps


def _labels(rec, draft, heads, final_slot, target=None, chunk: int = 512):
    """(label ids [T], soft draft-vocab targets [T, Vd] or None, label validity [T]).

    Position p's label is what follows p: the target's greedy token and distribution when its
    final state is in the dump and its head is at hand, or when the target is small enough to run
    on the record's tokens; else the dump's own next token."""
    T = rec.tokens
    if target is not None and rec.final_normed is None and final_slot is None:
        dev = next(target.parameters()).device
        logits = target(input_ids=rec.token_ids[None].to(dev), use_cache=False).logits[0].float().cpu()
        rows = draft.draft_token_ids.cpu()
        return logits.argmax(-1), F.softmax(logits[:, rows], -1), torch.ones(T, dtype=torch.bool)
    if heads is not None and (rec.final_normed is not None or final_slot is not None):
        rows = draft.draft_token_ids.cpu()
        argmax, probs = [], []
        for i in range(0, T, chunk):
            if rec.final_normed is not None:
                normed = rec.final_normed[i:i + chunk].float()
            else:
                normed = heads.final_norm(rec.slots[i:i + chunk, final_slot])
            full = heads.logits(normed)
            argmax.append(full.argmax(-1))
            probs.append(F.softmax(full[:, rows], -1))
        return torch.cat(argmax), torch.cat(probs), torch.ones(T, dtype=torch.bool)
    lab = torch.full((T,), -1, dtype=torch.long)
    lab[:-1] = rec.token_ids[1:]
    return lab, None, lab >= 0


@torch.no_grad()
def score_layouts(draft, dump: Dump, layouts: list[tuple[int, ...]], steps: int = 3, heads=None,
                  final_slot: int | None = None, max_records: int | None = None,
                  max_tokens: int | None = None, progress: bool = True,
                  activation_bytes: int = 512 * 2**20, target=None) -> dict:
    """Stream the dump once; for every layout (in slot indices) the per-token cross-entropy
    (mean over ``steps``) and per-step hits, plus what the labels were."""
    ht = draft.cfg.target_hidden_size
    w = draft.fc.weight
    inv = None
    accs = {lay: _Acc() for lay in layouts}
    c = draft.cfg      # fp32 bytes one token of one layout holds at the peak of a draft step
    per_token = 4 * (3 * c.intermediate_size + 3 * c.draft_vocab_size + 8 * c.hidden_size)
    tokens = records = 0
    soft = None
    bar = tqdm(total=len(dump.files) if max_records is None else min(max_records, len(dump.files)),
               desc=f"scoring {len(layouts)} layouts", disable=not progress, unit="record")
    for rec in dump.records(max_records, max_tokens):
        T = rec.tokens
        if T < steps + 3:
            bar.update(1)
            continue
        check_token_ids(rec, draft.cfg.vocab_size)
        lab, probs, valid = _labels(rec, draft, heads, final_slot, target)
        soft = probs is not None
        if not soft and inv is None:
            inv = torch.full((draft.cfg.vocab_size,), -1, dtype=torch.long)
            inv[draft.draft_token_ids.cpu()] = torch.arange(draft.cfg.draft_vocab_size)
        n = T - steps if soft else T - 1 - steps
        col_ok = torch.ones(n, dtype=torch.bool)
        for j in range(steps):
            col_ok &= valid[1 + j:1 + j + n]
        if rec.loss_mask is not None:
            lm = rec.loss_mask.reshape(-1).bool()
            col_ok &= lm[2:2 + n] if lm.numel() >= n + 2 else torch.ones(n, dtype=torch.bool)
        ce_ok = col_ok.clone()
        if not soft:   # a next token outside the draft vocabulary: a miss, but no probability to score
            for j in range(steps):
                ce_ok &= inv[lab[1 + j:1 + j + n].clamp(min=0)] >= 0
        used = sorted({(s, b) for lay in layouts for s, b in enumerate(lay)})
        dev = w.device                 # records stream from disk to the draft's device, one at a time
        proj = {(s, b): rec.slots[:, b].to(dev).float() @ w[:, s * ht:(s + 1) * ht].T for s, b in used}
        ids = rec.token_ids[None].to(dev)
        lab_d = lab.to(dev)
        probs_d = probs.to(dev) if soft else None
        inv_d = inv.to(dev) if inv is not None else None
        # layouts per forward, within the budget
        group = max(1, min(16, activation_bytes // (T * per_token)))
        for g in range(0, len(layouts), group):
            chunk = layouts[g:g + group]
            h = torch.stack([sum(proj[(s, b)] for s, b in enumerate(lay)) for lay in chunk])
            k = len(chunk)
            ce, hits, kept = score_states(
                draft, h, ids.expand(k, T), steps, n, lab_d[1:][None].expand(k, -1),
                probs_d[1:][None].expand(k, -1, -1) if soft else None, inv_d)
            ce, kept = ce.cpu(), kept.cpu()
            hit = [hj.cpu() for hj in hits]
            for i, lay in enumerate(chunk):
                a = accs[lay]
                a.ce.append(ce[i] / steps)
                a.hits.append([hj[i] for hj in hit])
                a.masks.append(col_ok)
                a.ce_masks.append(ce_ok)
                a.accepted.append(kept[i])
        tokens += int(col_ok.sum())
        records += 1
        bar.update(1)
    bar.close()
    if not records:
        raise BadText(f"{dump.root}: no record has the {steps + 3} tokens {steps} draft steps need")
    if not tokens:
        raise BadText(f"{dump.root}: every position of the {records} record(s) read is masked out (loss_mask "
                      f"0 everywhere, or no next token to score); expected a dump whose loss_mask marks the "
                      f"tokens the draft was trained on")
    return {"accs": accs, "tokens": tokens, "records": records, "soft": bool(soft), "steps": steps}


def _summary(a: _Acc, steps: int) -> dict:
    mask = torch.cat(a.masks)
    ce = torch.cat(a.ce)[torch.cat(a.ce_masks)]
    correct = [torch.cat([h[j] for h in a.hits])[None] for j in range(steps)]
    full, cond, se = accuracy_table(correct, mask[None])
    kept = torch.cat(a.accepted)[mask]
    if not bool(torch.isfinite(ce).all()):
        raise BadCheckpoint("the draft's scores are not finite (NaN or Inf): its weights or the dump's "
                            "states cannot be trusted")
    return {"sim_accept_length": float(kept.mean()) if kept.numel() else float("nan"), "ce": float(ce.mean()),
            "acc0": full[0], "full_acc": [round(x, 4) for x in full], "cond_acc": [round(x, 4) for x in cond],
            "acc_se": round(se, 4)}


def _blocks(a: _Acc) -> torch.Tensor:
    """Per-record token blocks' mean accepted tokens: the unit of the paired test."""
    return token_blocks(a.accepted, a.masks)


def paired(a: _Acc, b: _Acc) -> PairedTest:
    """``a`` minus ``b`` in accepted tokens per verify step, over the same token blocks."""
    return paired_test(_blocks(a), _blocks(b))


def rank(scored: dict, slot_boundaries, num_layers: int | None) -> pd.DataFrame:
    """Sorted by accepted tokens per verify step (ties: lower ce); each row tested against the best."""
    accs, steps = scored["accs"], scored["steps"]
    rows = []
    for lay, a in accs.items():
        bounds = tuple(slot_boundaries[s] for s in lay)
        known = all(b is not None for b in bounds)
        rows.append({"slots": lay, "layout": bounds if known else None,
                     "label": layout_label(bounds, num_layers) if known and num_layers else
                     "(" + ", ".join("?" if b is None else str(b) for b in bounds) + ")",
                     **_summary(a, steps)})
    df, _ = scoring.rank(rows, "slots", lambda best, other: paired(accs[best], accs[other]))
    return df


# --------------------------------------------------------------------------------------
# The whole diagnosis


@dataclass
class DumpDiagnosis:
    dump: Dump
    slots: list[SlotIdentity]
    ranking: pd.DataFrame
    tokens: int
    records: int
    steps: int
    labels: str
    trained_slots: tuple[int, ...] | None
    served_layout: tuple[int, ...] | None
    served_slots: tuple[int, ...] | None
    served_source: str
    served_errors: list[str]
    served_engine_row: dict | None        # the served layout under the engine's own forward, when it differs
    num_layers: int | None
    seconds: float
    notes: list[str] = field(default_factory=list)
    wiring: WiringVerdict | None = None   # the two questions: does served equal trained, and what it costs

    def row(self, slots) -> dict | None:
        if slots is None:
            return None
        hit = self.ranking[self.ranking["slots"] == tuple(slots)]
        return None if hit.empty else hit.iloc[0].to_dict()

    @property
    def slot_boundaries(self) -> list[int | None]:
        return [s.boundary for s in self.slots]

    @property
    def best(self) -> dict:
        return self.ranking.iloc[0].to_dict()

    @property
    def confident_set(self) -> list[tuple[int, ...]]:
        return scoring.confident_set(self.ranking, "slots")

    @property
    def served_row(self) -> dict | None:
        return self.served_engine_row or self.row(self.served_slots)

    @property
    def trained_layout(self) -> tuple[int, ...] | None:
        if self.trained_slots is None:
            return None
        b = tuple(self.slot_boundaries[s] for s in self.trained_slots)
        return b if all(x is not None for x in b) else None

    @property
    def mismatch(self) -> bool | None:
        """The served layout differs from the training layout (by the format's rule when the trainer's
        slot choice is known; else from the confidence set); None when it cannot be decided."""
        return self.wiring.mismatch if self.wiring else None

    @property
    def verdict(self) -> str:
        return self.wiring.line if self.wiring else "no verdict"

    def comparison(self) -> pd.DataFrame:
        """Trained, served and best side by side, in the columns ``compare_layouts`` uses, so the
        notebooks draw the dump's isolated test with the same table and plot as the capture's."""
        rows = []
        for name, slots, r in (("trained", self.trained_slots, self.row(self.trained_slots)),
                               ("served", self.served_slots, self.served_row),
                               ("best in dump", self.best["slots"], self.best)):
            if r is None or (name == "best in dump" and tuple(slots) == tuple(self.trained_slots or ())):
                continue
            layout = tuple(self.slot_boundaries[s] for s in slots)
            label = (layout_label(layout, self.num_layers) if self.num_layers and None not in layout
                     else "slots " + str(tuple(slots)))
            row = {"wiring": f"{name} {label}", "layout": layout, "label": label, "slots": tuple(slots),
                   "ce": round(r["ce"], 4), "sim_accept_length": round(r["sim_accept_length"], 3),
                   "tokens": self.tokens}
            for j in range(self.steps):
                row[f"full_acc_{j}"] = r["full_acc"][j]
                row[f"cond_acc_{j}"] = r["cond_acc"][j]
            rows.append(row)
        return pd.DataFrame(rows)

    @property
    def exit_code(self) -> int:
        """``boundaries.ExitCode``, from the wiring verdict (3 when there is none)."""
        return self.wiring.exit_code if self.wiring is not None else ExitCode.UNDECIDED

    def to_dict(self, top: int = 20) -> dict:
        best = self.best
        trained = self.row(self.trained_slots)
        served = self.served_row
        ranking = []
        for r in self.ranking.head(top).to_dict("records"):
            r["slots"] = list(r["slots"])
            r["layout"] = list(r["layout"]) if r["layout"] is not None else None
            r["within_noise"] = bool(r["within_noise"])
            r["sim_accept_length"], r["ce"] = round(r["sim_accept_length"], 4), round(r["ce"], 4)
            ranking.append(r)
        return {
            "data_format": self.dump.format, "data": str(self.dump.root), "records": self.records,
            "tokens": self.tokens, "steps": self.steps, "labels": self.labels,
            "slot_boundaries": self.slot_boundaries, "slot_sources": [s.how for s in self.slots],
            "slot_evidence": [s.evidence for s in self.slots],
            "best_slots": list(best["slots"]),
            "best_layout": list(best["layout"]) if best["layout"] else None,
            "best_acc": best["acc0"], "best_ce": best["ce"], "best_full_acc": best["full_acc"],
            "trained_slots": list(self.trained_slots) if self.trained_slots is not None else None,
            "training_layout": (None if self.wiring is None or self.wiring.training_layout is None
                                else list(self.wiring.training_layout)),
            # the old name: the layout the dump's slot choice gives, kept for one release
            "trained_layout": list(self.trained_layout) if self.trained_layout else None,
            "trained_acc": trained["acc0"] if trained else None,
            "trained_ce": trained["ce"] if trained else None,
            "served_layout": list(self.served_layout) if self.served_layout is not None else None,
            "served_slots": list(self.served_slots) if self.served_slots is not None else None,
            "served_source": self.served_source, "served_errors": self.served_errors,
            "served_acc": served["acc0"] if served else None, "served_ce": served["ce"] if served else None,
            "served_full_acc": served["full_acc"] if served else None,
            "ranked_by": RANKED_BY, "best_accept_length": round(best["sim_accept_length"], 4),
            "trained_accept_length": round(trained["sim_accept_length"], 4) if trained else None,
            "served_accept_length": round(served["sim_accept_length"], 4) if served else None,
            "confident": len(self.confident_set) == 1 and len(self.ranking) > 1,
            "confident_set": [list(s) for s in self.confident_set],
            "z_runner_up": float(self.ranking["z_vs_best"].iloc[1]) if len(self.ranking) > 1 else None,
            **(self.wiring.to_dict() if self.wiring else {"mismatch": None, "cost": None, "significant": None,
                                                          "verdict": self.verdict}),
            "seconds": self.seconds,
            "layouts_scored": len(self.ranking), "ranking": ranking, "notes": self.notes,
        }


def candidate_slots(num_slots: int, width: int, extra=()) -> list[tuple[int, ...]]:
    out = list(itertools.permutations(range(num_slots), width))
    for e in extra:
        if e is not None and tuple(e) not in out:
            out.append(tuple(e))
    return out


def diagnose_dump(draft, dump: Dump, *, heads=None, target=None, stated=None, engine: Engine | None = None,
                  draft_config: dict | None = None, arch: str | None = None, num_layers: int | None = None,
                  steps: int = 3, max_records: int | None = None, max_tokens: int | None = None,
                  progress: bool = True, recorded=None,
                  recorded_source: str = "training record") -> DumpDiagnosis:
    """``recorded``: the training layout the chain of evidence settled before any scoring (``stated_layout``:
    the record, the trainer's output, the trainer the config names), ``recorded_source`` what it rests on;
    it names the training layout when the dump's own slot choice does not fit the draft."""
    t0 = time.perf_counter()
    k_fc = draft.cfg.num_aux
    if dump.hidden != draft.cfg.target_hidden_size:
        raise BadText(f"{dump.root}: states are {dump.hidden} wide; the draft's fc takes {k_fc} x "
                      f"{draft.cfg.target_hidden_size} (a dump of another target?)")
    if dump.num_slots < k_fc:
        raise BadText(f"{dump.root}: records hold {dump.num_slots} slot(s); the draft's fc takes {k_fc} "
                      f"({draft.cfg.fc_in} wide), so no choice of slots can feed it")
    if heads is not None and heads.config.hidden_size != dump.hidden:
        raise BadText(f"{dump.root}: states are {dump.hidden} wide; the target at {heads.path} has "
                      f"hidden_size {heads.config.hidden_size}")
    L = num_layers if num_layers is not None else (heads.num_layers if heads is not None else None)
    slots, notes = identify_slots(dump, heads, target, stated, L)
    notes = list(dump.notes) + notes
    bounds = [s.boundary for s in slots]
    trained, trained_source, outside = _trained_slots(dump, k_fc, bounds, recorded, recorded_source, notes)
    served_layout, served_slots, served_source, served_errors = _served_slots(draft_config, engine, arch, L,
                                                                              k_fc, bounds, notes)
    layouts = candidate_slots(dump.num_slots, k_fc, (trained, served_slots))
    final_slot = next((s.slot for s in slots if L is not None and s.boundary == L), None)
    scored = score_layouts(draft, dump, layouts, steps, heads, final_slot, max_records, max_tokens, progress,
                           target=target)
    ranking = rank(scored, bounds, L)
    settled, outside_source = None, f"{recorded_source} (its boundaries are not all in this dump)"
    if trained is None and outside is None and recorded is None and engine:
        # neither the dump's slot choice nor a record: every writer of the config's format may still name it
        settled = _by_format(ranking, k_fc, draft_config, engine, arch, L, served_layout, served_errors)
        where = {b: s for s, b in enumerate(bounds) if b is not None}
        if settled.known and all(b in where for b in settled.layout):
            trained, trained_source = tuple(where[b] for b in settled.layout), settled.source
        elif settled.known:
            outside, outside_source = settled.layout, f"{settled.source}, not all in this dump"
    engine_row = None
    served_acc = scored["accs"].get(served_slots) if served_slots is not None else None
    if served_slots is not None and engine:
        with run_as(draft, engine) as engine_notes:
            if engine_notes:
                again = score_layouts(draft, dump, [served_slots], steps, heads, final_slot, max_records,
                                      max_tokens, False, target=target)
                served_acc = again["accs"][served_slots]
                engine_row = _summary(served_acc, steps)
                notes += engine_notes
    has_final = final_slot is not None or dump.format == "specforge"
    labels = ("the dump's next tokens" if not scored["soft"] else
              "target distribution (final state through the target's norm and head)" if has_final else
              "target distribution (the target run on the dump's tokens)")
    d = DumpDiagnosis(dump, slots, ranking, scored["tokens"], scored["records"], steps, labels, trained,
                      served_layout, served_slots, served_source, served_errors, engine_row, L,
                      round(time.perf_counter() - t0, 2), notes)
    d.wiring = _wiring(d, scored["accs"], served_acc, engine, arch, trained_source, outside, outside_source,
                       settled, draft if served_slots is not None else None)
    return d


def _trained_slots(dump: Dump, k_fc: int, bounds, recorded, recorded_source: str, notes: list[str]):
    """The dump's slots the draft was trained on: the format's own slot choice where it fits the draft, else
    the settled training layout's boundaries where the dump holds them all. Returns (slots, what they rest
    on, a settled layout the dump cannot score)."""
    trained = dump.trained_slots if len(dump.trained_slots) == k_fc else None
    if trained is None and dump.engine_capture is None:
        notes.append(f"the trainer's choice "
                     f"({'all aux slots' if dump.format == 'specforge' else 'slots [:-1]'}) gives "
                     f"{len(dump.trained_slots)} states; the draft takes {k_fc}: this dump is not the one it "
                     f"was trained from, or holds extra states")
    if trained is not None:
        rule = "all aux slots" if dump.format == "specforge" else "hidden_states[:-1]"
        got = tuple(bounds[s] for s in trained)
        if recorded is not None and None not in got and got != tuple(recorded):
            notes.append(f"{recorded_source} says {tuple(recorded)}; the dump's slot choice holds {got}")
        return trained, f"the {dump.format} format's slot choice, {rule}", None
    if recorded is None:
        return None, "", None
    where = {b: s for s, b in enumerate(bounds) if b is not None}
    if all(b in where for b in recorded) and len(recorded) == k_fc:
        return tuple(where[b] for b in recorded), recorded_source, None
    notes.append(f"{recorded_source} says {tuple(recorded)}, not all (known to be) in the dump's slots "
                 f"{bounds}")
    return None, "", tuple(int(b) for b in recorded)   # the answer still, though the dump cannot score it


def _served_slots(draft_config, engine, arch, L, k_fc: int, bounds, notes: list[str]):
    """What the engine serves this draft (``rules.wiring.served_plan``) and the dump's slots that hold it.
    Returns (layout, slots or None, source, errors)."""
    if not engine:
        return None, None, "", []
    if draft_config is None or not arch or L is None:
        notes.append("no target config (--target DIR or --layers/--arch): the served layout was not resolved")
        return None, None, "", []
    plan = served_plan(draft_config, L, arch, engine)
    layout, errors = tuple(plan.layout), list(plan.errors)
    notes += [f"served plan: {n}" for n in (*plan.warnings, *plan.notes)]
    if not errors and len(layout) != k_fc:
        errors.append(f"{plan.source} feeds {len(layout)} features {layout}; the draft's fc takes {k_fc}")
    if errors:
        return layout, None, plan.source, errors
    where = {b: s for s, b in enumerate(bounds) if b is not None}
    if all(b in where for b in layout):
        return layout, tuple(where[b] for b in layout), plan.source, errors
    missing = [b for b in layout if b not in where]
    notes.append(f"the served boundaries {missing} are not (known to be) in the dump, whose slots hold "
                 f"{bounds}: served accuracy cannot be measured from it")
    return layout, None, plan.source, errors


def stated_layout(draft_dir: str | Path, draft_config: dict | None, engine: Engine | None, arch: str | None,
                  num_layers: int | None) -> tuple[tuple[int, ...] | None, str]:
    """What the one chain of evidence (``evidence.training_evidence``) settles before the dump is scored, and
    its sentence: the record, the trainer's output, the trainer the config names. Without a target's depth
    only the record can be read; the format's writers are left to the ranking (``_by_format``)."""
    folder = Path(draft_dir)
    if not folder.is_dir():
        return None, ""
    if num_layers is None or engine is None or draft_config is None:
        rec = read_record(folder)
        return (tuple(rec.layout), "training record") if rec and rec.layout is not None else (None, "")
    ev = training_evidence(folder, draft_config, engine=engine, arch=arch, num_layers=num_layers)
    return (ev.layout, ev.source) if ev.settled else (None, "")


def _by_format(ranking: pd.DataFrame, width: int, draft_config, engine, arch, num_layers, served_layout,
               served_errors) -> Settled:
    """The draft config's format's writers, confirmed by the dump's ranking where their layout is in it."""
    candidates = read_format(draft_config, engine, arch, num_layers, served_layout, served_errors)
    ranked = [tuple(x) for x in ranking["layout"] if x is not None]
    within = [tuple(x) for x, w in zip(ranking["layout"], ranking["within_noise"]) if w and x is not None]
    return by_format(candidates, width=width, ranked=ranked, confident_set=within)


def _wiring(d: DumpDiagnosis, accs: dict, served_acc: _Acc | None, engine, arch,
            source: str, recorded_outside: tuple[int, ...] | None = None,
            outside_source: str = "training record (its boundaries are not all in this dump)",
            settled: Settled | None = None, draft=None) -> WiringVerdict:
    """Both questions from the dump: equality by the format's slot choice when it fits the draft (else
    by the training record or the config's format, even when the dump cannot score it; else from the
    confidence set), the cost as trained (or best) minus served on the same token blocks. ``draft``: the
    served slots were scored under the engine's forward, whose ignored flags the verdict names."""
    known = d.trained_layout is not None or recorded_outside is not None
    if d.trained_layout is not None:
        trained_slots, trained = d.trained_slots, d.trained_layout
    elif recorded_outside is not None:
        # e.g. a dump an engine wrote of the served slots only: equality is decided by the record
        trained_slots, trained = None, recorded_outside
        source = outside_source
    else:
        trained_slots, trained = d.best["slots"], d.best["layout"]
        source = "inferred: the best layout in the dump"
    bounds = d.slot_boundaries
    confident = [tuple(bounds[s] for s in cs) for cs in d.confident_set
                 if all(bounds[s] is not None for s in cs)]
    cost, note, at_served, at_trained = None, "", None, None
    if served_acc is not None and trained_slots is not None:
        cost = paired(accs[tuple(trained_slots)], served_acc)
        at_served = Acceptance.of(_summary(served_acc, d.steps))
        at_trained = Acceptance.of(_summary(accs[tuple(trained_slots)], d.steps))
    elif trained_slots is None and known:
        note = (f"its cost cannot be measured from this dump: the trained boundaries {trained} are not all "
                f"(known to be) in its slots {bounds}")
    elif d.served_layout is not None and not d.served_errors:
        note = (f"its cost cannot be measured from this dump: the served boundaries {d.served_layout} are "
                f"not all (known to be) in its slots {bounds}")
    return judge(d.served_layout, trained, known=known, source=source, confident_set=confident, cost=cost,
                 errors=d.served_errors, engine=engine, arch=arch, num_layers=d.num_layers, cost_note=note,
                 forward=None if draft is None or engine is None else forward_verdict(draft, engine),
                 settled=settled, at_served=at_served, at_trained=at_trained)


# --------------------------------------------------------------------------------------
# Loading what a dump diagnosis scores: the draft, and as little of the target as it needs.


RUN_TARGET_MAX_BYTES = 4 * 2**30


def _weights_bytes(path: Path) -> int:
    return (sum(f.stat().st_size for f in path.glob("*.safetensors"))
            + sum(f.stat().st_size for f in path.glob("*.bin")))


def load_for_dump(draft_dir, target_dir, run_target: str = "auto", device: str = "cpu"):
    """(draft, target heads or None, runnable target or None, TargetSpec or None, notes, draft config).

    The target is run only when asked or when its weights are small (``auto``: under 4 GB): a large
    target contributes its config and three tensors, nothing more."""
    notes = []
    heads = target = tspec = None
    if target_dir is not None:
        target_dir = Path(target_dir)
        has_weights = any(target_dir.glob("*.safetensors"))
        tspec = read_target(target_dir, HEAD_KEYS if has_weights else ())   # read once, handed down
        if has_weights:
            heads = load_target_heads(target_dir, tspec)
            notes += heads.notes
        else:
            notes.append(f"{target_dir} has no safetensors weights: its config names the layers and "
                         f"architecture; slots are not measured and scores use the dump's next tokens")
        size = _weights_bytes(target_dir)
        if run_target == "yes" or (run_target == "auto" and has_weights and size <= RUN_TARGET_MAX_BYTES):
            target, _ = load_target(target_dir, device)
            notes.append(f"target small enough to run ({size / 2**20:.0f} MiB): slots matched against its "
                         f"own capture")
    draft_dir = Path(draft_dir) if draft_dir is not None else None
    if draft_dir is None:
        raise BadOption("--data needs --draft DIR: the draft to score on the dump")
    try:
        draft = load_draft(draft_dir, target=heads, device=device)
    except NoEmbeddingError:
        if heads is None and target_dir is not None:
            other = sorted(f.name for f in target_dir.glob("*.bin"))
            raise BadCheckpoint(f"{draft_dir} ships no embed_tokens and borrows the target's, but "
                                f"{target_dir} has no safetensors weights to borrow it from"
                                + (f" (only {', '.join(other[:3])}, which a dump diagnosis does not unpickle)"
                                   if other else "")
                                + "; expected model.safetensors or sharded safetensors with their "
                                  "index") from None
        if heads is None:
            raise BadOption(f"{draft_dir} ships no embed_tokens and borrows the target's: pass --target DIR "
                            f"with its safetensors (only its config, embed_tokens, final norm and lm_head "
                            f"are read, never the whole model)") from None
        raise
    if heads is not None and torch.equal(draft.embed_tokens.weight, heads.embed.weight):
        heads.embed = draft.embed_tokens     # borrowed: one copy of a large vocabulary's embedding, not two
    return draft, heads, target, tspec, notes, read_draft_config(draft_dir)
