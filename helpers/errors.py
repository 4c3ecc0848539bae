"""Error kinds every command turns into one line and exit status 2, and strict JSON output.

A user's bad input (a path, a checkpoint, a config, a text file, an option) must end in one
line that names what was expected and what came, and must change nothing. Each kind of input
has its own exception type so a command can catch them all in one place.
"""
from __future__ import annotations

import json
import math


class InputError(ValueError):
    """Bad input of any kind; the message is the whole story, said in one line."""


class BadCheckpoint(InputError):
    """Weights that cannot be read, or that hold numbers that cannot be trusted."""


class BadConfig(InputError):
    """A config file that is not JSON, or lacks what it must say."""


class BadText(InputError):
    """A text, prompts or data file that cannot be read as what it claims to be."""


class BadOption(InputError):
    """A command-line option or notebook parameter out of range."""


def finite_or_none(obj):
    """The same structure with every non-finite float replaced by None (JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def strict_json(obj, **kw) -> str:
    """``json.dumps`` that never writes the bare ``NaN``/``Infinity`` strict parsers reject."""
    return json.dumps(finite_or_none(obj), allow_nan=False, **kw)
