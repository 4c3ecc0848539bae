"""Every third-party module ``helpers/`` imports is declared in pyproject.toml (its [project] dependencies or
an optional-dependencies group), or is one of the few exempt below for a stated reason. Read statically
(the syntax trees of the sources, the TOML): nothing is imported or installed."""
from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HELPERS = REPO / "helpers"

# An import name that is not its distribution's name.
DISTRIBUTION = {"yaml": "pyyaml", "IPython": "ipython"}

# Imported but never declared, each for a reason; engine packages only from the folders named.
EXEMPT = {
    # the CPU or CUDA build is the user's choice (pyproject.toml's comment, docs/install.md)
    "torch": (None, "the user's own build"),
    # the engines' own packages: imported only by code that runs inside the engine's processes (its plugin,
    # worker, connector), where the engine is installed; a serving venv pins its own versions
    "vllm": ("helpers/engines/vllm/", "runs inside vLLM's own processes"),
    "sglang": ("helpers/engines/sglang/", "runs inside SGLang's own processes"),
    # looked up offline in a try that takes its absence (the guard, inside an engine, which ships it)
    "huggingface_hub": ("helpers/live/guard.py", "optional: a hub id's cached snapshot, absent is fine"),
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    reqs = list(project.get("dependencies", []))
    for group in project.get("optional-dependencies", {}).values():
        reqs += group
    return {_norm(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0]) for r in reqs}


def third_party_imports() -> dict[str, set[str]]:
    """top-level module -> the files under helpers/ that import it (at any depth of the file)."""
    found: dict[str, set[str]] = {}
    for path in sorted(HELPERS.rglob("*.py")):
        rel = str(path.relative_to(REPO))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("helpers", "__future__"):
                    found.setdefault(top, set()).add(rel)
    return found


def test_every_third_party_import_is_declared():
    have = declared()
    missing = {}
    for top, files in third_party_imports().items():
        if _norm(DISTRIBUTION.get(top, top)) in have:
            continue
        where, _why = EXEMPT.get(top, ("", ""))
        if top in EXEMPT and (where is None or all(f.startswith(where) for f in files)):
            continue
        missing[top] = sorted(files)
    assert not missing, f"imported under helpers/ but not declared in pyproject.toml: {missing}"


def test_the_check_reads_what_it_should():
    """The reader sees the imports this project is known to make, and a name that is not declared."""
    found = third_party_imports()
    assert {"yaml", "packaging", "prometheus_client", "safetensors", "torch", "vllm"} <= set(found)
    assert "helpers/investigation/trainer_output.py" in found["yaml"]
    have = declared()
    assert {"pyyaml", "packaging", "prometheus-client", "safetensors", "numpy", "tqdm"} <= have
    assert "torch" not in have and "vllm" not in have
