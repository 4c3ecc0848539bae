"""The workbook as an installed package (pyproject.toml, docs/install.md).

A wheel built offline from this checkout is installed into a clean venv (no system or .venv site
packages): its declared dependencies come from the registry pip is configured for, torch is added the way a
user adds theirs (the same build .venv runs, without its dependencies: torch is never declared). From a
directory that holds nothing of the project, ``python -m helpers check`` and the ``eagle3-workbook`` console
script judge the embedded pair and report release drift from the package data; both engines' entry points
are listed; and the entry points' module tells a foreign package named ``helpers`` apart from its own.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from conftest import scaled

ROOT = Path(__file__).resolve().parent.parent
PAIR = ROOT / "data" / "tiny-kimi"
# What a build reads: the project's metadata, its top-level module and the package.
BUILD_INPUTS = ("pyproject.toml", "README.md", "MANIFEST.in", "eagle3_workbook_plugin.py", "helpers")
GUARD_ENV = "EAGLE3_WORKBOOK_GUARD"


def _sources(dst: Path) -> Path:
    """The build inputs as a clean clone (plus work not yet committed) has them, copied so the build's own
    build/ and egg-info never land in the checkout others work in."""
    try:
        listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--", *BUILD_INPUTS],
                                cwd=ROOT, capture_output=True, text=True, check=True).stdout.split("\n")
        files = [f for f in listed if f and (ROOT / f).is_file()]
    except (OSError, subprocess.CalledProcessError):        # no git: every file but caches
        files = [str(p.relative_to(ROOT)) for name in BUILD_INPUTS for p in
                 ([ROOT / name] if (ROOT / name).is_file() else sorted((ROOT / name).rglob("*")))
                 if p.is_file() and "__pycache__" not in p.parts]
    for f in files:
        (dst / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dst / f)
    return dst


def _run(argv, *, cwd, timeout, env=None, check=True) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", GUARD_ENV)}
    env = base | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"} | (env or {})
    r = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True,
                       timeout=scaled(timeout), env=env)
    if check and r.returncode != 0:
        raise AssertionError(f"{argv} exited {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return r


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(the wheel, the source tree it was built from)."""
    src = _sources(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", ".", "-w", out],
         cwd=src, timeout=180)
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0], src


@pytest.fixture(scope="module")
def venv(built, tmp_path_factory):
    """A clean venv with the wheel and its declared dependencies, then the user's torch."""
    wheel, _ = built
    where = tmp_path_factory.mktemp("venv") / "v"
    _run([sys.executable, "-m", "venv", where], cwd=where.parent, timeout=120)   # no site packages
    py = where / "bin" / "python"
    _run([py, "-m", "pip", "install", "-q", wheel], cwd=where.parent, timeout=300)
    before = {d.split("==")[0].lower() for d in
              _run([py, "-m", "pip", "freeze"], cwd=where.parent, timeout=60).stdout.split()}
    torch = metadata.version("torch")            # the build .venv runs: CPU here, the user's own elsewhere
    _run([py, "-m", "pip", "install", "-q", "--no-deps", f"torch=={torch}", "typing_extensions"],
         cwd=where.parent, timeout=300)
    return {"python": py, "script": where / "bin" / "eagle3-workbook", "site": _site(py),
            "before_torch": before}


def _site(py: Path) -> Path:
    out = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True, env={"PATH": os.environ.get("PATH", "")})
    return Path(out.stdout.strip()).resolve()


def test_the_wheel_ships_every_package_the_package_data_and_no_torch(built):
    wheel, src = built
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        dist = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        meta = z.read(f"{dist}/METADATA").decode()
        entry = z.read(f"{dist}/entry_points.txt").decode()
    sources = {str(p.relative_to(src)) for p in (src / "helpers").rglob("*") if p.is_file()}
    assert sources - names == set(), "files under helpers/ the wheel lacks (pyproject.toml [tool.setuptools])"
    assert {"eagle3_workbook_plugin.py", "helpers/rules/data/releases.json", "helpers/__main__.py",
            "helpers/engines/sglang/cpu/site/sitecustomize.py",
            "helpers/engines/sglang/cpu/site/sgl_kernel/__init__.py"} <= names
    assert not [n for n in names if "__pycache__" in n or n.endswith(".pyc")]
    requires = [ln.split(":", 1)[1].strip() for ln in meta.splitlines() if ln.startswith("Requires-Dist:")]
    core = [r for r in requires if "extra ==" not in r]
    assert core and not [r for r in requires if r.split(";")[0].strip().lower().startswith("torch")]
    for group, value in (("vllm.general_plugins", "eagle3_workbook_plugin:vllm"),
                         ("sglang.srt.plugins", "eagle3_workbook_plugin:sglang"),
                         ("console_scripts", "helpers.__main__:main")):
        section = entry.split(f"[{group}]", 1)[1].split("[", 1)[0]
        assert "eagle3_workbook = " + value in section or "eagle3-workbook = " + value in section, entry


def test_installing_the_wheel_pulls_no_torch(venv):
    assert "torch" not in venv["before_torch"] and "nvidia-cublas" not in str(venv["before_torch"])
    assert {"numpy", "safetensors", "tqdm", "eagle3-wiring-workbook"} <= venv["before_torch"]


def test_check_runs_from_any_directory_on_the_installed_wheel(venv, tmp_path):
    py = venv["python"]
    args = ["check", "--target", PAIR / "target", "--draft", PAIR / "draft", "--engine", "sglang==0.5.9"]
    where = _run([py, "-c", "import helpers; print(helpers.__file__)"], cwd=tmp_path, timeout=60).stdout
    assert Path(where.strip()).resolve() == venv["site"] / "helpers" / "__init__.py"
    text = _run([py, "-m", "helpers", *args], cwd=tmp_path, timeout=180, check=False)
    # the embedded pair is the original case: 0.5.9 serves (3, 7, 10), the draft was trained on (0, 3, 7)
    assert text.returncode == 1, text.stderr[-2000:]
    assert "MISMATCH" in text.stdout and "trained on : (0, 3, 7)" in text.stdout
    assert "helpers/rules/data/releases.json" in text.stdout        # the package data, read from the wheel
    js = _run([venv["script"], *args, "--json"], cwd=tmp_path, timeout=180, check=False)
    assert js.returncode == 1, js.stderr[-2000:]
    report = json.loads(js.stdout)
    assert report["served_layout"] == [3, 7, 10] and report["training_layout"] == [0, 3, 7]
    bad = _run([venv["script"], "check", "--draft", tmp_path / "nowhere"], cwd=tmp_path, timeout=120,
               check=False)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr


ENTRY_POINTS = """
import json
from importlib.metadata import entry_points
import eagle3_workbook_plugin as p
mod, why = p.own_helpers()
print(json.dumps({g: [[e.name, e.value] for e in entry_points(group=g)]
                  for g in ("vllm.general_plugins", "sglang.srt.plugins")}
                 | {"own": getattr(mod, "__file__", None), "why": why, "plugin": p.__file__}))
"""


def test_both_entry_points_are_listed_and_own_helpers_is_the_installed_copy(venv, tmp_path):
    got = json.loads(_run([venv["python"], "-c", ENTRY_POINTS], cwd=tmp_path, timeout=60).stdout)
    assert got["vllm.general_plugins"] == [["eagle3_workbook", "eagle3_workbook_plugin:vllm"]]
    assert got["sglang.srt.plugins"] == [["eagle3_workbook", "eagle3_workbook_plugin:sglang"]]
    assert Path(got["own"]).resolve() == venv["site"] / "helpers" / "__init__.py" and got["why"] == ""
    assert Path(got["plugin"]).resolve().parent == venv["site"]


CALL_VLLM = """
import sys
import eagle3_workbook_plugin as p
try:
    p.vllm()
except p.GuardNotInstalled as exc:
    print("raised:", exc)
    sys.exit(3)
print("returned")
"""


def test_a_foreign_helpers_first_on_the_path_is_told_apart(venv, tmp_path):
    foreign = tmp_path / "other"
    (foreign / "helpers").mkdir(parents=True)
    (foreign / "helpers" / "__init__.py").write_text('"""Another project\'s helpers."""\n')
    shadow = {"PYTHONPATH": str(foreign)}
    got = json.loads(_run([venv["python"], "-c", ENTRY_POINTS], cwd=tmp_path, timeout=60, env=shadow).stdout)
    assert got["own"] is None and "another package of that name" in got["why"]
    assert str(foreign / "helpers") in got["why"]

    refuse = _run([venv["python"], "-c", CALL_VLLM], cwd=tmp_path, timeout=60, check=False,
                  env=shadow | {GUARD_ENV: "refuse"})
    line = refuse.stdout.strip().removeprefix("raised: ")
    assert refuse.returncode == 3 and refuse.stderr == "" and len(line.splitlines()) == 1, refuse.stderr
    assert line.startswith("eagle3-workbook guard (vllm, refuse): not installed") and "unguarded" in line
    uncaught = _run([venv["python"], "-c", "import eagle3_workbook_plugin as p; p.vllm()"], cwd=tmp_path,
                    timeout=60, check=False, env=shadow | {GUARD_ENV: "refuse"})
    assert uncaught.returncode == 1 and uncaught.stderr.strip() == line      # printed once, by the exit

    warn = _run([venv["python"], "-c", CALL_VLLM], cwd=tmp_path, timeout=60, env=shadow | {GUARD_ENV: "warn"})
    assert warn.stdout.strip() == "returned" and len(warn.stderr.strip().splitlines()) == 1
    assert warn.stderr.startswith("eagle3-workbook guard (vllm, warn): not installed")

    off = _run([venv["python"], "-c", CALL_VLLM], cwd=tmp_path, timeout=60, env=shadow | {GUARD_ENV: "off"})
    assert off.stdout.strip() == "returned" and off.stderr == ""
