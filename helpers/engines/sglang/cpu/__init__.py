"""The workbook's SGLang accommodations for a CPU host, owned like the vLLM plugin (docs/sglang-cpu.md).

SGLang 0.5.23 serves EAGLE-3 on a CPU without AMX once a few things are supplied from outside its own
files: a stand-in ``sgl_kernel`` (``site/sgl_kernel``, ops in ``ops``), import-time hooks (``hooks``,
installed by ``site/sitecustomize.py`` in every process of a launch), environment variables and flags.
``helpers.engines.sglang.engine`` applies them per launch, only on a CPU host, and records each in the run's
record. The engine guard is not one of them (``helpers.engines.sglang.hooks`` and ``plugin``): a CUDA launch,
or a user's stock server, gets the guard and never this folder.
They touch private names of that one release, so they are pinned to it: another release is refused in one
line. Nothing here imports sglang; ``hooks`` runs only inside SGLang's processes.
"""
from __future__ import annotations

import re
from pathlib import Path

from ....errors import InputError

RELEASE = "0.5.23"                 # the release the accommodations were written for, and read from
SITE = Path(__file__).with_name("site")   # on the SGLang process's PYTHONPATH: sgl_kernel + sitecustomize



class UnsupportedRelease(InputError):
    """The accommodations are for one SGLang release; another is refused in one line."""


def check_release(found: str) -> None:
    if found != RELEASE:
        raise UnsupportedRelease(f"the workbook's SGLang CPU accommodations are written for "
                                 f"sglang=={RELEASE}; found sglang=={found} (set it up with bash workbook.sh "
                                 f"sglang)")


def launch_accommodations(threads: int) -> list[dict]:
    """What the engine itself sets for a CPU launch (the hooks report theirs from inside SGLang)."""
    return [
        {"name": "cpu-engine", "what": "SGLANG_USE_CPU_ENGINE=1",
         "why": "is_cpu() is False without it whatever --device says (srt/utils/common.py:221-224)"},
        {"name": "threads", "what": f"OMP_NUM_THREADS={threads}, torch threads bounded",
         "why": "the host's cores are shared; SGLang would otherwise take them all"},
        {"name": "sgl_kernel-stand-in", "what": f"{SITE / 'sgl_kernel'} on PYTHONPATH: torch implementations "
         "of the ten ops an EAGLE-3 run calls; every other name raises NotImplementedError when called",
         "why": "about 13 CPU code paths import sgl_kernel at module level (e.g. kernels/ops/kvcache/"
                "cache_move.py:10) and no CPU build of it is on the registry"},
        {"name": "intel-amx-backend", "what": "--attention-backend intel_amx (its two ops from the stand-in)",
         "why": "EAGLE on CPU needs it: srt/speculative/draft_utils.py:64 rejects torch_native, and "
                "torch_native cannot serve an MLA target (torch_native_backend.py:160)"},
    ]


# model modules a speculative launch may reach by name besides the configs' architectures: the draft's own
# class families and the target's next-token heads (SGLang swaps a draft's architecture for these)
SPECULATIVE_MODULES = re.compile(r"eagle|nextn|mtp")


def unneeded_model_modules(venv: Path, architectures: set[str]) -> tuple[list[str], list[str]]:
    """The modules of ``sglang.srt.models`` a launch never loads, and those it may: a module is kept when its
    source names one of ``architectures`` (the target's and the draft's config) or it is a speculative
    module. SGLang imports every model module at start in each of its processes
    (``srt/models/registry.py`` ``import_model_classes``) unless ``SGLANG_DISABLED_MODEL_ARCHS`` names it;
    on a CPU host that import is seconds of every start. Empty lists where the folder is not found: nothing
    is skipped."""
    folders = sorted(Path(venv).glob("lib/python*/site-packages/sglang/srt/models"))
    if not folders or not architectures:
        return [], []
    names = re.compile(r"\b(" + "|".join(map(re.escape, sorted(architectures))) + r")\b")
    skipped, kept = [], []
    for path in sorted(folders[0].glob("*.py")):
        if path.stem.startswith("_"):
            continue
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            kept.append(path.stem)
            continue
        (kept if SPECULATIVE_MODULES.search(path.stem) or names.search(text) else skipped).append(path.stem)
    return skipped, kept


def registry_note(skipped: list[str], kept: list[str]) -> dict:
    return {"name": "model-registry",
            "what": f"SGLANG_DISABLED_MODEL_ARCHS: {len(skipped)} of {len(skipped) + len(kept)} model "
                    f"modules not imported; kept {', '.join(kept)}",
            "why": "SGLang imports every model module in each of its processes at start (srt/models/"
                   "registry.py import_model_classes); on a CPU host that is seconds of every start, and "
                   "this launch loads only the target's and the draft's architectures"}
