"""The workbook's engine entry points, under a name no other distribution uses.

vLLM (``vllm.general_plugins``) and SGLang (``sglang.srt.plugins``) call ``vllm`` and ``sglang`` below in
each of their processes. The workbook's code lives in the package ``helpers``, a name other projects use
too: an entry point written as ``helpers.live...`` would import whichever ``helpers`` comes first on the
path, and an engine logs a plugin that fails to import and serves on. This module imports nothing but
the standard library, so its own import cannot fail that way. It checks that ``helpers`` is the copy
installed beside it before handing over. When it is not, and ``EAGLE3_WORKBOOK_GUARD=refuse``, it raises:
both engines call a loaded plugin outside their import ``try`` (vllm/plugins/__init__.py
``load_general_plugins``; sglang/srt/plugins/__init__.py ``load_plugins``), so the launch stops before a
model loads. Under ``warn`` it prints one line and the engine starts unguarded; under ``off`` it is silent.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

GUARD_ENV = "EAGLE3_WORKBOOK_GUARD"
DISTRIBUTION = "eagle3-wiring-workbook"
PREFIX = "eagle3-workbook guard"


class GuardNotInstalled(SystemExit):
    """Raised inside the engine under ``refuse``/``strict`` when the guard cannot be installed. A SystemExit,
    because SGLang's loader catches ``Exception`` from a plugin and serves on; the code is the one line."""


def _mode() -> str:
    return (os.environ.get(GUARD_ENV) or "off").strip().lower() or "off"


def own_helpers() -> tuple[object | None, str]:
    """(the workbook's ``helpers`` module, "") or (None, why the ``helpers`` on the path is not it)."""
    expected = Path(__file__).resolve().parent / "helpers"
    try:
        import helpers
    except Exception as exc:  # noqa: BLE001 - any failure to import is the reason given
        return None, f"cannot import helpers ({type(exc).__name__}: {exc}); expected it at {expected}"
    where = Path(getattr(helpers, "__file__", "") or ".").resolve().parent
    if getattr(helpers, "DISTRIBUTION", None) != DISTRIBUTION:
        return None, (f"'helpers' resolves to {where}, another package of that name (shadowed: the "
                      f"workbook's is {expected}); put the workbook first on sys.path or remove the other")
    if where != expected:
        return None, (f"'helpers' resolves to {where}, another copy of the workbook than the one installed "
                      f"with this entry point ({expected})")
    return helpers, ""


def _cannot_install(engine: str, why: str) -> None:
    mode = _mode()
    if mode == "off":
        return
    if mode in ("refuse", "strict"):
        # a SystemExit whose code is the line: the interpreter (or multiprocessing's bootstrap) prints it once
        raise GuardNotInstalled(f"{PREFIX} ({engine}, refuse): not installed: {why}; refusing to serve "
                                f"unguarded")
    sys.stderr.write(f"{PREFIX} ({engine}, {mode}): not installed, the engine starts unjudged: {why}\n")
    sys.stderr.flush()


def vllm() -> None:
    """``vllm.general_plugins`` entry point: the workbook's vLLM plugin (fixes and guard)."""
    if own_helpers()[0] is None:
        _cannot_install("vllm", own_helpers()[1])
        return
    from helpers.engines.vllm.plugin import register

    register()


def sglang() -> None:
    """``sglang.srt.plugins`` entry point: the guard inside SGLang (no CPU accommodation ever)."""
    if own_helpers()[0] is None:
        _cannot_install("sglang", own_helpers()[1])
        return
    from helpers.engines.sglang.plugin import register

    register()
