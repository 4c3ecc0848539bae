"""The workbook inside a stock SGLang: the engine guard (and, for the workbook's own launches, the capture
record, a named release's capture rule and the fc probe), with no CPU accommodation and no stand-in kernel.

SGLang 0.5.23 loads every ``sglang.srt.plugins`` entry point in its engine, scheduler, detokenizer and
data-parallel processes (``sglang/srt/plugins/__init__.py`` ``load_plugins``); this project's entry point
(``eagle3_workbook_plugin:sglang``, pyproject.toml) calls ``register`` below. It hooks
``_ModelRegistry.resolve_model_cls`` through SGLang's own ``HookRegistry`` (an AROUND hook), applies it, and
checks that the registry now passes through the hook. A release without the framework gets the same hooks
from ``site/sitecustomize.py`` (``install_watch``). SGLang logs a plugin that raises and serves on, so
failing closed means stopping the process: under ``refuse``/``strict`` a guard that cannot install raises
``GuardNotInstalled`` (a ``SystemExit``), which the loader's ``except Exception`` does not catch.

Every process that installs the guard prints one marker line (``eagle3-workbook guard (sglang RELEASE,
MODE): installed ... via HOOK; the draft path read from ACCESSOR``), so a user's log shows that the guard is
in place, on which release, and where it hooked.
"""
from __future__ import annotations

import os
import sys

from .hooks import (
    PROBE_ENV,
    REGISTRY,
    REPORT_ENV,
    RULE_ENV,
    around_resolve,
    install_watch,
    installed_release,
    report,
)

TARGET = f"{REGISTRY}._ModelRegistry.resolve_model_cls"
_installed: list[str] = []


class GuardNotInstalled(SystemExit):
    """The guard was asked to refuse but could not install: the process stops, with the reason."""


def _args_accessor() -> str:
    """Where this release publishes its server args (what the guard reads the draft path from), found
    without importing it: ``runtime_context.get_server_args`` (0.5.23), else ``get_global_server_args``."""
    import importlib.util

    try:
        if importlib.util.find_spec("sglang.srt.runtime_context") is not None:
            return "sglang.srt.runtime_context.get_server_args"
    except (ImportError, ValueError):
        pass
    return "sglang.srt.server_args.get_global_server_args"


def _wanted(how) -> bool:
    return how.value != "off" or any(os.environ.get(k) for k in (REPORT_ENV, RULE_ENV, PROBE_ENV))


def _through_hook_registry() -> str:
    """Install the AROUND hook with SGLang's HookRegistry; raise when it did not take."""
    from sglang.srt.models import registry
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    before = registry._ModelRegistry.__dict__.get("resolve_model_cls")
    HookRegistry.register(TARGET, around_resolve, HookType.AROUND)
    HookRegistry.apply_hooks()      # load_plugins applies them again after every plugin: idempotent
    if registry._ModelRegistry.__dict__.get("resolve_model_cls") is before:
        raise RuntimeError(f"HookRegistry did not wrap {TARGET}")
    return "sglang plugin (HookRegistry AROUND on _ModelRegistry.resolve_model_cls)"


def register() -> None:
    """The entry point; safe to call more than once per process."""
    from ...live import guard

    try:
        how = guard.mode()
    except ValueError as exc:       # a typo must not switch the guard off: stop, and say so
        raise GuardNotInstalled(f"{guard.PREFIX} (sglang): {exc}") from None
    if _installed or not _wanted(how):
        return
    try:
        try:
            import sglang.srt.plugins.hook_registry  # noqa: F401 - is the framework there?
        except ImportError:
            install_watch()
            way = "import watch on sglang.srt.models.registry (no plugin framework in this release)"
        else:
            way = _through_hook_registry()
    except Exception as exc:        # noqa: BLE001 - every failure is the reason given
        line = (f"{guard.PREFIX} (sglang {installed_release()}, {how}): not installed "
                f"({type(exc).__name__}: {exc})")
        if how.refusing:
            raise GuardNotInstalled(line + "; refusing to serve unguarded") from None
        if how is not guard.Mode.OFF:
            sys.stderr.write(line + "; the engine starts unjudged\n")
        return
    _installed.append(way)
    if how is not guard.Mode.OFF:
        line = (f"{guard.PREFIX} (sglang {installed_release()}, {how}): installed in pid {os.getpid()} via "
                f"{way}; the draft path read from {_args_accessor()}")
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
        report("guard-installed", line, f"EAGLE3_WORKBOOK_GUARD={how}", "", event="guard-installed",
               pid=os.getpid())
