"""The served layout measured, not inferred: vLLM's own hidden-state extraction, matched to boundaries.

``capture --backend vllm`` starts the real engine with ``method: extract_hidden_states`` and the
draft's own ids (as the release reads them), runs each text window through it, and writes what vLLM
saved as a speculators (>= 0.5) dump: ``hs_{i}.safetensors`` with ``hidden_states [tokens, k, H]``
and ``token_ids``, the layout that trainer reads. Then every slot is compared with the workbook's
own capture of every boundary on the same tokens (HF ``hidden_states[b]``, fp32): the boundary it
equals and its max abs difference go into ``capture.json`` as ``measured_boundaries`` (null where no
boundary matches), so ``diagnose --data`` on the dump closes the loop from the engine to training.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from ...errors import InputError
from ...investigation.dumps import staged_dir
from ...investigation.measured import SlotMatch, match_boundaries
from ...rules.conventions import read_target
from .bench import fixes_for
from .engine import LaunchSpec, VllmEngine
from .install import VllmInstall


class CaptureMismatch(InputError):
    """What vLLM saved does not line up with the tokens asked for."""


def _wait_for(storage: Path, count: int, timeout: float) -> list[Path]:
    """At least ``count - 1`` files (the flush request's own file needs yet another step)."""
    deadline = time.monotonic() + timeout
    while True:
        files = sorted(storage.glob("*.safetensors"))
        if len(files) >= count - 1 or time.monotonic() > deadline:
            return files
        time.sleep(0.05)


def capture_vllm(install: VllmInstall, target_dir: Path, windows: torch.Tensor, ids: list[int], out: Path,
                 *, target=None, meta: dict | None = None, progress: bool = True, timeout: float = 120.0,
                 log_dir: Path | None = None) -> tuple[Path, list[SlotMatch]]:
    """Write the dump under ``out`` (staged: nothing is left behind on failure) and measure its slots."""
    ids = sorted(set(int(i) for i in ids))          # vLLM captures ascending, de-duplicated
    out = Path(out)
    with staged_dir(out) as stage:
        storage = stage / ".vllm-extract"
        storage.mkdir()
        spec = LaunchSpec(target_dir, extract_ids=tuple(ids), storage=storage, device=install.device,
                          max_model_len=int(windows.shape[1]) + 16,
                          fixes=fixes_for(read_target(target_dir), tuple(ids), install))
        records = []
        n = int(windows.shape[1])
        with VllmEngine(install, spec, progress=progress, log_dir=log_dir) as engine:
            for i in tqdm(range(windows.shape[0]), desc="capture through vLLM", disable=not progress):
                engine.generate([windows[i].tolist()], 1)
            # vLLM saves a finished request's states on the scheduler's next step: one more request
            # flushes the last window's file.
            engine.generate([windows[0, :2].tolist()], 1)
            files = _wait_for(storage, windows.shape[0] + 1, timeout)
            version = engine.version
        by_tokens = {}
        for f in files:
            saved = load_file(str(f))
            by_tokens[tuple(saved["token_ids"].long()[:n].tolist())] = (f, saved)
        for i in range(windows.shape[0]):
            key = tuple(windows[i].long().tolist())
            if key not in by_tokens:
                raise CaptureMismatch(f"vLLM saved no hidden states for window {i} under {storage} "
                                      f"({len(files)} files for {windows.shape[0]} windows)")
            f, saved = by_tokens[key]
            hs, tok = saved["hidden_states"], saved["token_ids"].long()
            if hs.dim() != 3 or hs.shape[0] < n or hs.shape[1] != len(ids):
                raise CaptureMismatch(f"{f}: hidden_states {tuple(hs.shape)} for ids {ids}; expected "
                                      f"[{n}, {len(ids)}, H] for the window's {n} tokens")
            hs, tok = hs[:n].float().contiguous(), tok[:n].contiguous()
            save_file({"hidden_states": hs, "token_ids": tok}, str(stage / f"hs_{i}.safetensors"))
            records.append((tok, hs))
        for f in storage.iterdir():
            f.unlink()
        storage.rmdir()
        matches = match_boundaries(target, records[:4], ids) if target is not None else []
        measured = [m.boundary for m in matches] if matches else None
        (stage / "capture.json").write_text(json.dumps({
            "engine": f"vllm=={version}", "engine_url": f"vllm=={version} (offline, {install.dist})",
            "records": int(windows.shape[0]), "slots": len(ids), "layer_ids": ids,
            "measured_boundaries": measured,
            "slot_matches": [asdict(m) for m in matches],
            **({"slot_boundaries": measured} if measured and None not in measured else {}),
            **(meta or {})}, indent=2) + "\n", encoding="utf-8")
    return out, matches


