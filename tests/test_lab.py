"""What `bash workbook.sh lab` relies on, checked without starting JupyterLab (tests/test_browser.py
does that): the notebooks name the kernel setup registers, import helpers without path tricks,
and print no stray return values into the reports."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from helpers.notebook.lab import SMALL, overrides
from helpers.notebook.runner import NOTEBOOKS, ORDER, REPO


def _kernel_name() -> str:
    return re.search(r"^KERNEL=(\S+)$", (REPO / "workbook.sh").read_text(), re.M).group(1)


@pytest.mark.parametrize("name", ORDER)
def test_notebook_runs_on_the_venv_kernel_and_imports_helpers_as_installed(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    assert nb.metadata["kernelspec"]["name"] == _kernel_name()
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "sys.path" not in code, "notebooks import helpers from the editable install, not from a path"


@pytest.mark.parametrize("name", ORDER)
def test_no_cell_ends_in_a_bare_write(name):
    """`path.write_text(...)` as a cell's last expression shows its byte count in the report, and
    `write_step(...)` the path it wrote."""
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    for c in nb.cells:
        if c.cell_type != "code" or c.source.rstrip().endswith(";"):
            continue
        body = ast.parse(c.source).body
        last = body[-1] if body else None
        if not (isinstance(last, ast.Expr) and isinstance(last.value, ast.Call)):
            continue
        func = last.value.func
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        noisy = ("write_text", "write_bytes", "mkdir", "unlink", "write_step", "write_summary")
        assert called not in noisy, c.source[-200:]


def test_setup_registered_the_kernel_in_the_venv_and_installed_the_project():
    """Run after `workbook.sh` setup (CI's `bash workbook.sh test`): the kernelspec lives in the
    venv's own prefix and starts this interpreter; `helpers` imports from outside the repository."""
    spec = Path(sys.prefix) / "share" / "jupyter" / "kernels" / _kernel_name() / "kernel.json"
    if sys.prefix == sys.base_prefix:
        pytest.skip(f"not running in a virtual environment ({sys.prefix}); workbook.sh sets one up")
    assert spec.is_file(), f"{spec} missing: run `bash workbook.sh test` (setup registers it)"
    argv = json.loads(spec.read_text())["argv"]
    assert Path(argv[0]) == Path(sys.prefix) / "bin" / "python"
    out = subprocess.run([sys.executable, "-c", "import helpers; print(helpers.__file__)"], cwd="/",
                         capture_output=True, text=True, check=True).stdout.strip()
    assert Path(out).resolve() == (REPO / "helpers" / "__init__.py").resolve()


def test_environment_overrides_for_interactive_sessions():
    params = {"EVAL_WINDOWS": 12, "SEARCH_WINDOWS": 4, "DRAFT_STEPS": 5, "TARGET": None, "json": json}
    assert overrides(params, {"EAGLE3_WORKBOOK_SMALL": "1"}, interactive=False) == {}  # papermill: -p only
    small = overrides(params, {"EAGLE3_WORKBOOK_SMALL": "1"}, interactive=True)
    assert small == {k: SMALL[k] for k in ("EVAL_WINDOWS", "SEARCH_WINDOWS", "DRAFT_STEPS")}
    env = {"EAGLE3_WORKBOOK_SMALL": "1", "EAGLE3_WORKBOOK_PARAMS": '{"TARGET": "/m", "EVAL_WINDOWS": 6}'}
    both = overrides(params, env, interactive=True)
    assert both["TARGET"] == "/m" and both["EVAL_WINDOWS"] == 6
    assert both["DRAFT_STEPS"] == SMALL["DRAFT_STEPS"]
    with pytest.raises(ValueError, match="EVAL_WINDOW"):
        overrides(params, {"EAGLE3_WORKBOOK_PARAMS": '{"EVAL_WINDOW": 6}'}, interactive=True)
    with pytest.raises(ValueError, match="not JSON"):
        overrides(params, {"EAGLE3_WORKBOOK_PARAMS": "EVAL_WINDOWS=6"}, interactive=True)
    assert overrides(params, {}, interactive=True) == {}


def test_the_old_parameter_name_engine_is_read_as_backend_with_one_line(capsys):
    """ENGINE named the runtime, which the CLI calls --backend: it is BACKEND now, the old name still read."""
    from helpers.notebook.parameters import DEFAULTS, rename_parameter

    assert rename_parameter("BACKEND") == "BACKEND" and rename_parameter("ENGINE_VERSION") == "ENGINE_VERSION"
    assert capsys.readouterr().err == ""
    assert rename_parameter("ENGINE") == "BACKEND"
    assert "the parameter ENGINE is now BACKEND" in capsys.readouterr().err
    got = overrides(dict(DEFAULTS), {"EAGLE3_WORKBOOK_PARAMS": '{"ENGINE": "vllm"}'}, interactive=True)
    assert got == {"BACKEND": "vllm"}
