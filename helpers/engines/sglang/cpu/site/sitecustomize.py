"""Runs at the start of every Python process of a workbook SGLang launch on a CPU host (this folder, with the
stand-in ``sgl_kernel``, is on its PYTHONPATH only then): installs the CPU accommodations of
``helpers.engines.sglang.cpu.hooks`` and the model-registry hooks, so the launcher, the scheduler and the
detokenizer (forked from the launcher by the ``fork-children`` accommodation) all have them."""
import os

if os.environ.get("EAGLE3_WORKBOOK_SGLANG_HOOKS") == "cpu":
    from helpers.engines.sglang.cpu import hooks

    hooks.install()
