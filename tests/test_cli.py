"""The ``python -m helpers`` entry point and the main job's argument checks."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import scaled

ROOT = Path(__file__).resolve().parent.parent


def _run(*args):
    return subprocess.run([sys.executable, "-m", "helpers", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=scaled(300))


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
    from helpers.commands.workbook import main

    assert main(["--out", str(tmp_path / "r"), "--target", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("args, expected", [
    (["--only", "07_nope"], "is not a notebook"),
    (["--training-layout", "2,4"], "the draft's fc takes 3"),
    (["--training-layout", "a,b"], "cannot read a layout"),
    (["--engine", "sglang=0.5.9"], "unknown engine"),
    (["--engine-version", "sglang=0.5.9"], "unknown engine"),      # the old spelling, one release more
    (["-p", "ENGINE_VERSION=\"sglang\""], "names no version"),
    (["--engine", "auto", "--engine-version", "vllm", "--backend", "vllm"], "both name the rules"),
    (["-p", "NUM_PROMT=4"], "no notebook takes a parameter 'NUM_PROMT'"),
    (["-p", "NUM_PROMPTS=0"], "NUM_PROMPTS must be a positive integer"),
])
def test_run_workbook_checks_inputs_before_any_kernel(tmp_path, capsys, args, expected):
    """Bad input fails in a second and leaves an earlier run's reports as they were."""
    from helpers.commands.workbook import main

    out = tmp_path / "r"
    out.mkdir()
    (out / "keep.txt").write_text("earlier run")
    assert main(["--out", str(out)] + args) == 2
    assert expected in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_notebook_names_accept_short_forms():
    from helpers.notebook.runner import normalise_notebook_name

    for name in ("01", "01_baseline_throughput", "01_baseline_throughput.ipynb",
                 "notebooks/01_baseline_throughput.ipynb"):
        assert normalise_notebook_name(name) == "01_baseline_throughput"


def test_older_environment_names_are_read_under_the_one_prefix_with_one_line():
    """EAGLE3_WORKBOOK_ is the one prefix; an older WORKBOOK_X is read as EAGLE3_WORKBOOK_X, said once, and a
    new name already set wins."""
    import io

    from helpers.environment import adopt_old_names

    env = {"WORKBOOK_SMALL": "1", "WORKBOOK_VLLM": "0", "EAGLE3_WORKBOOK_VLLM": "1", "PATH": "/bin"}
    err = io.StringIO()
    assert adopt_old_names(env, err) == ["WORKBOOK_SMALL"]
    assert env["EAGLE3_WORKBOOK_SMALL"] == "1" and env["EAGLE3_WORKBOOK_VLLM"] == "1"
    said = "warning: WORKBOOK_SMALL is deprecated; read as EAGLE3_WORKBOOK_SMALL (rename it)\n"
    assert err.getvalue() == said
    assert adopt_old_names(env, err) == []          # a child process: the new name is there, nothing said


def test_workbook_sh_reads_an_older_name_with_one_line(tmp_path):
    import subprocess

    script = ("source <(sed -n '/^# One prefix/,/^done$/p' workbook.sh); "
              "echo \"small=${EAGLE3_WORKBOOK_SMALL:-unset}\"")
    env = {"PATH": "/usr/bin:/bin", "WORKBOOK_SMALL": "1"}
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=30)
    assert out.stdout.strip() == "small=1"
    assert "WORKBOOK_SMALL is deprecated; read as EAGLE3_WORKBOOK_SMALL" in out.stderr


@pytest.mark.parametrize("args, sets_up", [
    ("", "sglang"), ("--backend vllm", "vllm"), ("--backend=sglang", "sglang only"),
    ("-p BACKEND=vllm", "vllm"),
    ("--backend reference", "none"), ("--backend llamacpp", "none"), ("--small", "sglang")])
@pytest.mark.parametrize("sglang_ok", [True, False])
def test_workbook_sh_run_sets_up_only_the_engine_it_starts(tmp_path, args, sets_up, sglang_ok):
    """`run` installs the venv its notebooks will start: SGLang for auto, vLLM only where SGLang could not be
    set up or where --backend names it; none for the reference engine or llama.cpp."""
    venv = tmp_path / "sg"
    if sglang_ok:
        venv.mkdir()
        (venv / ".requirements.sha256").write_text("x")
    script = ("source <(sed -n '/^run_backend()/,/^}/p;/^setup_run_engines()/,/^}/p' workbook.sh); "
              "setup_sglang() { echo SETUP sglang; }; setup_vllm() { echo SETUP vllm; }; "
              f"SGLANG_VENV={venv}; setup_run_engines {args}")
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, env={"PATH": "/usr/bin:/bin"}, capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    done = [ln.split()[1] for ln in out.stdout.splitlines() if ln.startswith("SETUP ")]
    want = {"none": [], "vllm": ["vllm"], "sglang only": ["sglang"],
            "sglang": ["sglang"] if sglang_ok else ["sglang", "vllm"]}[sets_up]
    assert done == want, out.stdout
