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

import http.client
import json
import math
import socket
import sys
import urllib.error
import urllib.request
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from .. import cli
from ..boundaries import parse_layout
from ..errors import BadConfig, BadOption, BadText, InputError, fail, one_line, print_json, read_text_file
from ..investigation.dumps import check_new_dir, open_dump, staged_dir
from ..investigation.pair import text_windows
from ..live.vllm.capture import capture_vllm
from ..live.vllm.install import find_vllm
from ..model.target import load_target
from ..rules.conventions import read_draft_config, read_target, read_target_config
from ..rules.wiring import resolve

DEFAULT_TIMEOUT_S = 60.0   # per request: one prefill of one window, which a serving engine answers in seconds


class CaptureError(InputError):
    """The engine answered, but not with what a capture needs."""


def request_payload(input_ids: list[int]) -> dict:
    """One prefill, one greedy token: the prompt rows are what is kept."""
    return {"input_ids": list(map(int, input_ids)), "return_hidden_states": True,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}


def post_json(url: str, payload: dict, timeout: float = DEFAULT_TIMEOUT_S) -> object:
    """POST one request; every way a server can misbehave becomes one CaptureError naming the URL,
    so a user sees which server failed and how, never a socket-level traceback."""
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace")[:300]
        raise CaptureError(f"POST {url} -> HTTP {exc.code}: {body or exc.reason}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (TimeoutError, socket.timeout)):
            raise CaptureError(f"no answer from {url} within {timeout:g} s (--timeout); is the engine "
                               f"overloaded or hung?") from None
        why = getattr(reason, "strerror", None) or str(reason)
        raise CaptureError(f"cannot reach the engine at {url}: {why}; expected a running SGLang server "
                           f"(--engine-url)") from None
    except (TimeoutError, socket.timeout):
        raise CaptureError(f"no answer from {url} within {timeout:g} s (--timeout); is the engine "
                           f"overloaded or hung?") from None
    except (http.client.HTTPException, ConnectionError) as exc:
        raise CaptureError(f"{url} did not answer as an HTTP server ({type(exc).__name__}: "
                           f"{str(exc)[:120]!r}); expected SGLang's HTTP API at --engine-url") from None
    try:
        return json.loads(raw.decode("utf-8") or "null")
    except (UnicodeDecodeError, ValueError):
        start = raw[:60].decode("utf-8", errors="replace")
        raise CaptureError(f"{url} answered with a body that is not JSON (it starts {start!r}); expected "
                           f"SGLang's /generate reply") from None


def rows_from_response(body: dict, n_tokens: int, width: int | None = None, where: str = "the engine"
                       ) -> torch.Tensor:
    """``meta_info.hidden_states`` -> [n_tokens, W]. SGLang returns a list whose first entry holds the
    prefill's rows and whose later entries hold one row per generated token."""
    if not isinstance(body, dict):
        raise CaptureError(f"{where} answered a JSON {type(body).__name__}; expected an object with "
                           f"meta_info.hidden_states (SGLang's /generate reply)")
    meta = body.get("meta_info") or {}
    if not isinstance(meta, dict):
        raise CaptureError(f"{where} answered meta_info as a JSON {type(meta).__name__}; expected an object")
    hs = meta.get("hidden_states")
    if not hs:
        raise CaptureError("the engine returned no meta_info.hidden_states: launch it with "
                           "--enable-return-aux-hidden-states --speculative-algorithm EAGLE3 "
                           "(SGLang >= 0.5.23)")
    if not isinstance(hs, list):
        raise CaptureError(f"{where} answered meta_info.hidden_states as a JSON {type(hs).__name__}; "
                           f"expected a list of rows")
    rows: list = []
    for part in hs:
        if isinstance(part, list) and part and isinstance(part[0], list):
            rows.extend(part)
        else:
            rows.append(part)
    if len(rows) < n_tokens:
        raise CaptureError(f"{where} returned {len(rows)} hidden-state rows for {n_tokens} prompt tokens")
    try:
        t = torch.tensor(rows[:n_tokens], dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise CaptureError(f"{where} returned hidden-state rows that are not a table of numbers "
                           f"({one_line(exc)[:120]})") from None
    if t.dim() != 2:
        raise CaptureError(f"{where} returned hidden states of shape {tuple(t.shape)}; expected one row of "
                           f"numbers per prompt token")
    bad = int((~torch.isfinite(t)).sum())
    if bad:
        row = int((~torch.isfinite(t)).any(1).nonzero()[0])
        raise CaptureError(f"{where} returned {bad} non-finite values (NaN or Inf; first in row {row}); a "
                           f"dump of them cannot be scored, so nothing was written")
    if width is not None and t.shape[1] != width:
        raise CaptureError(f"rows are {t.shape[1]} wide; expected {width} (the earlier records' width)")
    return t


def capture_dump(url: str, windows: torch.Tensor, hidden: int, out, post=None, meta: dict | None = None,
                 progress: bool = False, timeout: float = DEFAULT_TIMEOUT_S) -> Path:
    """POST each token window, split each row into k slots of ``hidden``, write a speculators dump."""
    if post is None:
        def post(u, payload):
            return post_json(u, payload, timeout)
    out = Path(out)
    width = None
    endpoint = url.rstrip("/") + "/generate"
    with staged_dir(out) as stage:
        for i in tqdm(range(windows.shape[0]), desc="capture through the engine", disable=not progress):
            ids = windows[i].long()
            body = post(endpoint, request_payload(ids.tolist()))
            rows = rows_from_response(body, ids.numel(), width, where=f"{endpoint} (record {i})")
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
    argv = list(sys.argv[1:] if argv is None else argv)
    if any(x in ("--backend=vllm",) for x in argv) or any(
            x == "--backend" and i + 1 < len(argv) and argv[i + 1] == "vllm" for i, x in enumerate(argv)):
        return _main_vllm(argv)      # the real engine's own extraction, on this host
    ap = cli.parser("capture", __doc__)
    ap.add_argument("--engine-url", required=True,
                    help="a running SGLang server, e.g. http://127.0.0.1:30000")
    ap.add_argument("--tokenizer", type=Path, required=True,
                    help="the target's directory (tokenizer and config)")
    ap.add_argument("--text", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--records", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S,
                    help=f"seconds to wait for each request's answer (default {DEFAULT_TIMEOUT_S:g})")
    ap.add_argument("--layer-ids", default=None,
                    help="the ids the server was launched with (recorded in capture.json)")
    ap.add_argument("--slot-boundaries", default=None, help="the slots' boundaries, when known (recorded)")
    ap.add_argument("--reference", type=Path, default=None,
                    help="a dump of known boundaries on the same text: measure which boundaries the engine "
                         "captured")
    argv = list(sys.argv[1:] if argv is None else argv)
    a = ap.parse_args(cli.glue_option_values(argv, "--layer-ids", "--slot-boundaries"))
    try:
        from transformers import AutoTokenizer

        if a.window < 8 or a.records < 1:
            raise BadOption(f"--window must be at least 8 and --records at least 1, got {a.window}, "
                            f"{a.records}")
        if not math.isfinite(a.timeout) or a.timeout <= 0:
            raise BadOption(f"--timeout must be a positive number of seconds, got {a.timeout:g}")
        if not a.engine_url.startswith(("http://", "https://")):
            raise BadOption(f"--engine-url {a.engine_url!r}: expected http://HOST:PORT")
        cfg = read_target_config(a.tokenizer)
        hidden = cfg.get("hidden_size")
        if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1:
            raise BadConfig(f"{Path(a.tokenizer) / 'config.json'} has no integer hidden_size (got "
                            f"{hidden!r}); expected the target's config beside its tokenizer")
        meta = {}
        if a.layer_ids:
            meta["layer_ids"] = cli.parse_int_list(a.layer_ids, "--layer-ids")
        if a.slot_boundaries:
            meta["slot_boundaries"] = list(parse_layout(a.slot_boundaries))
        if a.reference is not None:      # checked before the capture, not after minutes of it
            ref = open_dump(a.reference)
            if ref.hidden != hidden:
                raise BadText(f"--reference {ref.root} is {ref.hidden} wide; the target at {a.tokenizer} has "
                              f"hidden_size {hidden}")
        check_new_dir(a.out)
        text = read_text_file(a.text, "text file")
        tok = AutoTokenizer.from_pretrained(a.tokenizer)
        windows = text_windows(tok, text, a.window, a.records, min_windows=1)
        out = capture_dump(a.engine_url, windows, hidden, a.out, meta=meta, progress=True, timeout=a.timeout)
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


def _main_vllm(argv: list[str]) -> int:
    """``capture --backend vllm``: the real engine's extraction with the draft's own ids, measured."""
    ap = cli.parser("capture", "hidden states through vLLM's own extraction, measured against boundaries")
    ap.add_argument("--backend", choices=("vllm",), required=True)
    ap.add_argument("--target", type=Path, required=True, help="the target's Hugging Face folder")
    ap.add_argument("--draft", type=Path, default=None,
                    help="the draft whose ids vLLM reads (as this release reads them)")
    ap.add_argument("--layer-ids", default=None, help="ids to extract instead of the draft's, e.g. 0,3,7")
    ap.add_argument("--text", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--window", type=int, default=256)
    ap.add_argument("--records", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(cli.glue_option_values(argv, "--layer-ids"))
    try:
        if (a.draft is None) == (a.layer_ids is None):
            raise BadOption("give --draft DIR (its ids, as vLLM reads them) or --layer-ids a,b,c "
                            "(one of them)")
        if a.window < 8 or a.records < 1:
            raise BadOption(f"--window must be at least 8 and --records at least 1, got {a.window}, "
                            f"{a.records}")
        check_new_dir(a.out)
        install = find_vllm()
        tspec = read_target(a.target)
        text = read_text_file(a.text, "text file")
        arch, layers = tspec.arch or "", tspec.num_layers
        if a.draft is not None:
            plan = resolve(install.engine, arch, layers, draft=read_draft_config(a.draft))
            ids, predicted = list(plan.layers_to_capture), list(plan.served_layout)
        else:
            ids = cli.parse_int_list(a.layer_ids, "--layer-ids")
            plan = resolve(install.engine, arch, layers, ids=ids)
            predicted = list(plan.served_layout)
        target, tok = load_target(a.target)
        limit = int(tspec.config.get("max_position_embeddings") or a.window)
        if a.window > limit:
            raise BadOption(f"--window {a.window} exceeds the target's {limit} positions")
        windows = text_windows(tok, text, a.window, a.records, min_windows=1)
        out, matches = capture_vllm(install, a.target, windows, ids, a.out, target=target,
                                    meta={"predicted_layout": predicted, "rules": str(install.engine),
                                          "draft": str(a.draft) if a.draft else None})
    except (InputError, FileNotFoundError, OSError, ValueError) as exc:
        return fail(exc)
    measured = [m.boundary for m in matches]
    if a.json:
        print_json({"dump": str(out), "layer_ids": sorted(set(ids)), "predicted_layout": predicted,
                    "measured_boundaries": measured, "slot_matches": [asdict(m) for m in matches]},
                   indent=2)
    else:
        print(f"wrote {out} ({windows.shape[0]} records of {windows.shape[1]} tokens, "
              f"vLLM {install.version})")
        for m in matches:
            print(f"  slot {m.slot}: id {m.layer_id} -> boundary {m.boundary} "
                  f"(max abs diff {m.max_abs_diff:.2e})")
        agree = measured == sorted(predicted)
        print(f"  predicted {tuple(predicted)} by {install.engine}'s rules; measured {tuple(measured)}: "
              f"{'the prediction holds' if agree else 'THEY DIFFER'}")
    return 0 if measured == sorted(predicted) else 1
