"""From a draft's ids to the layout one SGLang release serves, by running and reading its code.

The id-to-layer step is never restated: the release's own ``set_eagle3_layers_to_capture`` runs
on a stub (``stub``), and its forward loop is read (``inspect``) to learn which of those indices
are really captured. Problems come back typed (``boundaries.Problem``, by ``ProblemKind``); a
boundary-0 capture that meets ``residual = None`` also comes back as a ``hazards`` entry (arch, file),
so the caller that knows about patches can attach its advice.
"""
from __future__ import annotations

import ast
import types
from pathlib import Path
from typing import Sequence

from ...boundaries import Problem, ProblemKind, WiringError, WiringResult, error, warning
from ...rules.conventions import IDS_KEY, DraftIds, IdsAt, check_ids
from . import classes
from . import source as ss
from .classes import UnknownArchitectureError, parse_file
from .inspect import inspect_model
from .rule import ids_sglang_reads, sglang_format_warnings
from .sites import SETTER, CaptureSite, CaptureStyle, ModelWiring, SourceLine, dedupe
from .source import SglangSource
from .stub import SetterRun, run_setter

K = ProblemKind
BOUNDARY0_HAZARD = K.BOUNDARY0_RESIDUAL_NONE


def source_for(version: str | None, root: str | Path | None) -> ss.SglangSource:
    """The release to read: an explicit tree, the installed sglang, or the cached wheel."""
    try:
        if root is not None:
            return ss.source_at(root, version)
        if version is None:
            src = ss.installed_sglang()
            if src is None:
                raise WiringError("engine 'sglang' without a version needs an installed sglang; "
                                  "use e.g. 'sglang==0.5.9'")
            return src
        return ss.fetch_sglang(version)
    except ss.UnknownVersionError as exc:     # the user's to fix; to the release matrix, unreadable here
        raise WiringError(str(exc), ProblemKind.SOURCE_UNAVAILABLE) from None


def knows_speculators(src: SglangSource) -> bool | None:
    """Whether the release registers the speculators draft architecture (None: no models to read)."""
    models = src.root / "sglang" / "srt" / "models"
    if not models.is_dir():
        return None
    return any("Eagle3Speculator" in ss.safe_read(f) for f in models.glob("*eagle*.py"))


def sglang_draft_ids(cfg: dict, src: SglangSource | None = None) -> DraftIds:
    """The ids this release passes to the setter, with the lines of its source that read them."""
    lines, top_level_read = (sglang_ids_site(src) if src is not None else ([], False))
    chosen = ids_sglang_reads(cfg, top_level_read)
    chosen.lines = lines
    chosen.problems.extend(warning(K.DRAFT_FORMAT, w) for w in
                           sglang_format_warnings(cfg, knows_speculators(src) if src is not None else None))
    return chosen


def sglang_ids_site(src: SglangSource) -> tuple[list[SourceLine], bool]:
    """Where the version reads the draft's ids, and whether that code reads a top-level key."""
    folder = src.package_dir / "srt" / "model_executor"
    lines, top_level = [], False
    for path in sorted(folder.rglob("*.py")) if folder.is_dir() else []:
        if "eagle_config" not in ss.safe_read(path):
            continue
        parsed = parse_file(path)
        for fn in ast.walk(parsed.tree):
            if not isinstance(fn, ast.FunctionDef):
                continue
            hits = [n for n in ast.walk(fn) if isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name)
                    and n.value.id == "eagle_config" and isinstance(n.slice, ast.Constant)
                    and n.slice.value == IDS_KEY]
            if not hits:
                continue
            for n in ast.walk(fn):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr" and \
                        len(n.args) >= 2 and isinstance(n.args[1], ast.Constant):
                    if n.args[1].value == "eagle_config":
                        lines.append(SourceLine(src.rel(path), n.lineno, parsed.line(n.lineno).strip()))
                    elif n.args[1].value == IDS_KEY:
                        top_level = True
            lines.extend(SourceLine(src.rel(path), h.lineno, parsed.line(h.lineno).strip()) for h in hits)
    return dedupe(lines), top_level


def resolve_sglang(src: SglangSource, arch: str, num_layers: int, ids: Sequence[int] | None,
                   cfg: dict | None, target_config: dict | None = None) -> WiringResult:
    """What ``src``'s release serves for ``ids`` (or the ids it reads from ``cfg``, or its defaults)."""
    try:
        wiring = inspect_model(arch, source=src)
    except UnknownArchitectureError as exc:
        raise WiringError(str(exc), K.NO_MODEL_CLASS) from None
    warnings: list[Problem] = []
    lines = []
    if ids is not None:
        chosen = DraftIds(check_ids(ids, num_layers), IdsAt.EXPLICIT)
    elif cfg is not None:
        chosen = sglang_draft_ids(cfg, src)
        chosen.ids = check_ids(chosen.ids, num_layers)
        lines.extend(chosen.lines)
    else:
        chosen = DraftIds(None, IdsAt.NONE)
    warnings.extend(chosen.problems)
    errors = _inspector_problems(src, arch, wiring.errors)
    result = WiringResult(engine=f"sglang=={src.version}", version=src.version, arch=arch,
                          num_layers=num_layers, served_layout=(), layers_to_capture=[], ids_used=chosen.ids,
                          ids_source=chosen.source)
    if not wiring.setters or wiring.owner is None:
        # nothing to run: the one error from the inspector says why, and a stub run would
        # only add a 'could not run' echo of it
        result.problems = errors + warnings
        result.source_lines = [ln.to_dict() for ln in dedupe(lines)]
        return result
    run = run_setter(src, arch, num_layers, chosen.ids, target_config)
    if not run.takes_ids and chosen.ids is not None:
        warnings.append(warning(K.SETTER_TAKES_NO_IDS,
                                f"sglang {src.version}'s {SETTER} has no ids parameter, so no draft ids "
                                f"reach it: {chosen.ids} are ignored and the defaults are served"))
    lines.extend(run.executed)
    lines.extend(wiring.source_lines())
    if run.touched:
        warnings.append(warning(K.STUB_PLACEHOLDERS,
                                "the stub supplied placeholders for: " + ", ".join(run.touched)))
    if wiring.capture is not None and wiring.capture.style == CaptureStyle.UNKNOWN:
        warnings.append(warning(K.RULE_ASSUMED,
                                f"the capture at {wiring.capture.file}:{wiring.capture.line} is not a style "
                                f"the workbook recognises; the served layout assumes index v captures "
                                f"boundary v"))
    ltc = run.layers_to_capture or []
    if run.error:
        errors.append(_setter_failure(run, ltc, chosen.ids, num_layers, src))
        captured = set()  # SGLang would stop while loading the model: nothing is served
    else:
        captured, capture_errors, result.hazards = _captured(ltc, chosen.ids, wiring, num_layers, src,
                                                             run.flagged)
        errors.extend(capture_errors)
    if not chosen.use_aux:
        errors.append(error(K.AUX_OFF, "SGLang will not capture aux hidden states for this draft "
                                       "(use_aux_hidden_state false)"))
    result.problems = errors + warnings
    result.served_layout = tuple(sorted(captured))
    result.layers_to_capture = ltc
    result.source_lines = [ln.to_dict() for ln in dedupe(lines)]
    return result


def _inspector_problems(src: SglangSource, arch: str, errors: Sequence[str]) -> list[Problem]:
    """The inspector's errors, typed by what happened rather than by their words: when the target's
    class defines no setter (itself or through its bases), the first says capture cannot be turned
    on; every other one is a setter chain or capture site that could not be read."""
    if not errors:
        return []
    no_setter = classes.find_method(src, classes.class_for_arch(src, arch), SETTER) is None
    return [error(K.NO_CAPTURE if no_setter and i == 0 else K.CAPTURE_UNREAD, e)
            for i, e in enumerate(errors)]


def _setter_failure(run: SetterRun, ltc: list[int], ids: list[int] | None, num_layers: int,
                    src: SglangSource) -> Problem:
    """One error for a setter that raised, naming the index that made it raise when it is the
    Qwen-MoE ``setattr(self.layers[k], ...)`` meeting a k with no layer."""
    base = f"running sglang {src.version}'s {SETTER} failed: {run.error}"
    bad = [(k, v) for k, v in enumerate(ltc) if not -num_layers <= v < num_layers]
    if run.error_type == "IndexError" and bad:
        k, v = bad[0]
        src_id = f" (from id {ids[k]})" if ids is not None and k < len(ids) else ""
        return error(K.SETTER_RAISES,
                     f"{base}: capture index {v}{src_id} has no layer self.layers[{v}] (the model has layers "
                     f"0..{num_layers - 1}), so SGLang raises while loading the model and serves nothing")
    return error(K.SETTER_RAISES, base)


def _visited(capture: CaptureSite, num_layers: int) -> tuple[set[int], set[int]]:
    """Indices the loop passes (single PP stage: 0..L-1, shifted when it captures after each layer)
    and extra ones checked outside it."""
    inside = {i + capture.index_offset for i in range(num_layers)}
    after = set()
    stub_self = types.SimpleNamespace(start_layer=0, end_layer=num_layers, layers=[None] * num_layers,
                                      config=types.SimpleNamespace(num_hidden_layers=num_layers),
                                      num_layers=num_layers)
    for text in capture.post_loop_exprs:
        if "__" in text:
            continue  # the tree's text, evaluated here: no dunder escapes out of the empty builtins
        try:
            value = eval(compile(text, "<post-loop>", "eval"), {"__builtins__": {"len": len}},
                         {"self": stub_self, "num_layers": num_layers})
        except Exception:
            continue  # an expression the stub cannot evaluate: the index is not assumed captured
        if isinstance(value, int):
            after.add(value)
    return inside, after


def _repeated(values) -> str:
    """The values ``values`` holds more than once, e.g. 'index 3' or 'indices 3, 7'."""
    dup = sorted({v for v in values if list(values).count(v) > 1})
    return ("index " if len(dup) == 1 else "indices ") + ", ".join(str(v) for v in dup)


def _captured(ltc: list[int], ids: list[int] | None, wiring: ModelWiring, num_layers: int,
              src: SglangSource, flagged: dict[str, list[int]] | None = None
              ) -> tuple[set[int], list[Problem], list[dict]]:
    """Which capture indices happen, why the others do not, and hazards a patch can remove."""
    errors: list[Problem] = []
    hazards: list[dict] = []
    capture = wiring.capture
    if capture is None:
        return set(), errors, hazards
    inside, after = _visited(capture, num_layers)
    span = f"{min(inside)}..{max(inside)}"
    L = num_layers
    where = f"{capture.file}:{capture.loop_line} `{capture.loop_text}`"
    marked = set((flagged or {}).get(capture.flag, [])) if capture.flag else set()
    captured = set()
    for k, v in enumerate(ltc):
        src_id = f" (from id {ids[k]})" if ids is not None and k < len(ids) else ""
        if v in after:
            captured.add(v)
        elif capture.flag is not None:
            layer = v + L if -L <= v < 0 else v  # the setter indexes self.layers[v]
            if 0 <= layer < L and layer in marked:
                captured.add(layer)
                if v < 0:
                    errors.append(error(K.WRONG_LAYER, f"capture index {v}{src_id} flags self.layers[{v}], "
                                        f"which Python reads as layer {layer}: sglang {src.version} "
                                        f"captures boundary {layer} there, not the embedding"))
            else:
                errors.append(error(
                    K.NEVER_CAPTURED,
                    f"capture index {v}{src_id} is never captured by sglang {src.version}: the loop {where} "
                    f"captures only layers whose `{capture.flag}` the setter set, and it set none for "
                    f"{v} (layers are 0..{L - 1})"))
        elif v in inside:
            captured.add(v)
        elif v == L:
            errors.append(error(
                K.NEVER_CAPTURED,
                f"capture index {v}{src_id} = boundary {L} (final state before the norm) is never captured "
                f"by sglang {src.version}: the loop {where} visits {span} and nothing captures after it"))
        else:
            errors.append(error(K.NEVER_CAPTURED,
                                f"capture index {v}{src_id} matches no layer: the loop {where} visits "
                                f"{span}, so that feature is missing from the concatenation"))
    if len(set(ltc)) != len(ltc):
        errors.append(error(K.REPEATED,
                            f"layers_to_capture {ltc} repeats {_repeated(ltc)}; each layer is captured once"))
    if len(captured) != len(ltc):
        packer = any("AuxHiddenStatePacker" in n for n in capture.notes)
        errors.append(error(K.FEATURE_COUNT,
                            f"the draft's fc expects {len(ltc)} features but sglang {src.version} would "
                            f"concatenate {len(captured)}"
                            + (" (AuxHiddenStatePacker.finalize() raises "
                               f"'captured {len(captured)} of {len(ltc)} aux hidden states')"
                               if packer else "")))
    if capture.style == CaptureStyle.INLINE_HIDDEN_ONLY and captured - {0}:
        split = capture.split_residual
        errors.append(error(
            K.NOT_BOUNDARIES,
            f"capture indices {sorted(captured - {0})} are not boundaries in sglang {src.version}: "
            f"{capture.file}:{capture.line} appends `hidden_states` alone, but the loop gets the residual "
            f"back separately ({split.file}:{split.line} `{split.text}`), so each feature is the previous "
            f"layer's output branch without the residual stream (boundary b is hidden_states + residual); "
            f"only index 0, before any residual exists, is the boundary it names"))
    if 0 in captured and capture.style == CaptureStyle.UNKNOWN:
        why = (capture.notes[-1] if capture.notes
               else f"the capture at {capture.file}:{capture.line} is not one the workbook recognises")
        errors.append(error(K.BOUNDARY0_UNVERIFIED,
                            f"boundary 0 (embedding output) is not verified for sglang {src.version}: {why}"))
    if 0 in captured and capture.boundary0_hazard:
        add, rn, fr = capture.unguarded_add, capture.residual_none, capture.first_rank
        errors.append(error(
            BOUNDARY0_HAZARD,
            f"boundary 0 (embedding output) cannot be captured by unpatched sglang {src.version}: on the "
            f"first pipeline rank `residual` is None before layer 0 ({rn.file}:{rn.line}"
            + (f", under `{fr.text}`" if fr else "") + f") and {add.file}:{add.line} evaluates "
            f"`{add.text}` -> TypeError on the first forward"))
        hazards.append({"kind": BOUNDARY0_HAZARD, "arch": wiring.arch, "file": capture.file,
                        "error": errors[-1].message})
    return captured, errors, hazards
