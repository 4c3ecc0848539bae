"""What every SGLang release since EAGLE-3 serves for the same draft: the engine side over time.

Each release is resolved by running and reading its own code (``wiring.resolve``), so a rule that
changed in some release shows up as a new run of releases, without anyone writing the rule down.
Releases are grouped into runs that agree on the outcome (what is captured, what is served, and
whether it serves at all), which is the form people need: "from 0.5.13 on, these ids mean
something else for DeepSeek".
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import date
from pathlib import Path
from typing import Callable, Sequence

from tqdm.auto import tqdm

from .boundaries import WiringError, WiringResult, layout_label
from .conventions import version_tuple
from .errors import CacheError
from .sglang import source as ss
from .wheels import PackageIndexUnreachable, released_versions
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
)

# Id lists as the trainers in the field write them, as functions of the layer count.
ID_CASES: tuple[tuple[str, Callable[[int], list[int] | None]], ...] = (
    ("no ids in the config", lambda n: None),
    ("layer-output ids, SpecForge/TRT-LLM default [1, N//2-1, N-4]", lambda n: [1, n // 2 - 1, n - 4]),
    ("boundary ids, vLLM/speculators>=0.5 default [2, N//2, N-3]", lambda n: [2, n // 2, n - 3]),
    ("embedding first [-1, N//2-1, N-4]", lambda n: [-1, n // 2 - 1, n - 4]),
    ("final boundary last [1, N//2-1, N]", lambda n: [1, n // 2 - 1, n]),
)


@dataclass
class MatrixRow:
    version: str
    status: str
    layers_to_capture: list[int]
    served: tuple[int, ...]
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


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
        root = ss.cache_root()
        listed = sorted((p.name for p in root.iterdir() if (p / ".complete").is_file())
                        if root.is_dir() else [],
                        key=version_tuple)
    return [v for v in listed if version_tuple(v) >= version_tuple(FIRST_EAGLE3)]


def status_of(r: WiringResult) -> str:
    """One phrase for what a release does with the ids, so runs group by outcome, not by wording."""
    text = " ".join(r.errors)
    if any(h["kind"] == "boundary0-residual-none" for h in r.hazards):
        return "boundary 0 raises (unpatched)"
    if "defines no set_eagle3_layers_to_capture" in text or "cannot turn on EAGLE3" in text:
        return "no EAGLE-3 capture"
    if "failed" in text and "set_eagle3_layers_to_capture" in text:
        return "load fails (setter raises)"
    if "are not boundaries" in text:
        return "features are not boundaries"
    if "never captured" in text or "matches no layer" in text or "would concatenate" in text:
        return "features dropped"
    if r.errors:
        return "error"
    if any("no ids parameter" in w for w in r.warnings):
        return "ids ignored, defaults served"
    return "served"


def matrix(arch: str, num_layers: int, ids: Sequence[int] | None = None, *, draft=None,
           versions: Sequence[str] | None = None, progress: bool = True) -> list[MatrixRow]:
    """One row per release: what it serves ``arch`` with ``num_layers`` layers for these ids."""
    rows = []
    for v in tqdm(list(versions if versions is not None else sglang_releases()),
                  desc=f"SGLang releases, {arch}", disable=not progress, mininterval=1.0):
        try:
            r = resolve(f"sglang=={v}", arch, num_layers, ids=ids, draft=draft)
        except ss.UnknownArchitectureError:
            rows.append(MatrixRow(v, "no such model class", [], ()))
            continue
        except WiringError as exc:
            if "no model class registered" not in str(exc):
                raise
            rows.append(MatrixRow(v, "no such model class", [], ()))
            continue
        except (ss.SglangSourceError, CacheError) as exc:
            rows.append(MatrixRow(v, "source unavailable", [], (), [str(exc)]))
            continue
        rows.append(MatrixRow(v, status_of(r), list(r.layers_to_capture), tuple(r.served_layout),
                              list(r.errors), list(r.warnings)))
    return rows


def runs(rows: Sequence[MatrixRow]) -> list[Run]:
    out: list[Run] = []
    for row in rows:
        key = (row.status, row.layers_to_capture, row.served)
        if out and (out[-1].status, out[-1].layers_to_capture, out[-1].served) == key:
            out[-1].last, out[-1].releases = row.version, out[-1].releases + 1
            continue
        example = (row.errors or [w for w in row.warnings if "placeholders" not in w] or [""])[0]
        out.append(Run(row.version, row.version, 1, row.status, row.layers_to_capture, row.served, example))
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


def markdown_doc(versions: Sequence[str] | None = None, progress: bool = True) -> str:
    """docs/sglang-matrix.md: every common family x every id convention x every release."""
    versions = list(versions if versions is not None else sglang_releases())
    out = [
        "# What each SGLang release serves, by target family and id convention",
        "",
        f"Generated by `python -m helpers wiring --matrix-doc docs/sglang-matrix.md` on {date.today()}, from "
        f"{len(versions)} releases ({versions[0]} .. {versions[-1]}), each resolved by running its own "
        "`set_eagle3_layers_to_capture` on a stub and reading its forward loop. Boundaries as in "
        "[boundaries.md](boundaries.md): b = the residual stream entering layer b, 0 = embedding, N = final "
        "state before the norm. Consecutive releases that agree are one row.",
        "",
    ]
    for arch, n, example in COMMON_TARGETS:
        out += [f"## {arch} (N = {n}, as {example})", ""]
        for title, make in ID_CASES:
            ids = make(n)
            found = runs(matrix(arch, n, ids, versions=versions, progress=progress))
            out += [f"**{title}**: ids {ids if ids is not None else '(none)'}", "",
                    "| releases | count | outcome | layers_to_capture | served |", "|---|---:|---|---|---|"]
            for r in found:
                span = r.first if r.first == r.last else f"{r.first} – {r.last}"
                served = f"`{r.served}` {layout_label(r.served, n)}" if r.served else "—"
                out.append(f"| {span} | {r.releases} | {r.status} | `{r.layers_to_capture}` | {served} |")
            out.append("")
    return "\n".join(out)


def write_doc(path: str | Path, versions: Sequence[str] | None = None, progress: bool = True) -> Path:
    path = Path(path)
    text = markdown_doc(versions, progress)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
