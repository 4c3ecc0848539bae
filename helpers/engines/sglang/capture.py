"""What SGLang feeds an EAGLE-3 draft, captured into a speculators-layout dump, and measured.

One dump on disk (``hs_{i}.safetensors``: ``hidden_states [tokens, k, H]`` and ``token_ids``, plus
``capture.json``), written by either of two clients:

- ``capture_dump``: a server the user already runs (``capture --engine-url``), launched with
  ``--enable-return-aux-hidden-states --speculative-algorithm EAGLE3 [--return-aux-hidden-state-layer-ids
  ...]``. It runs the target alone and answers requests that set ``return_hidden_states`` with the
  concatenated aux states of its EAGLE-3 capture, one row per prompt position (``rows_from_response``).
- ``capture_sglang``: the workbook starts SGLang itself from ``.venv-sglang`` (``SGLangEngine``) with the
  draft, which the release reads its ids from as it does in deployment (under ``capture_rule`` another
  release's own setter runs inside the live runtime). Each window is prefilled once and the rows the
  draft's ``fc`` received for it (the engine's fc probe) are the record: the states the live engine
  really feeds the draft, not what a flag asks for. Each slot is then matched against the workbook's own
  fp32 forward at every boundary (``investigation.measured.match_boundaries``): ``measured_boundaries``
  in ``capture.json``, which ``check --measured`` reads.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from ... import net
from ...errors import InputError, one_line
from ...investigation.dumps import staged_dir
from ...investigation.measured import SlotMatch, match_boundaries
from ...rules.conventions import ids_in_config, read_draft_config
from .engine import SGLangEngine, SglangLaunch
from .install import SglangInstall

DEFAULT_TIMEOUT_S = 60.0   # per request: one prefill of one window, which a serving engine answers in seconds
MEASURED_RECORDS = 4       # records matched against the target's own forward (each is one target forward)


class CaptureError(InputError):
    """The engine answered, but not with what a capture needs."""


# --------------------------------------------------------------------------------------
# The dump, one writer for both clients


def save_record(stage: Path, i: int, token_ids: torch.Tensor, rows: torch.Tensor, hidden: int,
                dtype: torch.dtype = torch.bfloat16, where: str = "the engine") -> torch.Tensor:
    """Rows [tokens, k * hidden] -> ``hs_{i}.safetensors`` (speculators layout); returns the [tokens, k,
    hidden] states as written."""
    width = rows.shape[1]
    if width % hidden:
        raise CaptureError(f"{where}: rows are {width} wide, not a multiple of the target's hidden size "
                           f"{hidden}")
    hs = rows.reshape(rows.shape[0], width // hidden, hidden).to(dtype).contiguous()
    save_file({"hidden_states": hs, "token_ids": token_ids.long().contiguous()},
              str(stage / f"hs_{i}.safetensors"))
    return hs


def write_record_file(stage: Path, record: dict) -> None:
    (stage / "capture.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


# --------------------------------------------------------------------------------------
# A server the user already runs: capture --engine-url


def request_payload(input_ids: list[int]) -> dict:
    """One prefill, one greedy token: the prompt rows are what is kept."""
    return {"input_ids": list(map(int, input_ids)), "return_hidden_states": True,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}


# one window's hidden states as JSON: 256 rows of k slots of the target's width (Kimi-K2.5: 3 x 7168)
MAX_ANSWER_BYTES = 1 << 30


def _send(url: str, timeout: float, silent: str, payload: dict | None = None) -> bytes:
    """The body of one request (a GET, or a POST of ``payload``); every way a connection can fail becomes
    one CaptureError naming ``url`` (``silent`` ends the line for a server that accepted and said nothing).
    An HTTP error status is the caller's to judge, so it passes through as ``net.HTTPStatus``."""
    try:
        if payload is None:
            return net.get(url, deadline_s=timeout, max_bytes=MAX_ANSWER_BYTES).body
        return net.post_json(url, payload, deadline_s=timeout, max_bytes=MAX_ANSWER_BYTES).body
    except net.HTTPStatus:
        raise
    except net.DeadlineExceeded:
        raise CaptureError(f"no answer from {url} within {timeout:g} s{silent}") from None
    except net.TooLarge as exc:
        raise CaptureError(f"{exc}; expected one window's hidden states") from None
    except net.NotHTTP as exc:
        raise CaptureError(f"{exc}; expected SGLang's HTTP API at --engine-url") from None
    except net.NetError as exc:
        why = str(exc).removeprefix(f"{url}: ")
        raise CaptureError(f"cannot reach the engine at {url}: {why}; expected a running SGLang server "
                           f"(--engine-url)") from None


def post_json(url: str, payload: dict, timeout: float = DEFAULT_TIMEOUT_S) -> object:
    """POST one request; every way a server can misbehave becomes one CaptureError naming the URL,
    so a user sees which server failed and how, never a socket-level traceback."""
    try:
        raw = _send(url, timeout, " (--timeout); is the engine overloaded or hung?", payload)
    except net.HTTPStatus as exc:
        body = exc.body.decode(errors="replace")[:300]
        raise CaptureError(f"POST {url} -> HTTP {exc.code}: {body or exc.reason}") from None
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


PROBE_S = 10.0     # a running server answers /health at once, whatever its load


def probe(url: str, timeout: float = PROBE_S) -> None:
    """GET ``/health`` first: a server that accepts and never answers is named in seconds, before any
    window is sent or any folder is made. Any HTTP answer will do: /generate is judged request by request."""
    health = url.rstrip("/") + "/health"
    try:
        _send(health, timeout, "; expected a running SGLang server at --engine-url (it accepted the "
                               "connection and said nothing)")
    except net.HTTPStatus:
        return


def capture_dump(url: str, windows: torch.Tensor, hidden: int, out, post=None, meta: dict | None = None,
                 progress: bool = False, timeout: float = DEFAULT_TIMEOUT_S) -> Path:
    """POST each token window, split each row into k slots of ``hidden``, write a speculators dump."""
    if post is None:
        probe(url, min(PROBE_S, timeout))

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
            save_record(stage, i, ids, rows, hidden)
        write_record_file(stage, {"engine_url": url, "records": int(windows.shape[0]),
                                  "slots": width // hidden, **(meta or {})})
    return out


# --------------------------------------------------------------------------------------
# SGLang started by the workbook: capture --backend sglang


@dataclass
class SglangCapture:
    """What ``capture_sglang`` wrote and measured."""

    out: Path
    version: str                       # the runtime that ran
    rules: str                         # 'runtime 0.5.23[, capture rule 0.5.9]'
    ids: list[int]                     # the ids the live setter got (from the draft, as the release reads it)
    layers_to_capture: list[int] | None   # what the live setter left (the hooks' record), None unrecorded
    matches: list[SlotMatch]           # each slot against every boundary of the target's own forward
    records: int
    tokens: int
    start_seconds: float
    seconds: float

    @property
    def measured(self) -> list[int | None]:
        return [m.boundary for m in self.matches]


def _fc_rows(engine: SGLangEngine, ids: list[int], previous: torch.Tensor | None, same_tokens: bool,
             timeout: float, where: str) -> torch.Tensor:
    """Prefill one window and return what the draft's fc received for it: the probe keeps the latest
    input per row count, so it is read until it is this window's (a new tensor, or the same one when the
    window repeats the last window's tokens)."""
    n = len(ids)
    engine.generate([ids], 1)
    deadline = time.monotonic() + timeout
    while True:
        x = engine.fc_inputs().get(n)
        if x is not None and (previous is None or same_tokens or not torch.equal(x, previous)):
            return x
        if time.monotonic() > deadline:
            raise CaptureError(f"{where}: the draft's fc received no {n}-row input within {timeout:g} s "
                               f"(log: {engine.log_path})")
        time.sleep(0.05)


def capture_sglang(install: SglangInstall, target_dir: Path, draft_dir: Path, windows: torch.Tensor,
                   out: Path, *, target=None, hidden: int, capture_rule: str | None = None, steps: int = 3,
                   meta: dict | None = None, progress: bool = True, threads: int | None = 2,
                   start_timeout: float = 600.0, timeout: float = DEFAULT_TIMEOUT_S,
                   log_dir: Path | None = None) -> SglangCapture:
    """Start SGLang with the draft (``capture_rule``: the release whose setter runs), capture what the
    draft's fc receives for each window, write the dump under ``out`` (staged: nothing is left behind on
    failure; the engine is stopped on every exit) and measure each slot against ``target``'s own fp32
    forward (the loaded Hugging Face target; None skips the measurement)."""
    started = time.perf_counter()
    out = Path(out)
    n = int(windows.shape[1])
    spec = SglangLaunch(target_dir, draft_dir, steps=steps, context_length=max(n + steps + 64, 256),
                        capture_rule=capture_rule, probe=True)
    records: list[tuple[torch.Tensor, torch.Tensor]] = []
    with staged_dir(out) as stage:
        with SGLangEngine(install, spec, threads=threads, progress=progress, start_timeout=start_timeout,
                          log_dir=log_dir) as engine:
            previous, width = None, None
            for i in tqdm(range(windows.shape[0]), desc=f"capture through SGLang {engine.version}",
                          disable=not progress):
                tok = windows[i].long()
                same = i > 0 and torch.equal(tok, windows[i - 1].long())
                rows = _fc_rows(engine, tok.tolist(), previous, same, timeout, f"window {i}")
                if width is not None and rows.shape[1] != width:
                    raise CaptureError(f"window {i}: the draft's fc received rows {rows.shape[1]} wide; the "
                                       f"earlier windows' were {width}")
                previous, width = rows, rows.shape[1]
                # the rows the draft received, kept at their own precision (fp32 launches: fp32)
                hs = save_record(stage, i, tok, rows, hidden, dtype=torch.float32, where=f"window {i}")
                records.append((tok, hs))
            captures, record = engine.captures(), engine.record()
            version, rules = engine.version, engine.rules
        if captures:
            last = captures[-1]
            ids, layers = [int(x) for x in last["ids"]], [int(x) for x in last["layers_to_capture"]]
        else:        # a launch without the hooks (a GPU host, no rule): the ids as the config carries them
            ids, layers = list(ids_in_config(read_draft_config(draft_dir))[0] or []), None
        k = records[0][1].shape[1]
        slot_ids = sorted(ids) if len(ids) == k else list(range(k))
        matches = (match_boundaries(target, records[:MEASURED_RECORDS], slot_ids)
                   if target is not None else [])
        measured = [m.boundary for m in matches] if matches else None
        complete = bool(measured) and None not in measured and len(set(measured)) == len(measured)
        write_record_file(stage, {
            "engine": f"sglang=={version}" + (f", capture rule {capture_rule}" if capture_rule else ""),
            "rules": rules, "capture_rule": capture_rule,
            "engine_url": f"sglang=={version} ({install.device}, started from {install.venv.name})",
            "records": int(windows.shape[0]), "slots": k, "layer_ids": ids,
            "layers_to_capture": layers, "measured_boundaries": measured,
            "slot_matches": [asdict(m) for m in matches],
            **({"slot_boundaries": measured} if complete else {}),
            "accommodations": [a["name"] for a in record["accommodations"]],
            **(meta or {})})
    return SglangCapture(out, version, rules, ids, layers, matches, int(windows.shape[0]), n,
                         float(record["start_seconds"]), round(time.perf_counter() - started, 2))
