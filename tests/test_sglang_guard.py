"""The engine guard inside stock SGLang, without the CPU accommodations (docs/guard.md): SGLang 0.5.23's own
plugin loader installs it from the workbook's entry point, its own setter runs on stub pipeline ranks, and
the guard judges each draft on the evidence it has. Runs in .venv-sglang (about 30 s: importing sglang)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import scaled

from helpers.engines.sglang import cpu
from helpers.engines.sglang.engine import GUARD_SITE, hook_env
from helpers.model.checkpoint import config_from_json, config_to_json

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data" / "tiny-kimi"

pytestmark = [pytest.mark.live,
              pytest.mark.skipif(os.environ.get("EAGLE3_WORKBOOK_SGLANG") == "0",
                                 reason="EAGLE3_WORKBOOK_SGLANG=0: this host runs without SGLang on purpose")]


@pytest.fixture(scope="module")
def install(sglang_install):
    return sglang_install


def test_the_launch_environment_carries_the_stand_in_only_with_the_accommodations(install, tmp_path):
    off = hook_env(install, tmp_path / "r.jsonl", accommodations=False)
    on = hook_env(install, tmp_path / "r.jsonl", accommodations=True)
    assert str(cpu.SITE) not in off.get("PYTHONPATH", "") and "EAGLE3_WORKBOOK_SGLANG_HOOKS" not in off
    assert install.plugins and "PYTHONPATH" not in off      # 0.5.23 loads the guard as its own plugin
    assert on["PYTHONPATH"].split(os.pathsep)[0] == str(cpu.SITE)
    assert on["EAGLE3_WORKBOOK_SGLANG_HOOKS"] == "cpu"
    older = type(install)(**{**install.__dict__, "plugins": False})
    site = hook_env(older, tmp_path / "r.jsonl", accommodations=False)["PYTHONPATH"]
    assert site.startswith(str(GUARD_SITE))
    assert not (GUARD_SITE / "sgl_kernel").exists()


def _probe(install, tmp_path, cases, mode="refuse", extra=None):
    report = tmp_path / f"{mode}.jsonl"
    env = {**os.environ, "EAGLE3_WORKBOOK_GUARD": mode, "OMP_NUM_THREADS": "1",
           **hook_env(install, report, accommodations=False), **(extra or {})}
    probe = REPO / "tests" / "sglang_guard_probe.py"
    proc = subprocess.run([str(install.python), str(probe), json.dumps(cases)], env=env, capture_output=True,
                          text=True, timeout=scaled(300), cwd=tmp_path)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("PROBE ")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-4000:]
    rows = [json.loads(ln) for ln in report.read_text().splitlines()] if report.is_file() else []
    return json.loads(line[6:]), rows, proc.stderr


def test_stock_sglang_loads_the_guard_as_its_plugin_and_judges_each_rank(install, tmp_path):
    published = tmp_path / "published"          # the deployed draft as a trainer publishes it: no record
    shutil.copytree(DATA / "draft", published)
    (published / "training.json").unlink()
    speculators = tmp_path / "speculators"      # as speculators 0.5 publishes it: its version and its ids
    speculators.mkdir()
    cfg = config_from_json(json.loads((DATA / "draft" / "config.json").read_text()))
    (speculators / "config.json").write_text(json.dumps(config_to_json(replace(cfg, eagle_ids=(0, 3, 7)),
                                                                       "speculators")))
    unreadable = tmp_path / "unreadable"
    shutil.copytree(DATA / "draft", unreadable)
    (unreadable / "training.json").write_text("[0, 3, 7]")
    cases = [{"draft": str(DATA / "draft"), "ids": [2, 6, 9], "last": True},            # deployed: refused
             {"draft": str(DATA / "draft"), "ids": [2, 6, 9], "last": False},           # an earlier stage
             {"draft": str(DATA / "draft-retrained"), "ids": [3, 7, 10], "last": True},  # fix B: starts
             {"draft": str(published), "ids": [2, 6, 9], "last": True},                  # no record: refused
             # SGLang reads no top-level ids: the setter's default (2, L/2, L-3) against the config's trainer
             {"draft": str(speculators), "ids": None, "last": True},
             {"draft": str(unreadable), "ids": [2, 6, 9], "last": True}]                 # cannot judge
    out, rows, err = _probe(install, tmp_path, cases)
    assert out["sgl_kernel"] is None or "helpers" not in out["sgl_kernel"]
    assert [c["served"] for c in out["cases"]] == [False, True, True, False, False, False]
    assert out["cases"][1]["layers_to_capture"] == []          # the setter returned early on that rank
    installed = [r for r in rows if r.get("event") == "guard-installed"]
    assert installed and "HookRegistry" in installed[0]["what"]
    assert installed[0]["what"].startswith("eagle3-workbook guard (sglang 0.5.23, refuse): installed in pid")
    assert installed[0]["what"].endswith("draft path read from sglang.srt.runtime_context.get_server_args")
    verdicts = [r["verdict"] for r in rows if r.get("event") == "guard"]
    kinds = [(v["kind"], v.get("evidence"), v["refused"]) for v in verdicts]
    assert kinds[:4] == [("miswired", "record", True), ("other-rank", "record", False),
                         ("match", "record", False), ("unknown", "none", True)], kinds
    assert verdicts[0]["trained"] == [0, 3, 7] and verdicts[0]["served"] == [2, 6, 9]
    assert "[0, 3, 7]" in verdicts[0]["fix"]                    # the ids SGLang 0.5.23's own setter needs
    assert "writers of its config format disagree" in verdicts[3]["line"]
    assert kinds[4] == ("miswired", "config", True) and verdicts[4]["trained"] == [0, 3, 7]
    assert "named by the config (speculators_version 0.5.0)" in verdicts[4]["line"]
    assert verdicts[5]["kind"] == "unjudged" and verdicts[5]["refused"]
    assert "cannot judge" in verdicts[5]["line"] and "expected an object" in verdicts[5]["line"]
    print("\n".join(v["line"] for v in verdicts))


def test_strict_refuses_what_it_cannot_prove_and_a_named_trainer_settles_it(install, tmp_path):
    published = tmp_path / "published"
    shutil.copytree(DATA / "draft", published)
    (published / "training.json").unlink()
    case = [{"draft": str(published), "ids": [2, 6, 9], "last": True}]
    out, rows, _ = _probe(install, tmp_path, case, mode="strict")
    assert [c["served"] for c in out["cases"]] == [False]
    # a trainer named at launch: SpecForge's HF backend numbers ids as layer outputs: (3, 7, 10), not served
    out, rows, _ = _probe(install, tmp_path, case, mode="refuse",
                          extra={"EAGLE3_WORKBOOK_TRAINER": "specforge-hf"})
    v = [r["verdict"] for r in rows if r.get("event") == "guard"][-1]
    assert [c["served"] for c in out["cases"]] == [False] and v["evidence"] == "trainer"
    assert v["trained"] == [3, 7, 10] and "specforge-hf named, its rule" in v["line"], v["line"]


@pytest.mark.parametrize("mode", ["refuse", "warn"])
def test_what_the_guard_cannot_find_goes_through_the_one_unjudged_path(install, tmp_path, mode):
    """No server args where SGLang publishes them, or a setter that leaves no ``layers_to_capture`` (a release
    that moved the capture): never a silent skip. ``refuse`` stops with one line, ``warn`` starts."""
    cases = [{"draft": str(DATA / "draft"), "ids": [2, 6, 9], "last": True, "no_server_args": True},
             {"draft": str(DATA / "draft"), "ids": [2, 6, 9], "last": True, "capture_elsewhere": True}]
    out, rows, err = _probe(install, tmp_path, cases, mode=mode)
    assert [c["served"] for c in out["cases"]] == [mode == "warn"] * 2
    verdicts = [r["verdict"] for r in rows if r.get("event") == "guard"]
    assert [v["kind"] for v in verdicts] == ["unjudged", "unjudged"]
    assert "exposes no server args" in verdicts[0]["line"] and "runtime_context" in verdicts[0]["line"]
    assert "left no layers_to_capture" in verdicts[1]["line"]
    end = "refusing to serve unjudged" if mode == "refuse" else "starting unjudged"
    assert all(v["line"].endswith(end) and "\n" not in v["line"] for v in verdicts)


def test_a_typo_in_the_mode_stops_the_launch(install, tmp_path):
    code = ("from helpers.engines.sglang.cpu.hooks import _torchvision_schemas; _torchvision_schemas(); "
            "from sglang.srt.plugins import load_plugins; load_plugins(); print('SERVED')")
    env = {**os.environ, "EAGLE3_WORKBOOK_GUARD": "refuze"}
    proc = subprocess.run([str(install.python), "-c", code], env=env, capture_output=True, text=True,
                          timeout=scaled(300))
    assert "SERVED" not in proc.stdout
    assert proc.returncode != 0 and "expected off, warn, refuse or strict" in proc.stderr


# This CPU venv pairs PyPI's CUDA torchvision with CPU torch: importing sglang needs two op schemas first
# (cpu/hooks.py _torchvision_schemas), defined here without importing helpers, which is shadowed below.
TORCHVISION = ("import torch; lib = torch.library.Library('torchvision', 'DEF'); "
               "[lib.define(f'{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor') "
               "for op in ('nms', 'qnms')]; ")


def test_a_foreign_helpers_stops_a_refusing_launch_in_sglangs_own_loader(install, tmp_path):
    (tmp_path / "helpers").mkdir()
    (tmp_path / "helpers" / "__init__.py").write_text('"""Another project\'s helpers."""\n')
    code = TORCHVISION + "from sglang.srt.plugins import load_plugins; load_plugins(); print('SERVED')"
    env = {**os.environ, "EAGLE3_WORKBOOK_GUARD": "refuse"}
    proc = subprocess.run([str(install.python), "-c", code], env=env, capture_output=True, text=True,
                          timeout=scaled(300), cwd=tmp_path)        # '' first on sys.path: the foreign one
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("eagle3-workbook guard")]
    assert proc.returncode != 0 and "SERVED" not in proc.stdout and len(lines) == 1, proc.stderr[-3000:]
    assert "(sglang, refuse): not installed: 'helpers' resolves to" in lines[0] and "unguarded" in lines[0]
    env["EAGLE3_WORKBOOK_GUARD"] = "warn"
    proc = subprocess.run([str(install.python), "-c", code], env=env, capture_output=True, text=True,
                          timeout=scaled(300), cwd=tmp_path)
    assert proc.returncode == 0 and "SERVED" in proc.stdout and "starts unjudged" in proc.stderr
