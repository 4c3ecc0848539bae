"""The workbook's environment variables share one prefix, ``EAGLE3_WORKBOOK_`` (the distribution's name:
the engines' processes see them too). The older names without ``EAGLE3_`` still work: each is read as its
new name, with one deprecation line, when the package is first imported (``workbook.sh`` does the same
for the shell)."""
from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping
from typing import TextIO

PREFIX = "EAGLE3_WORKBOOK_"
OLD_PREFIX = "WORKBOOK_"


def adopt_old_names(environ: MutableMapping[str, str] = os.environ, err: TextIO | None = None) -> list[str]:
    """Copy each ``WORKBOOK_X`` the new name ``EAGLE3_WORKBOOK_X`` does not already set, saying so once per
    name on ``err`` (stderr); returns the old names read. A child process inherits the new name and says
    nothing more."""
    read = []
    for name in sorted(environ):
        if not name.startswith(OLD_PREFIX):
            continue
        new = "EAGLE3_" + name
        if new in environ:
            continue
        environ[new] = environ[name]
        read.append(name)
        print(f"warning: {name} is deprecated; read as {new} (rename it)", file=err or sys.stderr)
    return read
