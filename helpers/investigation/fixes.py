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
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import torch
from safetensors.torch import save_file

from ..boundaries import ExitCode, WiringError
from ..engines.sglang.source import fetch_sglang
from ..errors import BadOption
from ..model.checkpoint import read_draft_weights
from ..record import read_record, write_record
from ..rules.conventions import DEFAULT_ENGINE, IDS_KEY, Engine, expect_engine, read_draft_config
from ..rules.wiring import ids_for_layout


def check_record_layout(draft, layout, before=None, target=None, num_layers: int | None = None) -> str | None:
    """A layout a user is about to record must be one this draft can have been trained on: distinct
    boundaries, as many as its fc has slots, none past the target's last (known from ``num_layers``,
    ``target``'s config, the record already there, whose captured boundaries end at the target's final
    one, or a ``target`` folder beside the draft). Refused with what was expected before anything is
    written; returns why the last boundary could not be checked, when it could not."""
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
    beside = Path(draft).resolve().parent / "target"
    if num_layers is None and (beside / "config.json").is_file():
        num_layers, where = read_target(beside).num_layers, f"{beside}'s config (beside the draft)"
    if num_layers is None:
        return ("the boundaries were not checked against the target's layer count: pass --target DIR (or "
                "--num-layers N) to check that none is past its last")
    if max(layout) > num_layers:
        raise BadOption(f"--layout {layout}: boundary {max(layout)} is past the target's last, {num_layers} "
                        f"(from {where}); expected boundaries 0..{num_layers}")
    return None


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
    cfg = json.loads((out / "config.json").read_text(encoding="utf-8"))
    if nested is not None:
        cfg.setdefault("eagle_config", {})["eagle_aux_hidden_state_layer_ids"] = nested
    if top is not None:
        cfg["eagle_aux_hidden_state_layer_ids"] = top
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
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


# --------------------------------------------------------------------------------------
# One deployable copy for every engine named, proven by their own rules before it is written


@dataclass(frozen=True)
class EngineFix:
    """What one engine needs from the copy, and what its rules say the written copy serves."""

    engine: str
    ids: tuple[int, ...] | None      # the ids this engine turns into the trained layout (None: none do)
    key: str | None                  # where it reads them: eagle_config or top-level (the config's keys)
    served: tuple[int, ...] | None = None   # what ``check`` says the written copy serves on it
    verdict: str = ""                # ``check``'s verdict on the written copy, or why no copy serves it
    folder: Path | None = None       # the copy that serves it
    then: str | None = None          # what is left to do with the copy (llama.cpp: convert it to GGUF)

    @property
    def ok(self) -> bool:
        return self.folder is not None and self.verdict.startswith("OK")


@dataclass(frozen=True)
class Deployment:
    """``fixes deploy``'s outcome: one copy when one config serves every engine named, else one per
    engine; nothing is written unless every engine's rules, run on the copy, serve the trained layout."""

    draft: Path
    out: Path
    trained: tuple[int, ...]
    fmt: str                          # the format written (sglang or speculators)
    fixes: tuple[EngineFix, ...]
    shared: bool                      # one copy (``out``) serves every engine
    converted: bool                   # the weights and config were rewritten into another format
    reordered: bool                   # the fc slots were permuted into ascending order first
    dropped: tuple[str, ...] = ()     # ids keys the source carried that no engine named reads

    @property
    def ok(self) -> bool:
        return bool(self.fixes) and all(f.ok for f in self.fixes)

    @property
    def exit_code(self) -> int:
        return ExitCode.OK if self.ok else ExitCode.PROBLEM

    def to_dict(self) -> dict:
        return {"draft": str(self.draft), "out": str(self.out), "trained": list(self.trained),
                "format": self.fmt, "shared": self.shared, "converted": self.converted,
                "reordered": self.reordered, "dropped": list(self.dropped), "ok": self.ok,
                "exit_code": self.exit_code,
                "engines": [{"engine": f.engine, "ids": None if f.ids is None else list(f.ids), "key": f.key,
                             "served": None if f.served is None else list(f.served), "ok": f.ok,
                             "verdict": f.verdict, "folder": None if f.folder is None else str(f.folder),
                             "then": f.then} for f in self.fixes]}


LAUNCH_OPTIONS = "launch-options"    # TensorRT-LLM: the ids go in the options file written beside the draft
_KEYS = {"eagle_config": "eagle_config", "top-level": "top-level", "gguf-conversion": "top-level",
         "speculative-config": LAUNCH_OPTIONS}
NO_BOUNDARY0 = ("boundary 0 (the embedding output) cannot be expressed in TensorRT-LLM's "
                "eagle3_layers_to_capture: id k is layer k's output (boundary k + 1) and -1 the state after "
                "the final norm, so no id names the embedding; what does: retrain the draft on boundaries "
                ">= 1")


def _engine_needs(trained: tuple[int, ...], engine: Engine, arch: str, num_layers: int,
                  cfg: dict, target_config: dict | None = None) -> EngineFix:
    """The ids and key one engine needs to serve ``trained`` (already ascending), from its own rule."""
    from ..rules.wiring import resolve
    from .verdict import ways_out

    eng = expect_engine(engine)
    try:
        served = tuple(resolve(eng, arch, num_layers, draft=cfg, target_config=target_config).served_layout)
    except (WiringError, ValueError):
        served = ()
    key = _KEYS.get(eng.rules.fix_ids_at)
    ids = None
    try:
        ids = ids_for_layout(trained, arch, num_layers, eng)
    except (WiringError, ValueError):
        ids = None
    if not eng.rules.ids_serve:     # LMDeploy: the target's depth alone decides what it serves
        why = ("no copy is needed: it already serves the trained layout" if served == trained
               else f"retrain the draft on what it serves, {served}")
        return EngineFix(str(eng), None, None, served=served,
                         verdict=f"no config changes what {eng} serves (the target's depth alone sets its "
                                 f"capture: {served or 'nothing'}): {why}")
    if key is None:
        return EngineFix(str(eng), None if ids is None else tuple(ids), None,
                         verdict=f"{eng} reads the ids from its launch settings, not the draft: "
                                 f"{ways_out(trained, served, eng, arch, num_layers).listed}")
    if ids is None:
        ways = ways_out(trained, served, eng, arch, num_layers)
        why = f"{NO_BOUNDARY0}; " if key == LAUNCH_OPTIONS and 0 in trained else ""
        where = "in its launch options" if key == LAUNCH_OPTIONS else "in the draft"
        return EngineFix(str(eng), None, key,
                         verdict=f"no ids {where} make {eng} serve {trained}: {why}{ways.listed}")
    then = ("convert it: convert_hf_to_gguf.py COPY --target-model-dir TARGET (llama.cpp's converter "
            "fixes the ids into the GGUF)" if eng.rules.fix_ids_at == "gguf-conversion" else None)
    return EngineFix(str(eng), tuple(ids), key, then=then)


def _write_copy(dest: Path, draft: Path, cfg: dict, fmt: str, ids: dict[str, list[int]],
                weights: dict | None) -> list[str]:
    """``dest`` as a copy of ``draft`` in ``fmt`` holding exactly the ids keys in ``ids``; returns the keys
    the source carried that were left out."""
    from ..model.checkpoint import config_from_json, config_to_json

    shutil.copytree(draft, dest)
    if LAUNCH_OPTIONS in ids:         # TensorRT-LLM: its options file beside the draft, the draft as it is
        from ..engines.trtllm.options import OPTIONS_FILE, options_text

        (dest / OPTIONS_FILE).write_text(options_text(ids[LAUNCH_OPTIONS], dest), encoding="utf-8")
        ids = {k: v for k, v in ids.items() if k != LAUNCH_OPTIONS}
        if not ids and weights is None:
            return []
    out_cfg = dict(cfg)
    if weights is not None:           # another format: the config and one weights file rewritten
        parsed = config_from_json(cfg)
        out_cfg = config_to_json(replace(parsed, eagle_ids=None), fmt)
        prefix = "midlayer." if fmt == "sglang" else "layers.0."
        renamed = {}
        for k, v in weights.items():
            name = k[len("model."):] if k.startswith("model.") else k
            for old in ("midlayer.", "layers.0."):
                if name.startswith(old):
                    name = prefix + name[len(old):]
            renamed[name] = v.contiguous()
        for stale in [f for f in dest.iterdir()
                      if f.name.startswith(("model.safetensors", "pytorch_model", "model-"))]:
            stale.unlink()
        save_file(renamed, str(dest / "model.safetensors"), metadata={"format": "pt"})
    dropped = []
    nested = dict(out_cfg.get("eagle_config") or {})
    had_nested = IDS_KEY in (cfg.get("eagle_config") or {})
    had_top = IDS_KEY in cfg
    nested.pop(IDS_KEY, None)
    out_cfg.pop(IDS_KEY, None)
    if "eagle_config" in ids:
        nested[IDS_KEY] = ids["eagle_config"]
        nested.setdefault("use_aux_hidden_state", True)
    elif had_nested:
        dropped.append(f"eagle_config.{IDS_KEY} {cfg['eagle_config'][IDS_KEY]}")
    if "top-level" in ids:
        out_cfg[IDS_KEY] = ids["top-level"]
    elif had_top:
        dropped.append(f"top-level {IDS_KEY} {cfg[IDS_KEY]}")
    if nested:
        out_cfg["eagle_config"] = nested
    else:
        out_cfg.pop("eagle_config", None)
    (dest / "config.json").write_text(json.dumps(out_cfg, indent=2) + "\n", encoding="utf-8")
    return dropped


def _judge(folder: Path, fix: EngineFix, engine: Engine, target: Path) -> EngineFix:
    """``check`` on the written copy, as the user would run it."""
    from ..engines.trtllm.options import OPTIONS_FILE
    from .gate import check

    options = folder / OPTIONS_FILE if fix.key == LAUNCH_OPTIONS else None
    report = check(folder, engine, target=target, across_releases=False, trtllm_options=options)
    return replace(fix, served=tuple(report.served_layout), verdict=report.verdict,
                   folder=folder if report.ok else None)


def deploy(draft, out, engines: Sequence[Engine], *, target, layout: Sequence[int] | None = None,
           progress=None) -> Deployment:
    """A deployable copy of ``draft`` for every engine in ``engines``: the format each loads (SGLang's when
    one named cannot read speculators'), each engine's ids from its own rule (never copied across
    conventions), the fc permuted when the trained order is not ascending, the training record kept.
    ``check`` runs on the copy for every engine before it lands at ``out``; when no single config serves
    them all, ``out/<engine>/`` holds one each. Nothing lands unless every engine is served."""
    from ..model.checkpoint import draft_format
    from ..rules.conventions import read_target

    draft, out = Path(draft).expanduser(), Path(out).expanduser()
    cfg = read_draft_config(draft)
    if draft.is_file():
        draft = draft.parent
    if not engines:
        raise BadOption("name at least one engine (--engine sglang==0.5.23, --engine vllm==0.34.0, ...)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise BadOption(f"--out {out} exists and is not empty; expected a new folder (nothing was written)")
    if out.resolve() == draft.resolve() or draft.resolve() in out.resolve().parents:
        raise BadOption(f"--out {out} is inside the draft {draft}; expected a folder of its own")
    spec = read_target(target)
    if spec.arch is None or not isinstance(spec.num_layers, int):
        raise BadOption(f"{target}: its config names no architectures or no num_hidden_layers")
    rec = read_record(draft)
    engines = [expect_engine(e) for e in engines]
    source = "user"
    if layout is None:      # the one chain every command asks (``evidence.training_evidence``)
        from .evidence import training_evidence

        ev = training_evidence(draft, cfg, engine=engines[0], arch=spec.arch, num_layers=spec.num_layers,
                               read_source=True)
        if not ev.settled:
            raise BadOption(f"{draft}: what it was trained on is not settled ({ev.note}); give --layout, or "
                            f"settle it: {ev.settle(draft)}")
        layout, source = ev.layout, str(ev.basis)
    trained = tuple(int(b) for b in layout)
    check_record_layout(draft, trained, rec, target)
    ascending = tuple(sorted(trained))
    needs = [_engine_needs(ascending, e, spec.arch, spec.num_layers, cfg, spec.config) for e in engines]
    src_fmt = draft_format(cfg)
    fmt = ("sglang" if src_fmt == "speculators" and any(e.rules.reads_speculators_format is False
                                                         for e in engines) else src_fmt)
    converted, reordered = fmt != src_fmt, ascending != trained
    blocked = [n for n in needs if n.ids is None or n.key is None]
    if blocked:
        waiting = f"not written: {', '.join(n.engine for n in blocked)} cannot be served from a copy"
        return Deployment(draft, out, trained, fmt, tuple(n if n in blocked else replace(n, verdict=waiting)
                                                          for n in needs), False, converted, reordered)
    weights = None
    if converted or reordered:
        weights, _ = read_draft_weights(draft)
        if reordered:
            weights = _reordered(weights, trained, ascending)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent if out.parent.exists() else None))
    try:
        record = {"training_boundaries": list(ascending), "source": None if rec is not None else source,
                  "deployed_from": str(draft)}
        if reordered:
            record["fc_reordered"] = {"from": list(trained), "to": list(ascending)}
        fixes, dropped, shared = _place(tmp, draft, cfg, fmt, weights, needs, engines, Path(target), record,
                                        progress)
        deployment = Deployment(draft, out, trained, fmt, tuple(fixes), shared, converted, reordered,
                                tuple(dropped))
        if not deployment.ok:
            return replace(deployment, fixes=tuple(replace(f, folder=None) for f in fixes))
        for folder in {f.folder for f in fixes}:
            write_record(folder, deployed_for={f.engine: {"key": f.key, "ids": list(f.ids)} for f in fixes
                                               if f.folder == folder})
        if out.exists():
            out.rmdir()
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(tmp), str(out))
        return replace(deployment, fixes=tuple(_landed(replace(f, folder=out / f.folder.relative_to(tmp)),
                                                       Path(target)) for f in fixes))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _landed(fix: EngineFix, target: Path) -> EngineFix:
    """A fix whose ids live in launch options: the file rewritten to name the copy where it landed, and the
    commands that launch and check it."""
    if fix.key != LAUNCH_OPTIONS or fix.folder is None:
        return fix
    from ..engines.trtllm.options import OPTIONS_FILE, options_text

    opts = fix.folder / OPTIONS_FILE
    opts.write_text(options_text(list(fix.ids), fix.folder), encoding="utf-8")
    return replace(fix, then=(f"launch it: trtllm-serve {target} --extra_llm_api_options {opts}; check it: "
                              f"python -m helpers check --draft {fix.folder} --target {target} --engine "
                              f"{fix.engine} --trtllm-options {opts}"))


def _reordered(weights: dict, trained: tuple[int, ...], ascending: tuple[int, ...]) -> dict:
    fc_keys = [k for k in weights if k == "fc.weight" or k.endswith(".fc.weight") and "midlayer" not in k]
    if len(fc_keys) != 1:
        raise WiringError(f"the draft should hold one fc weight; found {fc_keys or 'none'}")
    fc = weights[fc_keys[0]]
    if fc.shape[1] % len(trained):
        raise WiringError(f"fc.weight {tuple(fc.shape)} does not split into {len(trained)} slots")
    blocks = fc.split(fc.shape[1] // len(trained), dim=1)
    return weights | {fc_keys[0]: torch.cat([blocks[trained.index(b)] for b in ascending], 1).contiguous()}


def _place(tmp: Path, draft: Path, cfg: dict, fmt: str, weights, needs: list[EngineFix], engines,
           target: Path, record: dict, progress) -> tuple[list[EngineFix], list[str], bool]:
    """One shared copy when every engine's key agrees and each serves the trained layout from it; else
    one copy per engine holding only its own key."""
    wanted: dict[str, list[int]] = {}
    clash = False
    for n in needs:
        if n.key in wanted and wanted[n.key] != list(n.ids):
            clash = True
        wanted.setdefault(n.key, list(n.ids))
    if not clash:
        shared = tmp / "shared"
        dropped = _write_copy(shared, draft, cfg, fmt, wanted, weights)
        write_record(shared, **record)
        judged = [_judge(shared, n, e, target) for n, e in zip(needs, engines)]
        if progress:
            progress(len(judged))
        if all(j.ok for j in judged):
            for f in list(shared.iterdir()):
                shutil.move(str(f), str(tmp / f.name))
            shared.rmdir()
            return [replace(j, folder=tmp) for j in judged], dropped, True
        shutil.rmtree(shared)
    fixes = []
    for n, e in zip(needs, engines):
        one = tmp / e.name if sum(x.name == e.name for x in engines) == 1 else tmp / str(e).replace("==", "-")
        _write_copy(one, draft, cfg, fmt, {n.key: list(n.ids)}, weights)
        write_record(one, **record)
        fixes.append(_judge(one, n, e, target))
        if progress:
            progress(1)
    return fixes, [], False             # each copy holds only its engine's key, by design
