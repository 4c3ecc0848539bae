"""The one parameters cell every notebook starts with (after its title), and what it names.

Each notebook's cell tagged ``parameters`` is ``CELL``, character for character (tests/test_notebooks.py
checks it; ``write_cells`` puts it back after an edit here): papermill overrides these names, a person edits
them in place, and a parameter means the same thing in every notebook, whether that notebook reads it or
not. ``NAMES`` and ``DEFAULTS`` are read from the same text, so the runner checks overrides against this one
place."""
from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

CELL = '''# Parameters: papermill overrides these. None means the embedded default.
TARGET = None            # Hugging Face target directory, default data/tiny-kimi/target
DRAFT = None             # EAGLE-3 draft (SGLang or speculators format), default data/tiny-kimi/draft
RETRAINED_DRAFT = None   # fix B, retrained on the served layout, default data/tiny-kimi/draft-retrained
TRAINING_LAYOUT = None   # e.g. 0,3,7 as a string. None means the training record, else inferred
BACKEND = "reference"    # reference: this workbook's engine; sglang / vllm: the real engine (.venv-sglang,
                         # .venv-vllm); llamacpp: llama-server, on a Llama pair such as data/tiny-llama
# ENGINE_VERSION: whose wiring rules decide the served layout (run-workbook --engine), e.g. sglang==0.5.23
# or vllm. The default is the case replay, for the embedded pair only: capture rule sglang 0.5.9
ENGINE_VERSION = "sglang==0.5.9"
DEVICE = "cpu"
PROMPTS = None           # JSONL with a prompt field per line, default prompts.jsonl beside the target
DRAFT_STEPS = 5          # draft tokens per verify step
MAX_NEW_TOKENS = 64
NUM_PROMPTS = 6
REPEATS = 2
EVAL_WINDOWS = 12        # 256-token windows of held-out text for the isolated tests
SEARCH_WINDOWS = 4
DATA = None              # notebook 02: a trainer's hidden-state dump (speculators or SpecForge layout)
REPORTS_DIR = "../reports"
PATCH_ROOT = None        # private SGLang source copy to patch, default REPORTS_DIR/sglang-VERSION
METRICS = None           # notebook 01: a /metrics scrape, a log or responses; None: the live engine's
KERNELS = "llamacpp x96" # notebooks 01 and 06: the same miswiring on llama.cpp's own kernels, its Llama pair
                         # data/tiny-llama with a target widened 96x (a real target's cost), in the weight
                         # type chosen on the host (a third word fixes it: f16, bf16, f32 or q8_0);
                         # None skips it'''


def _defaults(text: str) -> dict:
    out = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = ast.literal_eval(node.value)
    return out


DEFAULTS: dict = _defaults(CELL)
NAMES: tuple[str, ...] = tuple(DEFAULTS)

# Parameters renamed, old -> new: ENGINE named the runtime, which the CLI calls --backend (ENGINE_VERSION,
# like --engine, names whose rules). An old name is still read as its new one, with one deprecation line.
RENAMED = {"ENGINE": "BACKEND"}


def rename_parameter(name: str, err=None) -> str:
    """``name``, or the new name of a renamed parameter (said on ``err``, stderr by default)."""
    if name not in RENAMED:
        return name
    print(f"warning: the parameter {name} is now {RENAMED[name]}; read as {RENAMED[name]} (rename it)",
          file=err or sys.stderr)
    return RENAMED[name]


def parameters_cell(nb: dict) -> dict | None:
    """The notebook's cell tagged ``parameters`` (an nbformat dict), or None."""
    return next((c for c in nb.get("cells", []) if "parameters" in c.get("metadata", {}).get("tags", [])),
                None)


def write_cells(paths: list[Path]) -> list[Path]:
    """Put ``CELL`` into each notebook's parameters cell; returns the notebooks changed."""
    changed = []
    for p in paths:
        nb = json.loads(Path(p).read_text(encoding="utf-8"))
        cell = parameters_cell(nb)
        if cell is None or "".join(cell["source"]) == CELL:
            continue
        cell["source"] = CELL.splitlines(keepends=True)
        Path(p).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        changed.append(Path(p))
    return changed
