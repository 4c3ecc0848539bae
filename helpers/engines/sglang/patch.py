"""The workbook's patch: let SGLang 0.5.9 capture boundary 0 (the embedding output).

A draft trained on ``cat([embed, b3, b7])`` needs the engine to capture the embedding output. With SGLang's
``+1`` rule, id ``-1`` already maps to capture index 0 in ``set_eagle3_layers_to_capture`` (``[val + 1 for
val in layer_ids]``), so the setter needs no change. What fails is the forward loop: before layer 0 on the
first pipeline rank ``residual`` is None, and the capture evaluates ``hidden_states + residual``. The edit
makes that one capture take ``hidden_states`` alone (which *is* the embedding output) when there is no
residual yet on the first rank, in ``llama.py`` and ``deepseek_v2.py``.

The edits are exact, anchored text replacements, judged file by file: a version can have the Llama capture
but no DeepSeek capture at all (0.5.4 has no EAGLE3 for DeepSeek), and a Llama user should not be refused
because of a file that has nothing to fix. A file is written only when its anchor occurs exactly once and
the result compiles; a file that does not fit is reported and left byte for byte as it was. ``apply --arch``
insists on the file that architecture captures in, so the command ``wiring`` advises fails loudly rather
than patching something else. Pristine copies of the written files are kept beside the tree with their
sha256 so ``revert`` restores every file byte for byte. Versions whose own code already captures boundary
0 (0.5.23 moved capture into the layers) need no patch.
"""
from __future__ import annotations

import difflib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Sequence

from . import source as ss
from .inspect import inspect_model
from .source import SglangSource
from .stub import run_setter

MARKER = "eagle3-workbook patch"
BACKUP_DIR = ".eagle3-workbook-patch"
MANIFEST = "manifest.json"


class PatchState(StrEnum):
    """The state of one edited file, or of a whole tree (the first six)."""

    PRISTINE = "pristine"          # the patch would apply
    PATCHED = "patched"
    PARTIAL = "partial"            # some files patched, some not: apply or revert finishes it
    STRANDED = "stranded"          # a backup exists but no file is patched: an interrupted run
    NOT_NEEDED = "not-needed"      # this release already captures boundary 0
    UNSUPPORTED = "unsupported"    # no edited file fits
    NO_CAPTURE = "no-capture"      # the file has no EAGLE-3 capture to patch
    MISFIT = "misfit"              # a capture, but not the text the patch anchors on
    MISSING = "missing"            # the file is not in this release


class PatchError(RuntimeError):
    """The patch cannot be applied or reverted as asked; nothing was written."""


@dataclass(frozen=True)
class Edit:
    """Replace ``anchor`` (which must occur exactly once) by ``replacement`` in ``file``.

    ``arch`` is an architecture whose capture loop lives in ``file``: when the anchor does not
    fit, inspecting it tells a version with nothing to patch from one the patch misfits.
    """

    file: str
    anchor: str
    replacement: str
    why: str
    arch: str


_LLAMA_ANCHOR = """\
            if i in self.layers_to_capture:
                aux_hidden_states.append(hidden_states + residual)
            layer = self.layers[i]
"""
_LLAMA_REPLACEMENT = f"""\
            if i in self.layers_to_capture:
                # {MARKER}: boundary 0 (embedding output, layer id -1) comes before any
                # residual exists on the first pipeline rank; capture hidden_states alone there.
                aux_hidden_states.append(
                    hidden_states
                    if residual is None and self.pp_group.is_first_rank
                    else hidden_states + residual
                )
            layer = self.layers[i]
"""
_DEEPSEEK_ANCHOR = """\
                    else:
                        aux_hidden_states.append(hidden_states + residual)
                layer = self.layers[i]
"""
_DEEPSEEK_REPLACEMENT = f"""\
                    else:
                        # {MARKER}: boundary 0 (embedding output, layer id -1) comes before
                        # any residual exists on the first pipeline rank; capture it alone there.
                        aux_hidden_states.append(
                            hidden_states
                            if residual is None and self.pp_group.is_first_rank
                            else hidden_states + residual
                        )
                layer = self.layers[i]
"""

EDITS: tuple[Edit, ...] = (
    Edit("sglang/srt/models/llama.py", _LLAMA_ANCHOR, _LLAMA_REPLACEMENT,
         "LlamaModel.forward: capture the embedding output when residual is None (first PP rank)",
         "LlamaForCausalLM"),
    Edit("sglang/srt/models/deepseek_v2.py", _DEEPSEEK_ANCHOR, _DEEPSEEK_REPLACEMENT,
         "DeepseekV2Model.forward: capture the embedding output when residual is None (first PP rank); "
         "the all-gather branch only runs for i > first_k_dense_replace, never at i == 0",
         "DeepseekV3ForCausalLM"),
)
CHECKED_ARCHS = tuple(e.arch for e in EDITS)


@dataclass
class PatchStatus:
    """Where a tree stands. ``state``: pristine (the patch would apply) | patched | partial (some files
    patched, some still pristine: an interrupted apply or revert; apply or revert finishes it) | stranded
    (the files are pristine but an interrupted apply/revert left a backup folder; apply or revert removes
    it) | not-needed | unsupported (nothing fits). ``file_states`` holds each edited file's own state
    (pristine, patched, not-needed, no-capture, misfit, missing) and ``skipped`` why apply leaves a file
    alone."""

    version: str
    root: str
    origin: str
    state: str
    patched: bool
    needed: bool
    files: dict[str, str] = field(default_factory=dict)  # path inside the tree -> sha256
    backup: str | None = None
    message: str = ""
    changed: bool = False  # whether this call wrote anything
    file_states: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # file -> why apply leaves it alone
    leftovers: list[str] = field(default_factory=list)  # folders an interrupted apply/revert left

    def to_dict(self) -> dict:
        return asdict(self)


# --------------------------------------------------------------------------------------
# Reading the state of a tree.


def _source(version: str, root: str | Path | None, target: str) -> SglangSource:
    try:
        return ss.get_source(version, root=root, target=target)
    except ss.UnknownVersionError as exc:
        raise PatchError(str(exc)) from None
    except ss.SglangSourceError as exc:
        raise PatchError(str(exc)) from None


def _file_state(src: SglangSource, edit: Edit) -> tuple[PatchState, str]:
    """(state, why) of one edited file: pristine | patched | not-needed | no-capture | misfit | missing."""
    path = src.path(edit.file)
    if not path.is_file():
        return PatchState.MISSING, f"{edit.file} is not in {src.root}"
    text = path.read_text(encoding="utf-8")
    anchors, replacements = text.count(edit.anchor), text.count(edit.replacement)
    if anchors == 1 and replacements == 0:
        return PatchState.PRISTINE, ""
    if anchors == 0 and replacements == 1:
        return PatchState.PATCHED, ""
    misfit = f"anchor found {anchors} times, patched block {replacements} times (expected exactly one)"
    w = _inspect(src, edit.arch)
    if w is None:
        return PatchState.MISFIT, misfit
    if not w.setters or w.capture is None:
        return PatchState.NO_CAPTURE, _no_capture(src, edit.arch, w)
    if w.capture.file != edit.file:
        return PatchState.MISFIT, f"{misfit}; {edit.arch} captures in {w.capture.file} in this version"
    if w.boundary0_capturable:
        return PatchState.NOT_NEEDED, (f"sglang {src.version}'s own {w.capture.style} capture already "
                                       f"handles boundary 0")
    return PatchState.MISFIT, misfit


def _no_capture(src: SglangSource, arch: str, w) -> str:
    if not w.setters:
        return (f"{arch} cannot use EAGLE3 in sglang {src.version} (no set_eagle3_layers_to_capture), "
                f"so there is no capture to patch")
    return (f"{arch} has no capture to patch in sglang {src.version}: "
            f"{w.errors[0] if w.errors else 'none found'}")


def _inspect(src: SglangSource, arch: str):
    try:
        return inspect_model(arch, source=src)
    except (ss.SglangSourceError, SyntaxError):
        return None


def _states(src: SglangSource) -> dict[str, tuple[str, str]]:
    return {edit.file: _file_state(src, edit) for edit in EDITS}


def _hashes(src: SglangSource) -> dict[str, str]:
    return {e.file: ss.sha256_file(src.path(e.file)) for e in EDITS if src.path(e.file).is_file()}


def _backup_dir(src: SglangSource) -> Path:
    return src.root / BACKUP_DIR


def _not_needed_message(src: SglangSource, archs: Sequence[str]) -> str:
    """Why this version needs no patch, from its own code, and which id reaches the embedding."""
    lines, embed_ids = [], []
    for arch in archs:
        w = _inspect(src, arch)
        lines.extend(f"{h.file}:{h.line}" for h in (w.capture.handler if w and w.capture else []))
        embed_ids.append(f"{arch}: id {_embedding_id(src, arch)}")
    where = f" (missing residual handled at {', '.join(sorted(set(lines)))})" if lines else ""
    return (f"sglang {src.version} already captures boundary 0{where}; no patch needed. "
            f"The id that selects the embedding output: " + "; ".join(embed_ids))


def _embedding_id(src: SglangSource, arch: str) -> str:
    """-1 or 0: whichever this version's setter maps to capture index 0."""
    for candidate in (-1, 0):
        run = run_setter(src, arch, 12, [candidate, 2, 6])
        if run.layers_to_capture and run.layers_to_capture[0] == 0:
            return str(candidate)
    return "none (the setter never maps to capture index 0)"


def patch_status(version: str, *, root: str | Path | None = None, target: str = "cache") -> PatchStatus:
    """The state of the tree for ``version``; writes nothing."""
    src = _source(version, root, target)
    return _status_of(src)


def _leftovers(src: SglangSource) -> list[Path]:
    """Backup folders that hold nothing revert needs: a staging folder an apply was killed in
    before publishing it, one a revert retired but did not finish deleting, or the backup
    folder itself without its manifest (left by an older version of this module)."""
    out = sorted(src.root.glob(BACKUP_DIR + ".new-*")) + sorted(src.root.glob(BACKUP_DIR + ".old-*"))
    backup = _backup_dir(src)
    if backup.exists() and not (backup / MANIFEST).is_file():
        out.append(backup)
    return out


def _status_of(src: SglangSource) -> PatchStatus:
    states = _states(src)
    backup = str(_backup_dir(src)) if (_backup_dir(src) / MANIFEST).is_file() else None
    leftovers = _leftovers(src)
    by: dict[str, list[str]] = {}
    for f, (state, _) in states.items():
        by.setdefault(state, []).append(f)
    skipped = {f: why for f, (state, why) in states.items()
               if state not in (PatchState.PRISTINE, PatchState.PATCHED)}
    base = dict(version=src.version, root=str(src.root), origin=src.origin, files=_hashes(src), backup=backup,
                file_states={f: st for f, (st, _) in states.items()}, skipped=skipped,
                leftovers=[str(p) for p in leftovers])
    left = "".join(f"; {f} left alone: {why}" for f, why in skipped.items())
    if leftovers:
        left += (f"; {', '.join(p.name for p in leftovers)} in {src.root} was left by an interrupted apply "
                 f"or revert and restores nothing: `patch-sglang apply` or `revert` removes it")
    patched, pristine = by.get(PatchState.PATCHED, []), by.get(PatchState.PRISTINE, [])
    if patched and pristine:
        how = ("the backup in " + str(_backup_dir(src)) + " holds the originals") if backup else "no backup"
        return PatchStatus(state=PatchState.PARTIAL, patched=False, needed=True,
                           message=f"sglang {src.version} is partly patched ({', '.join(patched)} patched, "
                                   f"{', '.join(pristine)} not): an interrupted apply or revert ({how}); "
                                   f"revert it, or apply again to finish it{left}", **base)
    if patched:
        return PatchStatus(state=PatchState.PATCHED, patched=True, needed=True,
                           message=f"sglang {src.version} is patched ({', '.join(patched)}){left}", **base)
    if pristine and (leftovers or backup):
        what = ", ".join(str(p) for p in leftovers) or f"{backup} (a finished revert's backup)"
        return PatchStatus(state=PatchState.STRANDED, patched=False, needed=True,
                           message=f"sglang {src.version} is unpatched ({', '.join(pristine)}), but {what} "
                                   f"was left by an interrupted apply or revert; `patch-sglang revert` "
                                   f"removes it, `apply` removes it and "
                                   f"patches{''.join(f'; {f} left alone: {w}' for f, w in skipped.items())}",
                           **base)
    if pristine:
        return PatchStatus(state=PatchState.PRISTINE, patched=False, needed=True,
                           message=f"sglang {src.version} is unpatched: boundary 0 raises TypeError "
                                   f"({', '.join(pristine)}){left}", **base)
    if by.get(PatchState.NOT_NEEDED) and not by.get(PatchState.MISFIT) and not by.get(PatchState.MISSING):
        archs = [e.arch for e in EDITS if e.file in by[PatchState.NOT_NEEDED]]
        return PatchStatus(state=PatchState.NOT_NEEDED, patched=False, needed=False,
                           message=_not_needed_message(src, archs), **base)
    detail = "; ".join(f"{f}: {why}" for f, why in skipped.items())
    return PatchStatus(state=PatchState.UNSUPPORTED, patched=False, needed=True,
                       message=f"the boundary-0 patch fits no file of sglang {src.version}: {detail}", **base)


def _arch_file(src: SglangSource, arch: str, status: PatchStatus) -> str:
    """The edited file ``arch`` captures in; PatchError when the patch cannot help that arch."""
    w = _inspect(src, arch)
    if w is None:
        raise PatchError(f"sglang {src.version} has no architecture '{arch}' the patch can check; nothing "
                         f"written")
    if w.capture is None:
        raise PatchError(f"{_no_capture(src, arch, w)}; nothing written")
    edit = next((e for e in EDITS if e.file == w.capture.file), None)
    if edit is None:
        raise PatchError(f"{arch} captures in {w.capture.file}, which the patch does not edit (it edits "
                         f"{', '.join(e.file for e in EDITS)}); nothing written")
    state = status.file_states.get(edit.file)
    if state not in (PatchState.PRISTINE, PatchState.PATCHED, PatchState.NOT_NEEDED):
        raise PatchError(f"the patch does not fit {edit.file}, where {arch} captures: "
                         f"{status.skipped.get(edit.file, state)}; nothing written")
    return edit.file


def fix_advice(src: SglangSource, arch: str, capture_file: str) -> str:
    """What ``wiring`` tells a user whose capture raises at boundary 0, true to what apply does."""
    edit = next((e for e in EDITS if e.file == capture_file), None)
    if edit is None:
        return (f"the workbook's patch does not cover {capture_file} (it edits "
                f"{', '.join(e.file for e in EDITS)}): choose ids that avoid boundary 0, or retrain the "
                f"draft on a layout this version can serve")
    state, why = _file_state(src, edit)
    if state in (PatchState.PRISTINE, PatchState.PATCHED):
        where = {"root": f" --root {src.root}", "installed": " --target installed"}.get(src.origin, "")
        return f"fix: `python -m helpers patch-sglang apply --version {src.version}{where} --arch {arch}`"
    return (f"the workbook's patch does not fit {capture_file} in sglang {src.version} ({why}): choose ids "
            f"that avoid boundary 0, or retrain the draft on a layout this version can serve")


# --------------------------------------------------------------------------------------
# Apply / revert.


def _patched_texts(src: SglangSource, files: Sequence[str]) -> dict[str, tuple[str, str]]:
    """file -> (pristine text, patched text) for ``files``, after checking every anchor and compiling."""
    out = {}
    for edit in EDITS:
        if edit.file not in files:
            continue
        path = src.path(edit.file)
        text = path.read_text(encoding="utf-8")
        n = text.count(edit.anchor)
        if n != 1:
            raise PatchError(f"anchor for {edit.file} found {n} times (expected exactly 1); nothing written")
        new = text.replace(edit.anchor, edit.replacement)
        try:
            compile(new, str(path), "exec")
        except SyntaxError as exc:
            raise PatchError(f"patched {edit.file} would not compile: {exc}; nothing written") from None
        out[edit.file] = (text, new)
    return out


# Every write below goes through _step, so a test can stop the process at any one of them
# (raising a BaseException that no cleanup catches, as a kill would) and check that status
# names what is left and that apply/revert finish from there.
_FAULT = None  # callable(step name) or None


def _step(name: str) -> None:
    if _FAULT is not None:
        _FAULT(name)


def _write_atomic(path: Path, data: bytes) -> None:
    """Write beside the file, then rename over it: at every instant the file is whole, old or new."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        shutil.copymode(path, tmp)
        os.replace(tmp, path)
    except OSError:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _remove_leftovers(src: SglangSource) -> list[str]:
    removed = []
    for p in _leftovers(src):
        _step(f"remove {p.name}")
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p.name)
    return removed


def _retire_backup(src: SglangSource) -> None:
    """Rename the backup out of the way in one step, then delete it: a kill in between leaves a
    folder that status names as a leftover, never a half-deleted backup that looks live."""
    backup = _backup_dir(src)
    retired = src.root / f"{BACKUP_DIR}.old-{os.getpid()}"
    _step("retire backup")
    os.rename(backup, retired)
    _step("delete retired backup")
    shutil.rmtree(retired)


def _publish_backup(src: SglangSource, texts: dict[str, tuple[str, str]]) -> None:
    """Backups and manifest are written into a staging folder renamed into place in one step,
    so the backup folder either does not exist or holds every original and the manifest."""
    staging = Path(tempfile.mkdtemp(prefix=f"{BACKUP_DIR}.new-", dir=src.root))
    manifest = {"version": src.version, "marker": MARKER, "files": {}}
    for rel, (_, new) in texts.items():
        copy = staging / "files" / rel
        copy.parent.mkdir(parents=True, exist_ok=True)
        _step(f"backup {rel}")
        data = src.path(rel).read_bytes()
        copy.write_bytes(data)
        manifest["files"][rel] = {"orig_sha256": ss.sha256_bytes(data),
                                  "patched_sha256": ss.sha256_bytes(new.encode("utf-8"))}
    _step("manifest")
    (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    _step("publish backup")
    os.rename(staging, _backup_dir(src))


def _read_manifest(backup: Path) -> dict:
    try:
        manifest = json.loads((backup / MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
        assert isinstance(files, dict) and all({"orig_sha256", "patched_sha256"} <= set(e)
                                               for e in files.values())
        return manifest
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        raise PatchError(f"{backup / MANIFEST} is damaged (not the JSON this module writes); the originals "
                         f"are in {backup / 'files'}: compare and restore them by hand, then delete "
                         f"{backup}") from None


def apply_patch(version: str, *, root: str | Path | None = None, target: str = "cache",
                arch: str | None = None) -> PatchStatus:
    """Patch every file whose anchor fits; a second call is a no-op; a version that needs
    none is left alone. With ``arch``, refuse (writing nothing) unless that architecture's
    capture file is among those the patch fits. Finishes an interrupted apply, and clears what
    an interrupted apply or revert left behind."""
    src = _source(version, root, target)
    status = _status_of(src)
    if arch is not None:
        _arch_file(src, arch, status)
    if status.state in (PatchState.PATCHED, PatchState.NOT_NEEDED) and not status.leftovers:
        return status
    if status.state == PatchState.UNSUPPORTED:
        raise PatchError(status.message + "; nothing written")
    backup = _backup_dir(src)
    if status.state == PatchState.PARTIAL:
        if not (backup / MANIFEST).is_file():
            raise PatchError(status.message + " (no backup to finish from); nothing written")
        return _finish_apply(src, backup)
    removed = _remove_leftovers(src)
    if status.state == PatchState.STRANDED and (backup / MANIFEST).is_file():
        _retire_backup(src)  # files pristine: a revert restored them and was stopped before deleting it
    if status.state in (PatchState.PATCHED, PatchState.NOT_NEEDED):
        result = _status_of(src)
        result.changed = bool(removed)
        return result
    todo = [f for f, st in status.file_states.items() if st == PatchState.PRISTINE]
    texts = _patched_texts(src, todo)
    try:
        _publish_backup(src, texts)
    except OSError as exc:
        for p in src.root.glob(BACKUP_DIR + ".new-*"):
            shutil.rmtree(p, ignore_errors=True)
        raise PatchError(f"cannot write the backup beside {src.root} ({exc.strerror or exc}); nothing "
                         f"written") from None
    written = []
    try:
        for rel, (_, new) in texts.items():
            _step(f"write {rel}")
            _write_atomic(src.path(rel), new.encode("utf-8"))
            written.append(rel)
    except OSError as exc:
        for rel in written:
            _write_atomic(src.path(rel), (backup / "files" / rel).read_bytes())
        _retire_backup(src)
        raise PatchError(f"writing the patch failed ({exc}); restored the originals") from None
    result = _status_of(src)
    result.changed = True
    return result


def _finish_apply(src: SglangSource, backup: Path) -> PatchStatus:
    """Write the files an interrupted apply did not reach, each checked against its manifest."""
    manifest = _read_manifest(backup)
    plan = {}
    for rel, entry in manifest["files"].items():
        current = ss.sha256_file(src.path(rel))
        if current == entry["patched_sha256"]:
            continue
        if current != entry["orig_sha256"]:
            raise PatchError(f"{rel} changed since the interrupted apply (sha256 {current[:12]}...); not "
                             f"finishing it")
        edit = next(e for e in EDITS if e.file == rel)
        new = src.path(rel).read_text(encoding="utf-8").replace(edit.anchor, edit.replacement).encode("utf-8")
        if ss.sha256_bytes(new) != entry["patched_sha256"]:
            raise PatchError(f"patching {rel} again would not give the bytes the manifest records; not "
                             f"finishing")
        plan[rel] = new
    for rel, data in plan.items():
        _step(f"write {rel}")
        _write_atomic(src.path(rel), data)
    _remove_leftovers(src)
    result = _status_of(src)
    result.changed = True
    return result


def revert_patch(version: str, *, root: str | Path | None = None, target: str = "cache") -> PatchStatus:
    """Restore the bytes apply saved (checked against apply's own manifest, not the wheel's
    RECORD: a file the user edited before patching comes back as they left it); a no-op when
    unpatched; clears what an interrupted apply or revert left behind."""
    src = _source(version, root, target)
    status = _status_of(src)
    backup = _backup_dir(src)
    if (backup / MANIFEST).is_file():
        _restore_from_backup(src, backup)  # also finishes an interrupted apply or revert
    elif status.state in (PatchState.PATCHED, PatchState.PARTIAL):
        _restore_by_reverse_edit(src, [f for f, st in status.file_states.items() if st == PatchState.PATCHED])
    elif not status.leftovers:
        return status
    _remove_leftovers(src)
    result = _status_of(src)
    result.changed = True
    return result


def _restore_from_backup(src: SglangSource, backup: Path) -> None:
    manifest = _read_manifest(backup)
    entries = manifest["files"]
    for rel, entry in entries.items():  # check everything before writing anything
        current = ss.sha256_file(src.path(rel)) if src.path(rel).is_file() else "missing"
        if current not in (entry["patched_sha256"], entry["orig_sha256"]):
            raise PatchError(f"{rel} changed since it was patched (sha256 {current[:12]}...); not reverting")
        copy = backup / "files" / rel
        saved = ss.sha256_file(copy) if copy.is_file() else "missing"
        if saved != entry["orig_sha256"]:
            raise PatchError(f"the backup of {rel} is damaged (sha256 {saved[:12]}...); not reverting")
    for rel, entry in entries.items():
        if ss.sha256_file(src.path(rel)) != entry["orig_sha256"]:
            _step(f"restore {rel}")
            _write_atomic(src.path(rel), (backup / "files" / rel).read_bytes())
    for rel, entry in entries.items():
        if ss.sha256_file(src.path(rel)) != entry["orig_sha256"]:
            raise PatchError(f"{rel} does not match the sha256 its backup recorded after revert; backup kept")
    _retire_backup(src)


def _restore_by_reverse_edit(src: SglangSource, files: Sequence[str]) -> None:
    """No backup (deleted by hand): undo the replacement, then insist on the wheel's hash."""
    record = src.record_hashes()
    restored = {}
    for edit in EDITS:
        if edit.file not in files:
            continue
        text = src.path(edit.file).read_text(encoding="utf-8")
        restored[edit.file] = text.replace(edit.replacement, edit.anchor).encode("utf-8")
        expected = record.get(edit.file)
        if expected is None:
            raise PatchError(f"no backup and no RECORD hash for {edit.file}: cannot prove a byte-exact "
                             f"revert")
        if ss.sha256_bytes(restored[edit.file]) != expected:
            raise PatchError(f"reverse edit of {edit.file} does not match the wheel's RECORD hash; not "
                             f"reverting")
    for rel, data in restored.items():
        _step(f"restore {rel}")
        _write_atomic(src.path(rel), data)


def show_diff(version: str, *, root: str | Path | None = None, target: str = "cache") -> str:
    """Unified diff of pristine -> patched files, for display in a notebook; files the patch
    leaves alone are named with the reason, so the diff never looks more complete than it is."""
    src = _source(version, root, target)
    status = _status_of(src)
    if status.state in (PatchState.NOT_NEEDED, PatchState.UNSUPPORTED):
        return f"# {status.message}\n"
    chunks = []
    backup = _backup_dir(src)
    for edit in EDITS:
        state = status.file_states.get(edit.file)
        if state not in (PatchState.PRISTINE, PatchState.PATCHED):
            chunks.append(f"# {edit.file}: not patched ({status.skipped.get(edit.file, state)})\n")
            continue
        current = src.path(edit.file).read_text(encoding="utf-8")
        if state == PatchState.PATCHED:
            saved = backup / "files" / edit.file
            old = saved.read_text(encoding="utf-8") if saved.is_file() else current.replace(
                edit.replacement, edit.anchor)
            new = current
        else:
            old, new = current, current.replace(edit.anchor, edit.replacement)
        chunks.extend(difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                           fromfile=f"a/{edit.file}", tofile=f"b/{edit.file}", n=3))
    return "".join(chunks)




