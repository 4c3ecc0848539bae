"""Runs at the start of every Python process of a workbook SGLang launch (this folder is on its
PYTHONPATH only then): installs the import hooks of ``helpers.live.sglang.cpu.hooks`` so the launcher, the
scheduler and the detokenizer (spawned, fresh interpreters) all get the same accommodations."""
import os

if os.environ.get("EAGLE3_WORKBOOK_SGLANG_HOOKS") or os.environ.get("EAGLE3_WORKBOOK_GUARD", "off") != "off":
    from helpers.live.sglang.cpu import hooks

    hooks.install()
