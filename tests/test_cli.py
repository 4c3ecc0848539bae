"""The ``python -m helpers`` entry point and the main job's argument checks."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(*args):
    return subprocess.run([sys.executable, "-m", "helpers", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def test_usage_lists_every_command():
    from helpers.__main__ import COMMANDS

    r = _run("--help")
    assert r.returncode == 0
    for name in COMMANDS:
        assert name in r.stdout


def test_unknown_command_is_refused():
    r = _run("frobnicate")
    assert r.returncode == 2 and "unknown command 'frobnicate'" in r.stderr


def test_every_command_module_has_main():
    import importlib

    from helpers.__main__ import COMMANDS

    for name, (module, _) in COMMANDS.items():
        assert callable(getattr(importlib.import_module(module), "main")), name


def test_run_workbook_rejects_missing_paths(tmp_path, capsys):
    from helpers.workbook import main

    assert main(["--out", str(tmp_path / "r"), "--target", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
