"""What every SGLang release since EAGLE-3 serves for the same draft: the engine side over time.

Each release is resolved by running and reading its own code (``wiring.resolve``), so a rule that
changed in some release shows up as a new run of releases, without anyone writing the rule down.
Releases are grouped into runs that agree on the outcome (what is captured, what is served, and
whether it serves at all), which is the form people need: "from 0.5.13 on, these ids mean
something else for DeepSeek".
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from datetime import date
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

from tqdm.auto import tqdm

from ..boundaries import HasProblems, Problem, ProblemKind, WiringError, WiringResult, error, layout_label
from ..engines.llamacpp.rule import LLAMACPP_BUILDS_READ, resolve_llamacpp
from ..engines.sglang import source as ss
from ..engines.vllm.rule import (
    VLLM_CAPTURE,
    VLLM_DRAFT_CLASS_FIRST,
    VLLM_FC_FROM_CONFIG,
    VLLM_FIRST_EAGLE3,
    VLLM_NEWEST_READ,
    VLLM_READS_TOP_LEVEL,
    VLLM_V1_READS_NESTED,
    VLLM_V2_DEFAULT,
    resolve_vllm,
    vllm_draft_class,
)
from ..errors import BadConfig, CacheError, read_json_file
from .conventions import Engine, IdsAt, ids_in_config, version_key
from .wheels import PackageIndexUnreachable, cached_versions, released_versions
from .wiring import resolve

# The first release with EAGLE-3 (srt/models/llama_eagle3.py and LlamaForCausalLM's setter appear in
# 0.4.4.post2; 0.4.4 and 0.4.4.post1 have neither).
FIRST_EAGLE3 = "0.4.4.post2"

# The common target families, each at the depth of a real model of that family.
COMMON_TARGETS: tuple[tuple[str, int, str], ...] = (
    ("LlamaForCausalLM", 32, "Llama-3.1-8B"),
    ("Qwen3ForCausalLM", 36, "Qwen3-8B"),
    ("Qwen3MoeForCausalLM", 48, "Qwen3-30B-A3B"),
    ("DeepseekV3ForCausalLM", 61, "DeepSeek-V3, Kimi-K2"),
    ("GptOssForCausalLM", 36, "gpt-oss-120b"),
    ("Glm4MoeForCausalLM", 92, "GLM-4.5"),
    ("Qwen2ForCausalLM", 28, "Qwen2.5-7B"),
    ("MistralForCausalLM", 40, "Mistral-Small-24B"),
    ("Qwen3NextForCausalLM", 48, "Qwen3-Next-80B-A3B"),
    ("MiniMaxM2ForCausalLM", 62, "MiniMax-M2"),
    # multimodal wrappers around a text model (docs/conventions.md, "Wrapped targets")
    ("KimiK25ForConditionalGeneration", 61, "Kimi-K2.5"),
    ("Qwen3VLForConditionalGeneration", 36, "Qwen3-VL-8B"),
    ("Qwen3_5MoeForConditionalGeneration", 60, "Qwen3.5-397B-A17B"),
    ("Llama4ForConditionalGeneration", 48, "Llama-4-Scout"),
    ("Qwen2_5_VLForConditionalGeneration", 28, "Qwen2.5-VL-7B"),
)

# Where the per-release results for COMMON_TARGETS live, so ``check`` reports release drift without
# resolving every release (regenerated with docs/sglang-matrix.md by ``wiring --matrix-doc``).
# Package data (pyproject.toml [tool.setuptools.package-data]), so an installed wheel carries it too.
DATA_FILE = Path(__file__).resolve().parent / "data" / "releases.json"
DATA_NAME = "helpers/rules/data/releases.json"      # how messages name it

# Id lists as the trainers in the field write them, as functions of the layer count.
ID_CASES: tuple[tuple[str, Callable[[int], list[int] | None]], ...] = (
    ("no ids in the config", lambda n: None),
    ("layer-output ids, SpecForge/TRT-LLM default [1, N//2-1, N-4]", lambda n: [1, n // 2 - 1, n - 4]),
    ("boundary ids, vLLM/speculators>=0.5 default [2, N//2, N-3]", lambda n: [2, n // 2, n - 3]),
    ("embedding first [-1, N//2-1, N-4]", lambda n: [-1, n // 2 - 1, n - 4]),
    ("final boundary last [1, N//2-1, N]", lambda n: [1, n // 2 - 1, n]),
)


@dataclass
class MatrixRow(HasProblems):
    version: str
    status: str
    layers_to_capture: list[int]
    served: tuple[int, ...]
    problems: list[Problem] = field(default_factory=list)
    fingerprint: str = ""        # the text of the source lines the outcome rests on (release classes)


    def example(self) -> str:
        """The first error, else the first warning worth a reader's time (not the stub's placeholders)."""
        said = ([p for p in self.problems if p.blocking]
                or [p for p in self.problems if p.kind != ProblemKind.STUB_PLACEHOLDERS])
        return str(said[0]) if said else ""


@dataclass
class Run:
    """Consecutive releases that serve the same ids the same way."""

    first: str
    last: str
    releases: int
    status: str
    layers_to_capture: list[int]
    served: tuple[int, ...]
    example: str = ""            # the first release's first error or warning, for the reader

    def to_dict(self) -> dict:
        d = asdict(self)
        d["served"] = list(self.served)
        return d


def sglang_releases() -> list[str]:
    """Every SGLang release from the first with EAGLE-3 to the newest the index lists; offline, the
    cached ones (and a note says which)."""
    try:
        listed = released_versions("sglang")
    except PackageIndexUnreachable:
        listed = cached_versions("sglang")
    return [v for v in listed if version_key(v) >= version_key(FIRST_EAGLE3)]


K = ProblemKind
# The kinds that mean some of the ids' features never reach the fc, per engine.
_SGLANG_DROPPED = {K.NEVER_CAPTURED, K.FEATURE_COUNT}
_RULE_DROPPED = {K.NEVER_CAPTURED, K.NEGATIVE_ID, K.REPEATED}


def status_of(r: WiringResult) -> str:
    """One phrase for what a release does with the ids, so runs group by outcome (the problems'
    kinds), never by wording."""
    kinds = r.kinds()
    if K.BOUNDARY0_RESIDUAL_NONE in kinds:
        return "boundary 0 raises (unpatched)"
    if K.NO_CAPTURE in kinds:
        return "no EAGLE-3 capture"
    if K.SETTER_RAISES in kinds:
        return "load fails (setter raises)"
    if K.NOT_BOUNDARIES in kinds:
        return "features are not boundaries"
    if kinds & _SGLANG_DROPPED:
        return "features dropped"
    if kinds:
        return "error"
    if any(p.kind == K.SETTER_TAKES_NO_IDS for p in r.problems):
        return "ids ignored, defaults served"
    return "served"


def fingerprint(r: WiringResult) -> str:
    """A digest of the cited source text (file and line text, not line numbers): two releases whose
    setter, id reading and capture loop read the same serve any draft alike."""
    text = sorted({(s["file"], s["text"]) for s in r.source_lines})
    return hashlib.sha256(json.dumps(text).encode()).hexdigest()[:16]


def matrix(arch: str, num_layers: int, ids: Sequence[int] | None = None, *, draft=None,
           versions: Sequence[str] | None = None, progress: bool = True,
           target_config: dict | None = None) -> list[MatrixRow]:
    """One row per release: what it serves ``arch`` with ``num_layers`` layers for these ids."""
    rows = []
    for v in tqdm(list(versions if versions is not None else sglang_releases()),
                  desc=f"SGLang releases, {arch}", disable=not progress, mininterval=1.0):
        try:
            r = resolve(Engine("sglang", v), arch, num_layers, ids=ids, draft=draft,
                        target_config=target_config, recorded=False)
        except ss.UnknownArchitectureError:
            rows.append(MatrixRow(v, "no such model class", [], ()))
            continue
        except (ss.SglangSourceError, CacheError) as exc:
            rows.append(MatrixRow(v, "source unavailable", [], (), [error(K.SOURCE_UNAVAILABLE, str(exc))]))
            continue
        except WiringError as exc:
            if exc.kind == K.SOURCE_UNAVAILABLE:    # an index (a wheelhouse) without this release
                rows.append(MatrixRow(v, "source unavailable", [], (), [error(exc.kind, str(exc))]))
                continue
            if exc.kind != K.NO_MODEL_CLASS:
                raise
            rows.append(MatrixRow(v, "no such model class", [], ()))
            continue
        rows.append(MatrixRow(v, status_of(r), list(r.layers_to_capture), tuple(r.served_layout),
                              list(r.problems), fingerprint(r)))
    return rows


def runs(rows: Sequence[MatrixRow]) -> list[Run]:
    out: list[Run] = []
    for row in rows:
        key = (row.status, row.layers_to_capture, row.served)
        if out and (out[-1].status, out[-1].layers_to_capture, out[-1].served) == key:
            out[-1].last, out[-1].releases = row.version, out[-1].releases + 1
            continue
        out.append(Run(row.version, row.version, 1, row.status, row.layers_to_capture, row.served,
                       row.example()))
    return out


def format_runs(arch: str, num_layers: int, ids, found: Sequence[Run]) -> str:
    lines = [f"SGLang releases serving {arch} (L={num_layers}) "
             f"with ids {ids if ids is not None else 'none'}:"]
    for r in found:
        span = r.first if r.first == r.last else f"{r.first} .. {r.last}"
        served = f"{r.served} {layout_label(r.served, num_layers)}" if r.served else "nothing"
        lines.append(f"  {span:<26} ({r.releases:>2})  {r.status:<30} "
                     f"layers_to_capture {r.layers_to_capture}  "
                     f"-> {served}")
    return "\n".join(lines)


def release_data(versions: Sequence[str] | None = None, progress: bool = True) -> dict:
    """Every common family x every id convention x every release, and the release classes: runs of
    consecutive releases that agree on every convention and on the source text cited. ``check``
    resolves one release per class for any draft (``across_releases``)."""
    versions = list(versions if versions is not None else sglang_releases())
    targets = {}
    for arch, n, example in COMMON_TARGETS:
        cases, keys = [], {v: [] for v in versions}
        for title, make in ID_CASES:
            ids = make(n)
            rows = matrix(arch, n, ids, versions=versions, progress=progress)
            for row in rows:
                keys[row.version].append([row.status, row.layers_to_capture, list(row.served),
                                          row.fingerprint])
            cases.append({"title": title, "ids": ids, "runs": [r.to_dict() for r in runs(rows)]})
        classes: list[dict] = []
        for v in versions:
            if classes and keys[v] == keys[classes[-1]["last"]]:
                classes[-1]["last"], classes[-1]["releases"] = v, classes[-1]["releases"] + 1
            else:
                classes.append({"first": v, "last": v, "releases": 1})
        targets[arch] = {"num_layers": n, "example": example, "cases": cases, "classes": classes}
    try:
        vllm = [v for v in released_versions("vllm") if version_key(v) >= version_key(VLLM_FIRST_EAGLE3)]
    except PackageIndexUnreachable:
        vllm = (load_release_data() or {}).get("vllm_releases", [])
    return {"generated_by": "python -m helpers wiring --matrix-doc docs/sglang-matrix.md",
            "date": str(date.today()), "sglang_releases": versions, "vllm_releases": vllm, "targets": targets}


def markdown_doc(versions: Sequence[str] | None = None, progress: bool = True,
                 data: dict | None = None) -> str:
    """docs/sglang-matrix.md: every common family x every id convention x every release."""
    data = data if data is not None else release_data(versions, progress)
    versions = data["sglang_releases"]
    out = [
        "# What each SGLang release serves, by target family and id convention",
        "",
        f"Generated by `python -m helpers wiring --matrix-doc docs/sglang-matrix.md` on {data['date']}, from "
        f"{len(versions)} releases ({versions[0]} .. {versions[-1]}), each resolved by running its own "
        "`set_eagle3_layers_to_capture` on a stub and reading its forward loop. Boundaries as in "
        "[boundaries.md](boundaries.md): b = the residual stream entering layer b, 0 = embedding, N = final "
        "state before the norm. Consecutive releases that agree are one row. The same run writes "
        "`helpers/rules/data/releases.json`, from which `check` reports release drift.",
        "",
    ]
    for arch, t in data["targets"].items():
        n = t["num_layers"]
        out += [f"## {arch} (N = {n}, as {t['example']})", "",
                f"Release classes (consecutive releases that agree on every case below and on the source "
                f"text cited): {len(t['classes'])}.", ""]
        for case in t["cases"]:
            ids = case["ids"]
            out += [f"**{case['title']}**: ids {ids if ids is not None else '(none)'}", "",
                    "| releases | count | outcome | layers_to_capture | served |", "|---|---:|---|---|---|"]
            for r in case["runs"]:
                span = r["first"] if r["first"] == r["last"] else f"{r['first']} – {r['last']}"
                served = tuple(r["served"])
                label = f"`{served}` {layout_label(served, n)}" if served else "—"
                out.append(f"| {span} | {r['releases']} | {r['status']} | `{r['layers_to_capture']}` "
                           f"| {label} |")
            out.append("")
    return "\n".join(out)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def write_doc(path: str | Path, versions: Sequence[str] | None = None, progress: bool = True,
              data_path: str | Path | None = DATA_FILE) -> Path:
    """The docs table and (unless ``data_path`` is None) the committed per-release data, from one run."""
    path = Path(path)
    data = release_data(versions, progress)
    _write(path, markdown_doc(data=data) + "\n")
    if data_path is not None:
        _write(Path(data_path), json.dumps(data, indent=1) + "\n")
        load_release_data.cache_clear()
    return path


# --------------------------------------------------------------------------------------
# Release drift for one draft: what ``check`` reports.


@lru_cache(maxsize=4)
def load_release_data(path: str | Path = DATA_FILE) -> dict | None:
    """The committed per-release data (None when the file is absent)."""
    path = Path(path)
    if not path.is_file():
        return None
    data = read_json_file(path, "release data")
    if not isinstance(data, dict) or not isinstance(data.get("targets"), dict):
        raise BadConfig(f"{path} is not the release data `wiring --matrix-doc` writes; regenerate it")
    return data


@dataclass
class Drift:
    """What every release of one engine serves this draft, in runs, and how that was found."""

    engine: str
    runs: list[Run]
    how: str
    seconds: float = 0.0

    def entries(self) -> list[dict]:
        """``check --json``'s ``served_across_releases``: served_layout None where nothing is served."""
        out = []
        for r in self.runs:
            served = list(r.served) if r.served and r.status not in _NOT_SERVED else None
            note = r.status + (f": {r.example}" if r.example and r.status != "served" else "")
            out.append({"first": r.first, "last": r.last, "releases": r.releases, "served_layout": served,
                        "note": note})
        return out

    def containing(self, version: str | None) -> Run | None:
        if not version:
            return None
        v = version_key(version)
        return next((r for r in self.runs if version_key(r.first) <= v <= version_key(r.last)), None)

    def line(self, version: str | None) -> str | None:
        """One sentence when a later release than the named one serves this draft otherwise ("from
        0.5.13 this draft is served (2, 30, 58)"), or when only earlier ones did; None when every
        release agrees. No version: the newest release is the one meant."""
        if not self.runs:
            return None
        at = self.containing(version) if version is not None else self.runs[-1]
        if at is None:
            return (f"{self.engine} {version} is not among the releases recorded ({self.runs[0].first} .. "
                    f"{self.runs[-1].last}); the newest ({self.runs[-1].last}) has this draft "
                    f"{_said(self.runs[-1])}")
        i = self.runs.index(at)
        changes, prev = [], at
        for r in self.runs[i + 1:]:
            if _outcome(r) != _outcome(prev):
                changes.append(f"from {r.first} this draft is {_said(r)}")
            prev = r
        if changes:
            return f"{self.engine}: " + "; ".join(changes)
        earlier = next((r for r in reversed(self.runs[:i]) if _outcome(r) != _outcome(at)), None)
        if earlier is None:
            return None
        # runs that differ only in why (ids read or defaulted to the same layout) serve the draft alike
        since = self.runs[self.runs.index(earlier) + 1]
        return (f"{self.engine}: up to {earlier.last} this draft was {_said(earlier)}; "
                f"{since.first} .. {self.runs[-1].last} serve it as {version or 'the newest'} does")


_NOT_SERVED = {"no such model class", "no EAGLE-3 capture", "load fails (setter raises)",
               "source unavailable", "boundary 0 raises (unpatched)", "boundary 0 raises", "error",
               "features are not boundaries", "draft class not built"}


def _outcome(r: Run) -> tuple | None:
    """What the draft gets: the layout, or None when nothing is served (a run whose reason differs
    but whose layout is the same serves the draft the same)."""
    return tuple(r.served) if r.status not in _NOT_SERVED and r.served else None


def _said(r: Run) -> str:
    if r.status == "source unavailable":
        return "not read here (its files could not be had)"
    if r.status in _NOT_SERVED or not r.served:
        return f"not served ({r.status})"
    return f"served {tuple(r.served)}" + ("" if r.status == "served" else f" ({r.status})")


def _merge(spans: list[tuple[str, str, int, MatrixRow]]) -> list[Run]:
    out: list[Run] = []
    for first, last, count, row in spans:
        key = (row.status, row.layers_to_capture, row.served)
        if out and (out[-1].status, out[-1].layers_to_capture, out[-1].served) == key:
            out[-1].last, out[-1].releases = last, out[-1].releases + count
            continue
        out.append(Run(first, last, count, row.status, row.layers_to_capture, row.served, row.example()))
    return out


def _stored_case(target: dict | None, num_layers: int, draft: dict) -> dict | None:
    """The committed case this draft is, when SGLang's only input from it is the nested id list (or
    none) and the depth is the stored one: then every release's outcome is already known."""
    if target is None or num_layers != target["num_layers"]:
        return None
    ids, where = ids_in_config(draft)
    nested = draft.get("eagle_config") if isinstance(draft.get("eagle_config"), dict) else {}
    if where == IdsAt.TOP_LEVEL or nested.get("use_aux_hidden_state", True) is False:
        return None
    return next((c for c in target["cases"] if c["ids"] == ids), None)


def sglang_across_releases(arch: str, num_layers: int, draft: dict, target_config: dict | None = None,
                           data: dict | None = None) -> Drift:
    """Every SGLang release's outcome for this draft: one release per class when ``arch`` is in the
    committed data, else (lazily) every release, and ``how`` says which."""
    started = time.perf_counter()
    data = data if data is not None else load_release_data()
    target = (data or {}).get("targets", {}).get(arch)
    case = _stored_case(target, num_layers, draft)
    if case is not None:
        found = [Run(r["first"], r["last"], r["releases"], r["status"], r["layers_to_capture"],
                     tuple(r["served"]), r.get("example", "")) for r in case["runs"]]
        return Drift("SGLang", found, f"{arch}: the stored case '{case['title']}' of {DATA_NAME} "
                     f"({data['date']}, {len(data['sglang_releases'])} releases)",
                     round(time.perf_counter() - started, 3))
    if target is not None:
        reps = [c["last"] for c in target["classes"]]
        rows = {r.version: r for r in matrix(arch, num_layers, draft=draft, versions=reps, progress=False,
                                             target_config=target_config)}
        spans = [(c["first"], c["last"], c["releases"], rows[c["last"]]) for c in target["classes"]]
        how = (f"{arch}: one release per class of {len(target['classes'])} in {DATA_NAME} "
               f"({data['date']}, {len(data['sglang_releases'])} releases)")
    else:
        versions = (data or {}).get("sglang_releases") or sglang_releases()
        found = matrix(arch, num_layers, draft=draft, versions=versions, progress=False,
                       target_config=target_config)
        spans = [(r.version, r.version, 1, r) for r in found]
        how = (f"{arch} is not in {DATA_NAME}: every release resolved now ({len(versions)}; add it to "
               f"matrix.COMMON_TARGETS and regenerate with `wiring --matrix-doc docs/sglang-matrix.md`)")
    unread = [row for *_, row in spans if row.status == "source unavailable"]
    if spans and len(unread) == len(spans):    # an air-gapped host: no release read, none guessed
        why = unread[0].problems[0].message if unread[0].problems else "no release could be read"
        return Drift("SGLang", [], f"not read now, no release's files could be had here ({why[:200]})",
                     round(time.perf_counter() - started, 3))
    return Drift("SGLang", _merge(spans), how, round(time.perf_counter() - started, 3))


def vllm_status(r: WiringResult) -> str:
    """One phrase per outcome of a recorded rule (vLLM, llama.cpp), free of version numbers, so releases
    group by what happens (the problems' kinds)."""
    kinds = r.kinds()
    if K.NO_CAPTURE in kinds:
        return "no EAGLE-3 capture"
    if K.BOUNDARY0_RESIDUAL_NONE in kinds:
        return "boundary 0 raises"
    if kinds & _RULE_DROPPED:
        return "features dropped"
    if kinds:
        return "error"
    if any(p.kind == K.IDS_IGNORED for p in r.problems) or (r.ids_used is None):
        return "ids ignored, defaults served"
    return "served"


def vllm_rule_versions() -> list[str]:
    """The releases where a recorded vLLM rule changes: enough to show every run when the committed
    release list is absent."""
    found = {VLLM_FIRST_EAGLE3, VLLM_READS_TOP_LEVEL, VLLM_V1_READS_NESTED, VLLM_FC_FROM_CONFIG,
             VLLM_NEWEST_READ}
    found |= {first for first, _ in VLLM_V2_DEFAULT}
    found |= {v for row in VLLM_CAPTURE.values() for v in row[:2] if v}
    found |= set(VLLM_DRAFT_CLASS_FIRST.values())
    return sorted(found, key=version_key)


def vllm_across_releases(arch: str, num_layers: int, draft: dict, runner: str | None = None,
                         data: dict | None = None) -> Drift:
    """Every vLLM release's rule (engines.vllm.rule.VLLM_*) applied to this draft, in runs."""
    started = time.perf_counter()
    data = data if data is not None else load_release_data()
    versions = (data or {}).get("vllm_releases") or vllm_rule_versions()
    spans = []
    for v in versions:
        builds, why = vllm_draft_class(v, draft)
        if builds is False:              # the engine refuses the draft before any capture is set up
            spans.append((v, v, 1, MatrixRow(v, "draft class not built", [], (),
                                             [error(K.DRAFT_CLASS, why)])))
            continue
        r = resolve_vllm(v, arch, num_layers, None, draft, runner)
        spans.append((v, v, 1, MatrixRow(v, vllm_status(r), list(r.layers_to_capture), tuple(r.served_layout),
                                         [p for p in r.problems if p.kind != K.NEWER_THAN_READ])))
    how = (f"vLLM: the recorded rules (engines.vllm.rule.VLLM_*) over {len(versions)} releases listed in "
           f"{DATA_NAME}" + (f" (runner {runner})" if runner else ""))
    return Drift(str(Engine("vllm", None, runner)), _merge(spans), how,
                 round(time.perf_counter() - started, 3))


def llamacpp_across_builds(arch: str, num_layers: int, draft: dict,
                           target_config: dict | None = None) -> Drift:
    """Each llama.cpp build read (engines.llamacpp.rule.LLAMACPP_BUILDS_READ) applied to this draft."""
    started = time.perf_counter()
    spans = []
    for b in sorted(LLAMACPP_BUILDS_READ):
        r = resolve_llamacpp(str(b), arch, num_layers, None, draft)
        spans.append((str(b), str(b), 1, MatrixRow(str(b), vllm_status(r), list(r.layers_to_capture),
                                                   tuple(r.served_layout),
                                                   [p for p in r.problems if p.blocking])))
    how = f"llama.cpp: the builds read ({', '.join(f'b{b}' for b in sorted(LLAMACPP_BUILDS_READ))})"
    return Drift("llama.cpp", _merge(spans), how, round(time.perf_counter() - started, 3))
