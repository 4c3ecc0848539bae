"""The EAGLE-3 wiring workbook's helpers (see README.md).

Importing the package in a headless Jupyter kernel (papermill) switches ``tqdm.auto`` to text
bars before any helper module imports it; see ``helpers.progress``.
"""
from .progress import text_bars_when_headless as _text_bars_when_headless

# What the engines' entry points (eagle3_workbook_plugin.py) check, so that a foreign package named
# ``helpers`` earlier on the path is told apart from this one.
DISTRIBUTION = "eagle3-wiring-workbook"

_text_bars_when_headless()
