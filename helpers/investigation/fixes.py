"""The ways out of a wiring mismatch, each producing a new draft directory (never editing one).

- Fix A (the seed's): make the engine capture what training used -- patch the engine where
  it cannot capture a boundary (``patch_sglang``), then give the draft config the ids that
  engine turns into the training layout.
- Fix C: SGLang concatenates in ascending capture order, so a draft trained on a
  non-ascending layout (say ``(7, 0, 3)``) can never be fed correctly by ids alone. Since
  ``fc`` is linear in its slots, permuting its column blocks is an exact fix.
- Fix B: retrain the draft on the layout the engine serves (``build.build_draft``).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..boundaries import WiringError
from ..errors import BadOption
from ..model.checkpoint import read_draft_weights
from ..record import read_record, write_record
from ..rules.conventions import DEFAULT_ENGINE, Engine, expect_engine, read_draft_config
from ..rules.sglang.source import fetch_sglang


def check_record_layout(draft, layout, before=None, target=None, num_layers: int | None = None) -> None:
    """A layout a user is about to record must be one this draft can have been trained on: distinct
    boundaries, as many as its fc has slots, none past the target's last (known from ``num_layers``,
    ``target``'s config, or the record already there, whose captured boundaries end at the target's
    final one). Refused with what was expected before anything is written."""
    from ..model.checkpoint import config_from_json
    from ..rules.conventions import read_target

    layout = list(layout)
    if len(set(layout)) != len(layout) or any(b < 0 for b in layout):
        raise BadOption(f"--layout {layout}: expected distinct boundaries >= 0, one per fc slot, e.g. 0,3,7")
    width = config_from_json(read_draft_config(draft)).num_aux
    if len(layout) != width:
        raise BadOption(f"--layout {layout} names {len(layout)} boundaries; the draft's fc takes {width}")
    if num_layers is None and target is not None:
        num_layers = read_target(target).num_layers
    where = "--num-layers" if num_layers is not None and target is None else f"{target}'s config"
    if num_layers is None and before is not None and before.captured_boundaries:
        num_layers = max(before.captured_boundaries)
        where = f"{before.path}'s captured_boundaries (the last is the target's final state)"
    if num_layers is not None and max(layout) > num_layers:
        raise BadOption(f"--layout {layout}: boundary {max(layout)} is past the target's last, {num_layers} "
                        f"(from {where}); expected boundaries 0..{num_layers}")


def _fresh_copy(draft_dir: Path, out_dir: Path) -> Path:
    draft_dir, out_dir = Path(draft_dir), Path(out_dir)
    read_draft_config(draft_dir)  # clear error when it is not a draft
    if out_dir.resolve() == draft_dir.resolve():
        raise BadOption(f"--out {out_dir} is the draft itself; write the fixed draft to a new directory (the "
                        f"original stays as it is)")
    if out_dir.exists():
        shutil.rmtree(out_dir)
    shutil.copytree(draft_dir, out_dir)
    return out_dir


def with_engine_ids(draft_dir, out_dir, ids: list[int], engine: Engine = DEFAULT_ENGINE, layout=None) -> Path:
    """A copy of the draft whose config makes ``engine`` serve the intended layout.

    Engines read different keys with different conventions: SGLang reads only the nested
    ``eagle_config`` ids (and maps them through its model's setter, usually id + 1), vLLM and
    speculators read the top-level ids as boundaries. Writing one list into both keys would
    make the copy mean two layouts, so each key present is written in its own reader's
    convention: for SGLang ``ids`` go nested and ``layout`` (boundaries) top level; for vLLM
    ``ids`` are the boundaries and the nested key gets SGLang's id + 1 inverse.
    """
    ids = [int(i) for i in ids]
    cfg = read_draft_config(draft_dir)
    has_top = "eagle_aux_hidden_state_layer_ids" in cfg
    has_nested = "eagle_aux_hidden_state_layer_ids" in (cfg.get("eagle_config") or {})
    if expect_engine(engine).rules.fix_writes_top_level:
        top, nested = ids, ([b - 1 for b in ids] if has_nested else None)
    else:
        if has_top and layout is None:
            raise BadOption("the draft also carries top-level (vLLM/speculators) ids; pass the layout those "
                            "ids should mean (--layout), so both engines serve the same boundaries")
        top, nested = ([int(b) for b in layout] if has_top else None), ids
    out = _fresh_copy(draft_dir, out_dir)
    cfg = json.loads((out / "config.json").read_text())
    if nested is not None:
        cfg.setdefault("eagle_config", {})["eagle_aux_hidden_state_layer_ids"] = nested
    if top is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = top
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    return out


def reorder_fc(draft_dir, out_dir, trained_layout, served_layout) -> Path:
    """A copy whose ``fc`` takes ``served_layout`` and computes what it computed on ``trained_layout``.

    Both layouts must hold the same boundaries; slot k of the new ``fc`` is the old slot
    that saw boundary ``served_layout[k]``.
    """
    trained, served = tuple(trained_layout), tuple(served_layout)
    if sorted(trained) != sorted(served) or len(set(trained)) != len(trained):
        raise WiringError(f"reordering needs the same distinct boundaries on both sides; "
                          f"trained {trained}, served {served}")
    out = _fresh_copy(draft_dir, out_dir)
    weights, source = read_draft_weights(out)  # any layout real drafts ship: .bin, sharded, model.-prefixed
    fc_keys = [k for k in weights if k == "fc.weight" or k.endswith(".fc.weight") and "midlayer" not in k]
    if len(fc_keys) != 1:
        raise WiringError(f"{source} should hold one fc weight; found {fc_keys or 'none'}")
    fc = weights[fc_keys[0]]
    k = len(trained)
    if fc.shape[1] % k:
        raise WiringError(f"fc.weight {tuple(fc.shape)} does not split into {k} slots")
    width = fc.shape[1] // k
    blocks = fc.split(width, dim=1)
    weights[fc_keys[0]] = torch.cat([blocks[trained.index(b)] for b in served], 1).contiguous()
    for stale in [f for f in out.iterdir()
                  if f.name.startswith(("model.safetensors", "pytorch_model", "model-"))]:
        stale.unlink()  # one weight file in the copy, so no loader can pick the unreordered one
    save_file({k: v.contiguous() for k, v in weights.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    if read_record(out) is not None:
        write_record(out, fc_reordered={"from": list(trained), "to": list(served)},
                     training_boundaries=list(served))
    return out


def sglang_working_copy(version: str, dest) -> Path:
    """A private copy of a cached SGLang version's source to patch, so the shared cache stays pristine."""
    dest = Path(dest)
    if (dest / "sglang").is_dir():
        return dest
    src = fetch_sglang(version)
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copytree(src.root / "sglang", dest / "sglang")
    for info in src.root.glob("sglang-*.dist-info"):
        shutil.copytree(info, dest / info.name)
    return dest
