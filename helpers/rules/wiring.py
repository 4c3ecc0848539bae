"""Which boundaries an engine really serves to an EAGLE-3 draft: the entry point for notebooks and the CLI.

SGLang is resolved by running and reading each release's own code (``helpers.engines.sglang``); vLLM,
TRT-LLM and llama.cpp by the rules recorded from their sources (``helpers.rules.conventions``). This module
only dispatches, attaches the patch's advice to a boundary-0 hazard, falls back on the documented
rule when no source can be fetched, and prints. See docs/architecture.md for the picture.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Sequence

from ..boundaries import CapturePlan, ProblemKind, WiringError, WiringResult, warning
from ..engines.sglang import patch as sglang_patch
from ..engines.sglang import source as ss
from ..engines.sglang.resolve import BOUNDARY0_HAZARD, resolve_sglang, source_for
from ..engines.vllm import source as vllm_source
from ..errors import CacheError, one_line, warn_once
from .conventions import (
    DEFAULT_ENGINE,
    DEFAULT_ENGINES,
    Engine,
    IdsAt,
    check_ids,
    check_num_layers,
    expect_engine,
    ids_in_config,
    read_draft_config,
)


def resolve(engine: Engine, arch: str, num_layers: int, ids: Sequence[int] | None = None,
            draft: str | Path | dict | None = None, *, source: ss.SglangSource | None = None,
            root: str | Path | None = None, target_config: dict | None = None,
            read_vllm_source: bool = False, recorded: bool = True, options=None) -> WiringResult:
    """Resolve a draft's ids to the served layout the way ``engine`` itself would (its family's
    ``resolve``). ``options``: the launch options an engine takes its ids from (TensorRT-LLM's,
    ``engines.trtllm.options``); given to any other engine, bad input.

    ``ids`` are passed as given (``ids_source='explicit'``); otherwise they are read from
    ``draft`` with the engine's own rule; with neither, the engine's defaults apply.
    Problems with the wiring go to ``errors``; malformed input raises WiringError.
    """
    num_layers = check_num_layers(num_layers)
    eng = expect_engine(engine)
    if ids is not None and draft is not None:
        raise WiringError("give either explicit ids or a draft config, not both")
    cfg = read_draft_config(draft) if draft is not None else None
    more = {}
    if options is not None:
        if not eng.rules.launch_options:
            raise WiringError(f"--trtllm-options are TensorRT-LLM's launch options; {eng} takes none")
        more["trtllm_options"] = options
    return eng.rules.resolve(eng, arch, num_layers, ids, cfg, source=source, root=root,
                             target_config=target_config, read_vllm_source=read_vllm_source,
                             recorded=recorded, **more)


def resolve_sglang_release(eng: Engine, arch: str, num_layers: int, ids: Sequence[int] | None,
                           cfg: dict | None, *, source: ss.SglangSource | None = None,
                           root: str | Path | None = None, target_config: dict | None = None,
                           read_vllm_source: bool = False, recorded: bool = True) -> WiringResult:
    """SGLang's family ``resolve``: the release's own setter run on its source, with the patch's advice
    attached to a boundary-0 hazard. Where the release's files cannot be had (an air-gapped host, nothing
    cached) its recorded rule judges, and says so, unless ``recorded`` is False (the release matrix, which
    states only what each release's own code did)."""
    version = eng.version
    try:
        src = source or source_for(version, root)
    except ss.IndexUnreachableError as exc:     # an air-gapped host, nothing cached: the recorded rule judges
        if not recorded:
            raise
        return recorded_sglang(eng, arch, num_layers, ids, cfg, one_line(exc))
    if version is not None and src.version not in (version, "unknown"):
        raise WiringError(f"engine asks for sglang {version} but the source given is sglang {src.version}")
    result = resolve_sglang(src, arch, num_layers, ids, cfg, target_config)
    hazard = next((h for h in result.hazards if h["kind"] == BOUNDARY0_HAZARD), None)
    if hazard is not None:
        result.problems = [replace(p, advice=sglang_patch.fix_advice(src, hazard["arch"], hazard["file"]),
                                   fix=patch_command(src, hazard["arch"], hazard["file"]))
                           if p.kind == BOUNDARY0_HAZARD else p for p in result.problems]
    return result


def recorded_sglang(eng: Engine, arch: str, num_layers: int, ids: Sequence[int] | None, cfg: dict | None,
                    why: str) -> WiringResult:
    """SGLang's rule as recorded from its releases (docs/conventions.md), for a host that cannot read the
    release's files now (no index, nothing cached); a warning says so, and which rule it assumed."""
    found, where = (list(ids), IdsAt.EXPLICIT) if ids is not None else ids_in_config(cfg or {})
    check_ids(found, num_layers)
    read_as = IdsAt.EAGLE_CONFIG if where == IdsAt.EXPLICIT else where   # explicit ids: as SGLang's own
    layout, rule = eng.rules.documented_layout(eng, arch, num_layers, found, read_as)
    note = warning(ProblemKind.RULE_NOT_RUN,
                   f"recorded, not read now: {eng}'s files could not be read here ({why[:200]}); its "
                   f"recorded rule is applied: {rule}")
    return WiringResult(engine=str(eng), version=eng.version, arch=arch, num_layers=num_layers,
                        served_layout=tuple(layout), layers_to_capture=list(layout), ids_used=found,
                        ids_source=where, problems=[note])


def patch_command(src: ss.SglangSource, arch: str, capture_file: str) -> str | None:
    """The command that removes a boundary-0 hazard, or None where the workbook's patch does not fit
    ``capture_file``: the condition ``sglang.patch.fix_advice`` words, kept as data."""
    edit = next((e for e in sglang_patch.EDITS if e.file == capture_file), None)
    if edit is None:
        return None
    state, _ = sglang_patch._file_state(src, edit)
    if state not in (sglang_patch.PatchState.PRISTINE, sglang_patch.PatchState.PATCHED):
        return None
    where = {"root": f" --root {src.root}", "installed": " --target installed"}.get(src.origin, "")
    return f"python -m helpers patch-sglang apply --version {src.version}{where} --arch {arch}"


def checked_against_vllm_source(result: WiringResult, eng: Engine, arch: str) -> WiringResult:
    """The release's own files, fetched, cited, and compared with the rule just applied."""
    facts, disagree = vllm_source.verify(eng.effective_version, arch)
    result.problems += [warning(ProblemKind.SOURCE_DISAGREES,
                                f"vLLM {facts.version}'s source disagrees with the recorded rule: {d}")
                        for d in disagree]
    if not disagree:
        result.problems.append(warning(ProblemKind.SOURCE_CHECKED,
                                       f"checked against vLLM {facts.version}'s own source: the rule holds"))
    result.source_lines += facts.evidence()
    return result


def served_plan(draft: str | Path | dict | Sequence[int] | None, num_layers: int, arch: str,
                engine: Engine = DEFAULT_ENGINE, *, root: str | Path | None = None,
                strict: bool = False, target_config: dict | None = None) -> CapturePlan:
    """The layout ``engine`` will feed this draft (a folder, a config dict or explicit ids).

    Errors travel in the plan unless ``strict``. When no release source can be fetched (offline,
    no cache) the documented rule stands in, and a warning says so once; a version that does not
    exist is the user's to fix and raises.
    """
    expect_engine(engine)
    ids = list(draft) if isinstance(draft, (list, tuple)) else None
    config = None if ids is not None else draft
    try:
        result = resolve(engine, arch, num_layers, ids=ids, draft=config, root=root,
                         target_config=target_config, recorded=False)   # its own fallback, said once below
    except ss.UnknownVersionError:
        raise
    except (ss.SglangSourceError, CacheError, OSError) as exc:
        return rule_plan(engine, num_layers, read_draft_config(config) if config is not None else {},
                         arch=arch, ids=ids, why=one_line(exc))
    if strict and result.errors:
        raise WiringError("; ".join(result.errors))
    return result.plan()


def rule_plan(engine: Engine, num_layers: int, draft_config: dict, *, arch: str = "",
              ids: Sequence[int] | None = None, why: str = "") -> CapturePlan:
    """The documented rule of docs/conventions.md, for when the engine's source cannot be read."""
    found, where = (list(ids), IdsAt.EXPLICIT) if ids is not None else ids_in_config(draft_config)
    layout, rule = engine.rules.documented_layout(engine, arch, num_layers, found, where)
    warnings = []
    if why:
        warnings.append(warning(ProblemKind.RULE_ASSUMED, warn_once(
            f"{engine}: engine source could not be read ({why[:240]}); documented rule used instead ({rule}) "
            f"-> served layout {layout}")))
    return CapturePlan(layout, num_layers, f"{engine} (rule)", (f"rule: {rule}",), problems=tuple(warnings))


def conventions_table(draft_or_ids: str | Path | dict | Sequence[int] | None, num_layers: int,
                      arch: str | Sequence[str] = ("DeepseekV3ForCausalLM", "LlamaForCausalLM"),
                      engines: Sequence[Engine] = DEFAULT_ENGINES):
    """One row per engine x architecture: what each would serve for the same draft."""
    import pandas as pd  # heavy, and only the notebooks want a frame

    archs = [arch] if isinstance(arch, str) else list(arch)
    rows = []
    for engine in engines:
        for a in archs:
            if isinstance(draft_or_ids, (list, tuple)):
                r = resolve(engine, a, num_layers, ids=list(draft_or_ids))
            else:
                r = resolve(engine, a, num_layers, draft=draft_or_ids)
            rows.append({"engine": r.engine, "arch": a, "ids_source": r.ids_source,
                         "ids_used": r.ids_used, "layers_to_capture": r.layers_to_capture,
                         "served_layout": r.served_layout, "label": r.label, "capturable": r.capturable,
                         "errors": "; ".join(r.errors)})
    return pd.DataFrame(rows)


def ids_for_layout(layout: Sequence[int], arch: str, num_layers: int, engine: Engine = DEFAULT_ENGINE,
                   *, root: str | Path | None = None) -> list[int] | None:
    """Draft ids that make ``engine`` serve ``layout`` without errors, or None (always, for an engine whose
    served layout no ids change)."""
    if not engine.rules.ids_serve:
        return None
    target = tuple(sorted(layout))
    for candidate in ([b - 1 for b in target], list(target)):
        try:
            r = resolve(engine, arch, num_layers, ids=candidate, root=root)
        except WiringError:
            continue
        if r.served_layout == target and not r.errors:
            return candidate
    return None
