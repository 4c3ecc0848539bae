"""Capture hidden states through the engine that already serves the target: ``python -m helpers capture``.

No dump on disk and a target too large for transformers on one device: the engine that serves it
(across the user's GPUs, TP as deployed) can capture instead. SGLang 0.5.23 launched with
``--enable-return-aux-hidden-states --speculative-algorithm EAGLE3
[--return-aux-hidden-state-layer-ids ...]`` runs the target alone and answers requests that set
``return_hidden_states`` with the concatenated aux states of its EAGLE-3 capture convention, one
row per prompt position. Those rows are written as a speculators-layout dump (``hs_{i}.safetensors``)
for ``diagnose --data``, plus ``capture.json`` saying what was asked and what the slots are, when
the caller knows.

Capturing with the draft's own ids records what the engine really feeds it; comparing those rows
with a dump of known boundaries on the same tokens (``match_slots``) measures the served layout
instead of inferring it from the engine's source.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from . import cli
from .boundaries import parse_layout
from .conventions import read_target_config
from .dumps import open_dump, staged_dir
from .errors import BadOption, BadText, InputError, fail, print_json, read_text_file
from .pair import text_windows
from .sglang.server import http_json


class CaptureError(InputError):
    """The engine answered, but not with what a capture needs."""


def request_payload(input_ids: list[int]) -> dict:
    """One prefill, one greedy token: the prompt rows are what is kept."""
    return {"input_ids": list(map(int, input_ids)), "return_hidden_states": True,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}


def rows_from_response(body: dict, n_tokens: int, width: int | None = None) -> torch.Tensor:
    """``meta_info.hidden_states`` -> [n_tokens, W]. SGLang returns a list whose first entry holds the
    prefill's rows and whose later entries hold one row per generated token."""
    meta = (body or {}).get("meta_info") or {}
    hs = meta.get("hidden_states")
    if not hs:
        raise CaptureError("the engine returned no meta_info.hidden_states: launch it with "
                           "--enable-return-aux-hidden-states --speculative-algorithm EAGLE3 "
                           "(SGLang >= 0.5.23)")
    rows: list = []
    for part in hs:
        if part and isinstance(part[0], list):
            rows.extend(part)
        else:
            rows.append(part)
    if len(rows) < n_tokens:
        raise CaptureError(f"the engine returned {len(rows)} hidden-state rows for {n_tokens} prompt tokens")
    t = torch.tensor(rows[:n_tokens], dtype=torch.float32)
    if width is not None and t.shape[1] != width:
        raise CaptureError(f"rows are {t.shape[1]} wide; expected {width} (the earlier records' width)")
    return t


def capture_dump(url: str, windows: torch.Tensor, hidden: int, out, post=None, meta: dict | None = None,
                 progress: bool = False) -> Path:
    """POST each token window, split each row into k slots of ``hidden``, write a speculators dump."""
    if post is None:
        post = http_json
    out = Path(out)
    width = None
    with staged_dir(out) as stage:
        for i in tqdm(range(windows.shape[0]), desc="capture through the engine", disable=not progress):
            ids = windows[i].long()
            body = post(url.rstrip("/") + "/generate", request_payload(ids.tolist()))
            rows = rows_from_response(body, ids.numel(), width)
            width = rows.shape[1]
            if width % hidden:
                raise CaptureError(f"rows are {width} wide, not a multiple of the target's hidden size "
                                   f"{hidden}")
            hs = rows.view(ids.numel(), width // hidden, hidden).to(torch.bfloat16).contiguous()
            save_file({"hidden_states": hs, "token_ids": ids.contiguous()},
                      str(stage / f"hs_{i}.safetensors"))
        (stage / "capture.json").write_text(json.dumps({"engine_url": url, "records": int(windows.shape[0]),
                                                        "slots": width // hidden, **(meta or {})}, indent=2)
                                            + "\n")
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


def main(argv=None) -> int:
    ap = cli.parser("capture", __doc__)
    ap.add_argument("--engine-url", required=True,
                    help="a running SGLang server, e.g. http://127.0.0.1:30000")
    ap.add_argument("--tokenizer", type=Path, required=True,
                    help="the target's directory (tokenizer and config)")
    ap.add_argument("--text", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--records", type=int, default=8)
    ap.add_argument("--layer-ids", default=None,
                    help="the ids the server was launched with (recorded in capture.json)")
    ap.add_argument("--slot-boundaries", default=None, help="the slots' boundaries, when known (recorded)")
    ap.add_argument("--reference", type=Path, default=None,
                    help="a dump of known boundaries on the same text: measure which boundaries the engine "
                         "captured")
    a = ap.parse_args(argv)
    try:
        from transformers import AutoTokenizer

        if a.window < 8 or a.records < 1:
            raise BadOption(f"--window must be at least 8 and --records at least 1, got {a.window}, "
                            f"{a.records}")
        if not a.engine_url.startswith(("http://", "https://")):
            raise BadOption(f"--engine-url {a.engine_url!r}: expected http://HOST:PORT")
        cfg = read_target_config(a.tokenizer)
        text = read_text_file(a.text, "text file")
        tok = AutoTokenizer.from_pretrained(a.tokenizer)
        windows = text_windows(tok, text, a.window, a.records, min_windows=1)
        meta = {}
        if a.layer_ids:
            meta["layer_ids"] = list(parse_layout(a.layer_ids))
        if a.slot_boundaries:
            meta["slot_boundaries"] = list(parse_layout(a.slot_boundaries))
        out = capture_dump(a.engine_url, windows, cfg["hidden_size"], a.out, meta=meta, progress=True)
        print(f"wrote {out}")
        if a.reference is not None:
            print_json({"served_slots_measured": match_slots(out, a.reference)}, indent=2)
    except RuntimeError as exc:      # the engine refused the request (HTTP error body)
        return fail(exc)
    except (FileNotFoundError, ValueError, OSError) as exc:
        return fail(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
