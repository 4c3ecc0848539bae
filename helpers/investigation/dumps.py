"""Hidden-state dumps, as draft trainers write them: read (streamed) and written.

A draft was trained from states a pipeline saved to disk. That dump is the cheapest evidence
there is at a large target's scale: scoring the draft on it needs only the draft, never the
target's forward. Three layouts exist in the field (docs/dumps.md has the details):

- ``speculators`` (>= 0.5, written through vLLM's hidden-state extraction): ``hs_{i}.safetensors``
  with ``hidden_states [seq, k, H]`` in ascending boundary order, the last the final boundary
  before the norm, and ``token_ids [seq]``. No ids are stored. Training takes slots ``[:-1]``.
- ``speculators-legacy`` (<= 0.4, read by ``standardize_data_v1``): ``data_{i}.pt`` holding
  ``input_ids``, a list of k ``[seq, H]`` states and ``loss_mask``, plus ``data_config.json``
  whose ``hidden_states.layer_ids`` are *output-of-layer* ids: boundary = id + 1.
- ``specforge`` (``prepare_hidden_states.py``): ``rows_*/data_{i}.ckpt`` (or ``.ckpt.gz``) with
  ``input_ids``, ``loss_mask``, ``aux_hidden_state [1, seq, kH]`` (already concatenated, the draft
  takes all of it) and ``hidden_state [1, seq, H]``, the final state *after* the norm.

Records are read one at a time, so a dump of any size costs one record of memory.
"""
from __future__ import annotations

import gzip
import io
import json
import pickle
import re
import shutil
import signal
import threading
import zlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from ..boundaries import check_layout
from ..errors import BadText, InputError, pickle_refusal
from ..model.capture import decoder_parts, run_and_capture
from ..rules.conventions import layer_outputs_to_boundaries

FORMATS = ("speculators", "speculators-legacy", "specforge")


class DumpError(BadText):
    """A dump that cannot be read as any trainer's format, or a record that breaks it."""


@dataclass
class DumpRecord:
    """One sample: its tokens and the k states saved for each, in the dump's slot order."""

    path: Path
    token_ids: torch.Tensor                 # [T] int64
    slots: torch.Tensor                     # [T, k, H], as stored (usually bf16)
    loss_mask: torch.Tensor | None = None   # [T]
    final_normed: torch.Tensor | None = None  # [T, H]: SpecForge's hidden_state, after the final norm

    @property
    def tokens(self) -> int:
        return int(self.token_ids.numel())


@dataclass
class Dump:
    """A dump folder: its format, its record files in index order, and what it says of itself."""

    root: Path
    format: str
    files: list[Path]
    num_slots: int
    hidden: int
    recorded_boundaries: tuple[int, ...] | None = None   # from the dump's own record, when it keeps one
    record_source: str = ""
    notes: list[str] = field(default_factory=list)
    engine_capture: dict | None = None    # capture.json: written by ``capture`` through a serving engine

    @property
    def trained_slots(self) -> tuple[int, ...]:
        """The slots the trainer fed the draft: all but the last (``standardize_data_v1`` and
        speculators >= 0.5 keep the last as the verifier state), or all of SpecForge's aux."""
        if self.engine_capture is not None:
            return ()                  # the engine's aux states: no trainer chose among them
        if self.format == "specforge":
            return tuple(range(self.num_slots))
        return tuple(range(self.num_slots - 1))

    @property
    def final_slot_by_format(self) -> int | None:
        """speculators >= 0.5 puts the final pre-norm boundary last by construction; the legacy
        pipeline's last slot is whatever its last id named; SpecForge keeps it outside the slots."""
        return self.num_slots - 1 if self.format == "speculators" and self.engine_capture is None else None

    def records(self, max_records: int | None = None, max_tokens: int | None = None) -> Iterator[DumpRecord]:
        """Records in index order, each checked against the first (width, slot count, finite)."""
        seen = 0
        for n, f in enumerate(self.files):
            if max_records is not None and n >= max_records:
                return
            if max_tokens is not None and seen >= max_tokens:
                return
            rec = read_record(f, self.format)
            check_record(rec, self.num_slots, self.hidden)
            if max_tokens is not None and seen + rec.tokens > max_tokens:
                keep = max_tokens - seen
                rec = DumpRecord(rec.path, rec.token_ids[:keep], rec.slots[:keep],
                                 None if rec.loss_mask is None else rec.loss_mask[:keep],
                                 None if rec.final_normed is None else rec.final_normed[:keep])
            seen += rec.tokens
            yield rec


# --------------------------------------------------------------------------------------
# Finding the format


def _index(path: Path) -> int:
    m = re.search(r"_(\d+)\.", path.name)
    return int(m.group(1)) if m else -1


def _listing(root: Path, limit: int = 6) -> str:
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in root.iterdir())
    if not names:
        return "it is empty"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return "it holds " + ", ".join(names[:limit]) + more


def detect_format(root) -> tuple[str, list[Path]]:
    """The one format whose files the folder holds, and those files in index order."""
    root = Path(root)
    if not root.exists():
        raise FileNotFoundError(f"no dump at {root}")
    if not root.is_dir():
        raise DumpError(f"{root} is a file; expected a dump folder (hs_*.safetensors, data_*.pt or "
                        f"rows_*/data_*.ckpt)")
    found = {
        "speculators": sorted(root.glob("hs_*.safetensors"), key=_index),
        "speculators-legacy": sorted(root.glob("data_*.pt"), key=_index),
        "specforge": sorted([*root.glob("rows_*/data_*.ckpt"), *root.glob("rows_*/data_*.ckpt.gz")],
                            key=_index),
    }
    hits = {k: v for k, v in found.items() if v}
    if len(hits) > 1:
        raise DumpError(f"{root} mixes dump formats ({', '.join(f'{len(v)} {k}' for k, v in hits.items())}); "
                        "point at one trainer's output folder")
    if not hits:
        raise DumpError(f"{root} is not a hidden-state dump: expected hs_{{i}}.safetensors (speculators >= "
                        f"0.5), data_{{i}}.pt + data_config.json (speculators <= 0.4) or "
                        f"rows_*/data_{{i}}.ckpt[.gz] (SpecForge); {_listing(root)}")
    fmt, files = next(iter(hits.items()))
    return fmt, files


# --------------------------------------------------------------------------------------
# Reading records


def _torch_load(f: Path):
    try:
        if f.name.endswith(".gz"):
            with gzip.open(f, "rb") as fh:
                data = fh.read()
            return torch.load(io.BytesIO(data), weights_only=True, map_location="cpu")
        return torch.load(f, weights_only=True, map_location="cpu")
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, OSError, zlib.error) as exc:
        raise DumpError(f"{f}: cannot be read as a PyTorch record (truncated or not a weights-only "
                        f"torch.save file): {pickle_refusal(exc)}") from None


def _need(obj, f: Path, keys: tuple[str, ...]) -> dict:
    if not isinstance(obj, dict):
        raise DumpError(f"{f} holds a {type(obj).__name__}; expected a dict with {', '.join(keys)}")
    missing = [k for k in keys if k not in obj]
    if missing:
        raise DumpError(f"{f} lacks {', '.join(missing)}; it holds {sorted(obj)}")
    return obj


def _flat_ids(t, f: Path, name: str) -> torch.Tensor:
    if not isinstance(t, torch.Tensor) or t.is_floating_point():
        raise DumpError(f"{f}: {name} is {getattr(t, 'dtype', type(t).__name__)}; expected integer token ids")
    return t.reshape(-1).long()


def read_record(f: Path, fmt: str) -> DumpRecord:
    if fmt == "speculators":
        try:
            with safe_open(str(f), framework="pt") as st:
                keys = set(st.keys())
                if not {"hidden_states", "token_ids"} <= keys:
                    missing = sorted({"hidden_states", "token_ids"} - keys)
                    raise DumpError(f"{f} lacks {missing}; it holds {sorted(keys)}")
                hs = st.get_tensor("hidden_states")
                ids = st.get_tensor("token_ids")
                mask = st.get_tensor("loss_mask") if "loss_mask" in keys else None
        except SafetensorError as exc:
            raise DumpError(f"{f}: not a readable safetensors file (truncated?): {exc}") from None
        if hs.dim() != 3:
            raise DumpError(f"{f}: hidden_states has shape {tuple(hs.shape)}; expected [seq, k, H]")
        return DumpRecord(f, _flat_ids(ids, f, "token_ids"), hs, mask)
    if fmt == "speculators-legacy":
        obj = _need(_torch_load(f), f, ("input_ids", "hidden_states"))
        states = obj["hidden_states"]
        if isinstance(states, (list, tuple)) and not states:
            raise DumpError(f"{f}: hidden_states is an empty list; expected k >= 1 tensors of shape [seq, H]")
        if (not isinstance(states, (list, tuple))
                or not all(isinstance(s, torch.Tensor) for s in states)):
            raise DumpError(f"{f}: hidden_states is {type(states).__name__}; expected a list of [seq, H] "
                            f"tensors")
        shapes = {tuple(s.shape) for s in states}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2:
            raise DumpError(f"{f}: hidden_states shapes {sorted(shapes)}; expected k tensors of one shape "
                            f"[seq, H]")
        return DumpRecord(f, _flat_ids(obj["input_ids"], f, "input_ids"), torch.stack(list(states), 1),
                          obj.get("loss_mask"))
    if fmt == "specforge":
        obj = _need(_torch_load(f), f, ("input_ids", "aux_hidden_state", "hidden_state"))
        aux, fin = obj["aux_hidden_state"], obj["hidden_state"]
        for name, t in (("aux_hidden_state", aux), ("hidden_state", fin)):
            if not isinstance(t, torch.Tensor) or t.dim() not in (2, 3) or not t.numel():
                got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise DumpError(f"{f}: {name} is {got}; expected a [1, seq, width] tensor")
        aux = aux[0] if aux.dim() == 3 else aux
        fin = fin[0] if fin.dim() == 3 else fin
        h = fin.shape[-1]
        if aux.dim() != 2 or aux.shape[-1] % h:
            raise DumpError(f"{f}: aux_hidden_state {tuple(obj['aux_hidden_state'].shape)} is not [1, seq, k "
                            f"x {h}] (hidden_state is {tuple(obj['hidden_state'].shape)})")
        slots = aux.reshape(aux.shape[0], aux.shape[-1] // h, h)
        return DumpRecord(f, _flat_ids(obj["input_ids"], f, "input_ids"), slots, obj.get("loss_mask"), fin)
    raise ValueError(f"unknown dump format {fmt!r}; expected one of {FORMATS}")


def check_token_ids(rec: DumpRecord, vocab_size: int) -> None:
    """Every token id must index the model's vocabulary: an id out of range would otherwise surface
    as an IndexError deep inside the embedding lookup."""
    ids = rec.token_ids
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise DumpError(f"{rec.path}: token id {bad} is outside the vocabulary 0..{vocab_size - 1} "
                        f"(vocab_size {vocab_size}); was the dump written with another tokenizer or model?")


def check_record(rec: DumpRecord, num_slots: int, hidden: int) -> None:
    """A record must match the dump's first: mixed widths mean mixed models or runs."""
    f = rec.path
    t, k, h = rec.slots.shape
    if (k, h) != (num_slots, hidden):
        raise DumpError(f"{f}: {k} slots of width {h}; the dump's first record has {num_slots} of width "
                        f"{hidden} (records from different runs or models)")
    if rec.token_ids.numel() != t:
        raise DumpError(f"{f}: {rec.token_ids.numel()} token ids for {t} positions of hidden states")
    if rec.final_normed is not None and tuple(rec.final_normed.shape) != (t, h):
        raise DumpError(f"{f}: hidden_state is {tuple(rec.final_normed.shape)}; expected [{t}, {h}]")
    if rec.loss_mask is not None and rec.loss_mask.numel() != t:
        raise DumpError(f"{f}: loss_mask has {rec.loss_mask.numel()} entries for {t} tokens")
    for name, x in (("hidden states", rec.slots), ("hidden_state", rec.final_normed)):
        if x is not None and not x.is_floating_point():
            raise DumpError(f"{f}: its {name} are {x.dtype}; expected floating-point states (bf16, fp16 or "
                            f"fp32), as every trainer saves them")
        if x is not None and not bool(torch.isfinite(x).all()):
            bad = int((~torch.isfinite(x)).sum())
            raise DumpError(f"{f}: {bad} non-finite values in its {name}; a record with NaN or Inf cannot be "
                            f"scored")
    if t < 2:
        raise DumpError(f"{f}: {t} token(s); a record needs at least 2 to score a next-token prediction")


def _legacy_ids(root: Path) -> tuple[list[int] | None, str]:
    f = root / "data_config.json"
    if not f.is_file():
        return None, ""
    try:
        cfg = json.loads(f.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:
        raise DumpError(f"{f} is not valid JSON ({str(exc)[:120] or type(exc).__name__}); expected "
                        f'{{"hidden_states": {{"layer_ids": [...]}}}}') from None
    hs = cfg.get("hidden_states") if isinstance(cfg, dict) else None
    if not isinstance(cfg, dict) or not isinstance(hs, (dict, type(None))):
        what = type(cfg).__name__ if not isinstance(cfg, dict) else f"hidden_states {type(hs).__name__}"
        raise DumpError(f"{f} holds a JSON {what}; expected an object like "
                        f'{{"hidden_states": {{"layer_ids": [2, 6, 9, 11]}}}}')
    ids = (hs or {}).get("layer_ids")
    if ids is None:
        return None, ""
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise DumpError(f"{f}: hidden_states.layer_ids is {ids!r}; expected a list of integers")
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise DumpError(f"{f}: hidden_states.layer_ids {ids} repeats {dup}; each state is one layer's "
                        f"output, saved once")
    if any(i < -1 for i in ids):
        raise DumpError(f"{f}: hidden_states.layer_ids {ids} holds an id below -1; expected output-of-layer "
                        f"ids -1 (the embedding) .. L-1")
    return ids, str(f)


def open_dump(root) -> Dump:
    """Detect the format and read the first record's shape; every later record is checked
    against it as it streams."""
    root = Path(root)
    fmt, files = detect_format(root)
    first = read_record(files[0], fmt)
    _, k, h = first.slots.shape
    check_record(first, k, h)
    dump = Dump(root, fmt, files, k, h)
    cap = root / "capture.json"
    if fmt == "speculators" and cap.is_file():
        try:
            dump.engine_capture = json.loads(cap.read_text(encoding="utf-8"))
        except (ValueError, RecursionError) as exc:
            raise DumpError(f"{cap} is not valid JSON: {str(exc)[:120]}") from None
        if not isinstance(dump.engine_capture, dict):
            raise DumpError(f"{cap} holds a JSON {type(dump.engine_capture).__name__}; expected the object "
                            f"`capture` writes")
        sb = dump.engine_capture.get("slot_boundaries")
        if sb is not None:
            if (not isinstance(sb, list) or any(not isinstance(b, int) or isinstance(b, bool) or b < 0
                                                for b in sb)):
                raise DumpError(f"{cap}: slot_boundaries is {sb!r}; expected a list of boundaries >= 0")
            if len(set(sb)) != len(sb):
                dup = ", ".join(str(b) for b in sorted({b for b in sb if sb.count(b) > 1}))
                raise DumpError(f"{cap}: slot_boundaries {sb} repeats boundary {dup}; each slot is one "
                                f"boundary")
            if len(sb) != k:
                raise DumpError(f"{cap}: slot_boundaries {sb} names {len(sb)} slots; the records hold {k}")
            dump.recorded_boundaries, dump.record_source = tuple(int(b) for b in sb), f"{cap} slot_boundaries"
        dump.notes.append(f"captured through an engine ({dump.engine_capture.get('engine_url')}, layer ids "
                          f"{dump.engine_capture.get('layer_ids')}): its aux states, no final state")
    if fmt == "speculators-legacy":
        ids, src = _legacy_ids(root)
        if ids is None:
            dump.notes.append(f"{root} has no data_config.json with hidden_states.layer_ids: slot boundaries "
                              f"unknown")
        elif len(ids) != k:
            raise DumpError(f"{src}: hidden_states.layer_ids {ids} names {len(ids)} states; the records hold "
                            f"{k}")
        else:
            dump.recorded_boundaries = layer_outputs_to_boundaries(ids)
            dump.record_source = f"{src} layer_ids {ids} (output of layer id = boundary id + 1)"
    return dump


# --------------------------------------------------------------------------------------
# Writing dumps, exactly as those trainers lay them out


def check_new_dir(out: Path) -> None:
    """A dump goes into a new (or empty) folder: never mixed with, or over, another run's records."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise InputError(f"{out} already exists and is not an empty folder; a dump is written into a new one")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise InputError(f"--out {out}: {parent} is a file, so no folder can be made under it")
            break


class Terminated(SystemExit):
    """SIGTERM during a write: raised so the staging folder is removed on the way out (exit 143)."""


@contextmanager
def _terminate_as_exception():
    """SIGTERM's default ends the process at once, leaving a staging folder; inside this block it
    raises instead, so cleanup runs. Only the main thread can own a signal handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(128 + signum)

    saved = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, saved)


@contextmanager
def staged_dir(out: Path):
    """A sibling staging folder renamed to ``out`` when the block ends cleanly, removed when it
    does not: a failure or Ctrl-C half-way through a dump leaves nothing behind."""
    check_new_dir(out)
    stage = out.parent / f".{out.name}.partial"
    with _terminate_as_exception():
        if stage.exists():
            shutil.rmtree(stage)
        stage.mkdir(parents=True)
        try:
            yield stage
            if out.exists():
                out.rmdir()
            stage.rename(out)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise


def write_dump(target, windows: torch.Tensor, boundaries, fmt: str, out,
               loss_mask: torch.Tensor | None = None, dtype: torch.dtype = torch.bfloat16,
               progress: bool = False) -> Path:
    """Capture ``boundaries`` on each token window and write one record per window.

    For ``specforge`` the last boundary must be the final one: its *normed* state becomes
    ``hidden_state`` and the others the concatenated ``aux_hidden_state``.
    """
    if fmt not in FORMATS:
        raise InputError(f"unknown dump format {fmt!r}; expected one of {', '.join(FORMATS)}")
    _, layers, norm = decoder_parts(target)
    L = len(layers)
    bounds = check_layout(boundaries, L)
    if len(set(bounds)) != len(bounds) or list(bounds) != sorted(bounds):
        raise InputError(f"boundaries {bounds} must be distinct and ascending: every trainer saves states in "
                         "layer order")
    if fmt == "specforge" and bounds[-1] != L:
        raise InputError(f"a SpecForge dump keeps the final state (boundary {L}) as hidden_state; end the "
                         f"boundaries with {L}, got {bounds}")
    out = Path(out)
    with staged_dir(out) as stage:
        for i in tqdm(range(windows.shape[0]), desc=f"dump ({fmt})", disable=not progress):
            ids = windows[i:i + 1]
            _, store = run_and_capture(target, ids, bounds, use_cache=False)
            states = [store[b][0].to(dtype).contiguous() for b in bounds]
            tok = ids[0].long().contiguous()
            mask = (torch.ones_like(tok) if loss_mask is None else loss_mask[i].long()).contiguous()
            final = norm(store[L])[0].to(dtype).contiguous() if fmt == "specforge" else None
            _write_record(stage, fmt, i, tok, states, mask, final)
        if fmt == "speculators-legacy":
            (stage / "data_config.json").write_text(json.dumps({
                "hidden_states": {"layer_ids": [b - 1 for b in bounds]},
                "num_hidden_layers": L, "records": int(windows.shape[0]),
                "written_by": "eagle3-wiring-workbook dump (speculators <= 0.4 layout)"}, indent=2) + "\n",
                encoding="utf-8")
    return out


@torch.no_grad()
def _write_record(stage: Path, fmt: str, i: int, tok, states, mask, final) -> None:
    if fmt == "speculators":
        save_file({"hidden_states": torch.stack(states, 1).contiguous(), "token_ids": tok},
                  str(stage / f"hs_{i}.safetensors"))
    elif fmt == "speculators-legacy":
        torch.save({"input_ids": tok, "hidden_states": states, "loss_mask": mask}, stage / f"data_{i}.pt")
    else:
        group = (i // 5000) * 5000
        d = stage / f"rows_{group}-{group + 5000}"
        d.mkdir(exist_ok=True)
        # hidden_state: the final state after the norm
        aux = torch.cat(states[:-1], -1)[None].contiguous()
        torch.save({"input_ids": tok, "loss_mask": mask, "hidden_state": final[None],
                    "aux_hidden_state": aux}, d / f"data_{i}.ckpt")
