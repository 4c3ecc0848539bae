"""Progress bars that suit whoever runs the notebook.

``tqdm.auto`` draws a widget bar in any Jupyter kernel. In JupyterLab that is right. In a
papermill run (``bash workbook.sh run``, the tests) nothing renders widgets: the executed notebook
keeps only the bar's first frame ("0%") as text, and the HTML report shows an empty box. So in a
kernel whose current request cannot take keyboard input, a headless client, ``tqdm.auto`` is
pointed at the plain text bar before any helper imports it.

nbclient (under papermill and ``nbconvert --execute``) sends every cell with ``allow_stdin``
false; JupyterLab, Notebook and VS Code send it true because they can answer ``input()``. That
flag is the one thing a kernel is told about its client, hence the test below.
"""
from __future__ import annotations

import sys


def interactive_frontend() -> bool:
    """True when running in a Jupyter kernel whose client can show widgets (and take input);
    False outside a kernel (scripts, tests) and in headless execution."""
    if "ipykernel" not in sys.modules:
        return False
    try:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
    except Exception:  # IPython without a shell: not a kernel
        return False
    return bool(getattr(kernel, "_allow_stdin", False)) if kernel is not None else False


def text_bars_when_headless() -> bool:
    """In a headless kernel, make ``from tqdm.auto import tqdm`` give the text bar. Returns
    whether it did. Modules that imported ``tqdm.auto`` earlier keep what they got, which is why
    ``helpers/__init__`` calls this first."""
    if "ipykernel" not in sys.modules or interactive_frontend():
        return False
    try:
        from IPython import get_ipython

        if getattr(get_ipython(), "kernel", None) is None:
            return False
    except Exception:
        return False
    import tqdm.auto
    import tqdm.std

    tqdm.auto.tqdm, tqdm.auto.trange = tqdm.std.tqdm, tqdm.std.trange
    return True
