"""The EAGLE-3 wiring workbook's helpers (see README.md).

Importing the package in a headless Jupyter kernel (papermill) switches ``tqdm.auto`` to text
bars before any helper module imports it; see ``helpers.progress``.
"""
from .progress import text_bars_when_headless as _text_bars_when_headless

_text_bars_when_headless()
