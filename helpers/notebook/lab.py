"""Parameter overrides for notebooks opened in JupyterLab.

papermill sets a notebook's parameters with ``-p NAME=VALUE``; an interactive session has no such
door, so ``bash workbook.sh lab`` passes its environment on to the kernels and a notebook's second
cell applies what it finds there:

- ``EAGLE3_WORKBOOK_SMALL=1``: the small settings the notebook tests use (``SMALL``), a quick
  pass through the notebook on fewer windows of text and prompts;
- ``EAGLE3_WORKBOOK_PARAMS='{"TARGET": "/models/t", "EVAL_WINDOWS": 6}'``: any parameters, as JSON (applied
  after ``EAGLE3_WORKBOOK_SMALL``).

Headless runs (papermill, where ``-p`` is the door) ignore both, so a variable left in a shell
cannot change what ``bash workbook.sh run`` reports.
"""
from __future__ import annotations

import json
import os

from ..progress import interactive_frontend
from .parameters import rename_parameter

# The small settings: ``run-workbook --small``, the notebook tests and ``EAGLE3_WORKBOOK_SMALL=1`` share them.
SMALL = {"NUM_PROMPTS": 2, "MAX_NEW_TOKENS": 24, "REPEATS": 1, "EVAL_WINDOWS": 3, "DRAFT_STEPS": 3,
         "SEARCH_WINDOWS": 2, "KERNELS": None}


def overrides(params: dict, environ=None, interactive: bool | None = None) -> dict:
    """The parameter values the environment asks for. ``params`` is the notebook's namespace after
    its parameters cell; only names it already defines (upper case) can be overridden, so a typo
    fails here with the list of names instead of silently doing nothing."""
    if not (interactive_frontend() if interactive is None else interactive):
        return {}
    env = os.environ if environ is None else environ
    known = {k for k in params if k.isupper() and not k.startswith("_")}
    out: dict = {}
    if env.get("EAGLE3_WORKBOOK_SMALL", "") not in ("", "0"):
        out.update({k: v for k, v in SMALL.items() if k in known})
    raw = env.get("EAGLE3_WORKBOOK_PARAMS", "")
    if raw:
        try:
            extra = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ValueError(f"EAGLE3_WORKBOOK_PARAMS is not JSON ({exc}): {raw[:200]!r}") from None
        if not isinstance(extra, dict):
            raise ValueError(f"EAGLE3_WORKBOOK_PARAMS must be a JSON object of parameters, got {raw[:200]!r}")
        extra = {rename_parameter(k): v for k, v in extra.items()}
        unknown = sorted(set(extra) - known)
        if unknown:
            raise ValueError(f"EAGLE3_WORKBOOK_PARAMS names {unknown}, which this notebook does not take; "
                             f"its parameters: {sorted(known)}")
        wrong = [f"{k} must be {_kind(params[k])}, got {v!r}" for k, v in extra.items()
                 if not _fits(params[k], v)]
        if wrong:
            raise ValueError(f"EAGLE3_WORKBOOK_PARAMS: {'; '.join(wrong)}")
        out.update(extra)
    return out


def _fits(default, value) -> bool:
    """A value of the parameter's own kind: an integer for an integer, text for text, and text (a path)
    or null where the notebook's default is None."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int)
    if default is None:
        return value is None or isinstance(value, str)
    return isinstance(value, type(default))


def _kind(default) -> str:
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, int):
        return "an integer"
    return "text (a path or a value as written)" if default is None or isinstance(default, str) else \
        f"a {type(default).__name__}"
