"""The EAGLE-3 wiring workbook's helpers (see README.md).

Importing the package in a headless Jupyter kernel (papermill) switches ``tqdm.auto`` to text
bars before any helper module imports it; see ``helpers.progress``. The environment's older variable
names are read under the one prefix first (``helpers.environment``).
"""
from .environment import adopt_old_names as _adopt_old_names
from .progress import text_bars_when_headless as _text_bars_when_headless

# What the engines' entry points (eagle3_workbook_plugin.py) check, so that a foreign package named
# ``helpers`` earlier on the path is told apart from this one.
DISTRIBUTION = "eagle3-wiring-workbook"

_adopt_old_names()
_text_bars_when_headless()
