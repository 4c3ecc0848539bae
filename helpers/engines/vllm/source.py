"""A vLLM release's own source, read to confirm the rule ``conventions`` applies for it.

vLLM's rules (``conventions.VLLM_*``) were read from every release's wheel up to 0.34.0; the id rule itself
is run from each release's own functions (``engines.vllm.own``). This module is the check a user runs when it
matters (``wiring --engine vllm==X --read-source``), and for a
release newer than the ones read. It keeps only ``vllm/v1/worker`` and ``vllm/model_executor/models``
and reports what they say about the three facts that decide the served layout: whether the draft's
top-level ids are read, whether the V1 runner falls back to ``eagle_config``'s, and how the target
class captures (before each layer, or after each layer so that boundary N is reachable).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from ...rules.conventions import IDS_KEY
from .own import model_module, release_files
from .rule import VLLM_CAPTURE, VLLM_READS_TOP_LEVEL, VLLM_V1_READS_NESTED, at_least

FOLDERS = ("vllm/v1/worker/", "vllm/model_executor/models/")
_TOP = re.compile(rf'(getattr|hasattr)\(\s*hf_config\s*,\s*"{IDS_KEY}"|hf_config\.{IDS_KEY}\b')
_NESTED = re.compile(rf'eagle_config\b.*(\.get\(\s*|\[\s*)"{IDS_KEY}"')


@dataclass
class VllmFacts:
    version: str
    arch: str
    reads_top_level: list[dict] = field(default_factory=list)    # {"file", "line", "text"}
    reads_nested: list[dict] = field(default_factory=list)       # in the V1 runner
    model_file: str | None = None
    capture: str = "none"          # "before" | "before+end" | "after" (mixin) | "none"
    capture_lines: list[dict] = field(default_factory=list)
    has_v1: bool = True            # the release has the V1 runner (0.34 deleted it)

    def evidence(self) -> list[dict]:
        return self.reads_top_level + self.reads_nested + self.capture_lines


def read_facts(root: Path, version: str, arch: str) -> VllmFacts:
    """What the files under ``root`` (a folder holding ``vllm/``) say for ``arch``."""
    facts = VllmFacts(version, arch)
    facts.has_v1 = (root / "vllm" / "v1" / "worker" / "gpu_model_runner.py").is_file()
    worker = root / "vllm" / "v1" / "worker"
    for path in sorted(worker.rglob("*.py")) if worker.is_dir() else []:
        rel = path.relative_to(root).as_posix()
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            ref = {"file": rel, "line": n, "text": line.strip()}
            if _NESTED.search(line) and path.name == "gpu_model_runner.py":
                facts.reads_nested.append(ref)
            elif _TOP.search(line):
                facts.reads_top_level.append(ref)
    rel = model_module(root, arch)       # the registry's entry, packages followed (vllm.models.<pkg> in 0.33)
    if rel is None or not (root / rel).is_file():
        return facts
    facts.model_file = rel
    _read_capture(root, rel, facts, seen=set())
    return facts


def _read_capture(root: Path, rel: str, facts: VllmFacts, seen: set[str]) -> None:
    """The capture style in the file ``rel``, or in the modules it builds on (Qwen3 runs Qwen2Model's
    loop), relative imports followed from its own folder."""
    path = root / rel
    if rel in seen or not path.is_file():
        return
    seen.add(rel)
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()

    def refs(pattern: str) -> list[dict]:
        return [{"file": rel, "line": n, "text": ln.strip()}
                for n, ln in enumerate(lines, 1) if pattern in ln]

    after = refs("_maybe_add_hidden_state(")
    end = refs("self.end_layer in self.aux_hidden_state_layers")
    before = [r for r in refs("in self.aux_hidden_state_layers") if r not in end]
    if after or before:
        facts.capture = "after" if after else ("before+end" if end else "before")
        facts.capture_lines = (after or before)[:2] + end[:1]
        return
    found = re.findall(r"^\s*from (\.*)([\w.]+) import (\([^)]*\)|[^\n]*)", text, re.M)
    for dots, module, names in found:
        if not re.search(r"Model\b", names) or (not dots and not module.startswith("vllm.")):
            continue
        base = Path(rel).parent if dots else Path(".")
        for _ in range(len(dots) - 1):
            base = base.parent
        stem = (base / module.replace(".", "/")).as_posix()
        target = f"{stem}.py" if (root / f"{stem}.py").is_file() else f"{stem}/__init__.py"
        _read_capture(root, target, facts, seen)
        if facts.capture != "none":
            return


def expected_capture(version: str, arch: str) -> str:
    first, final_from, _ = VLLM_CAPTURE.get(arch, ("0.8.5", "0.18.0", False))
    if not at_least(version, first):
        return "none"
    if at_least(version, final_from):
        return "before+end" if arch.startswith("Deepseek") else "after"
    return "before"


def disagreements(facts: VllmFacts) -> list[str]:
    """Where the release's files say something other than the rule the workbook applies for it."""
    v, out = facts.version, []
    top, nested = at_least(v, VLLM_READS_TOP_LEVEL), at_least(v, VLLM_V1_READS_NESTED)
    if bool(facts.reads_top_level) != top:
        out.append(f"the rule says vLLM {v} {'reads' if top else 'ignores'} the top-level {IDS_KEY}; its "
                   f"worker code {'does' if facts.reads_top_level else 'does not'}")
    if bool(facts.reads_nested) != nested and facts.has_v1:
        out.append(f"the rule says vLLM {v}'s V1 runner {'reads' if nested else 'ignores'} eagle_config's "
                   f"ids; gpu_model_runner.py {'does' if facts.reads_nested else 'does not'}")
    want = expected_capture(v, facts.arch)
    if facts.capture != want:
        out.append(f"the rule says vLLM {v} captures {facts.arch} {want!r}; "
                   f"{facts.model_file or 'no registered model file'} captures {facts.capture!r}")
    return out


def verify(version: str, arch: str) -> tuple[VllmFacts, list[str]]:
    """Read the release's files (by ranges where the index serves them, else its whole wheel, once) and
    compare."""
    facts = read_facts(release_files(version, whole=True), version, arch)
    return facts, disagreements(facts)
