""".ci/device-check.sh, the GPU rehearsal, checked on a host without a GPU: its dry run parses every command
with the command's own parser, finds every path, and builds the CUDA SGLang launch environment with the
workbook's own launcher, which must hold no CPU stand-in; its summary names the engine on every row."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import scaled

ROOT = Path(__file__).resolve().parent.parent
CI = ROOT / ".ci"


def _dry_run_module():
    spec = importlib.util.spec_from_file_location("device_dry_run", CI / "device_dry_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dry_run_parses_every_command_and_finds_no_cpu_stand_in(tmp_path):
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "WHEELHOUSE", "VIRTUAL_ENV")}
    r = subprocess.run(["bash", str(CI / "device-check.sh"), "--dry-run"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=scaled(240), env=env | {"OUT": str(out)})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = r.stdout.splitlines()
    parsed = [ln for ln in lines if ln.startswith("[dry-run] parse  ok ")]
    assert len(parsed) == 9 and not [ln for ln in lines if "FAIL" in ln or "MISSING" in ln]
    assert "[dry-run] parse  ok   sglang-059: bench --backend sglang --engine sglang==0.5.9 --target " \
           "data/tiny-kimi/target --draft data/tiny-kimi/draft --steps 3 --repeats 2 --json" in lines
    sglang = [ln for ln in lines if ln.startswith("[dry-run] sglang ")]
    assert len(sglang) == 8 and all(ln.endswith(": no CPU stand-in") for ln in sglang)
    assert any("sglang-059 on CUDA" in ln and "capture rule 0.5.9" in ln for ln in sglang)
    assert "[dry-run] paths  ok   data/tiny-kimi/draft-retrained" in lines
    # every CUDA launch of a paired benchmark has an explicit memory budget, and both sides fit one GPU
    memory = [ln for ln in lines if ln.startswith("[dry-run] memory")]
    assert len(memory) == 7 and all(" ok   " in ln and "= 0.80 of one GPU" in ln for ln in memory)
    assert sum("gpu_memory_utilization 0.4" in ln for ln in memory) == 3
    assert sum("--mem-fraction-static 0.4" in ln for ln in memory) == 4
    assert lines[-1] == "[dry-run] done   9 runs, 0 failure(s)"
    assert not out.exists()                      # nothing ran, nothing was written


def test_a_bad_option_and_a_missing_path_fail_the_dry_run(tmp_path):
    cmds = tmp_path / "cmds"
    cmds.write_text("bad-option\t.venv/bin/python -m helpers bench --target data/tiny-kimi/target "
                    "--draft data/tiny-kimi/draft --stepz 3 --json\n"
                    "bad-draft\t.venv/bin/python -m helpers check --target data/tiny-kimi/target "
                    "--draft data/tiny-kimi/no-such-draft\n"
                    "ok\t.venv/bin/python -m helpers check --target data/tiny-kimi/target "
                    "--draft data/tiny-kimi/draft --engine sglang==0.5.9\n")
    r = subprocess.run([sys.executable, str(CI / "device_dry_run.py"), str(cmds), "--path", "nowhere/at-all"],
                       cwd=ROOT, capture_output=True, text=True, timeout=scaled(120))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "[dry-run] paths  MISSING nowhere/at-all" in r.stdout
    assert "[dry-run] parse  FAIL bad-option: " in r.stdout and "--stepz" in r.stdout
    assert "[dry-run] paths  MISSING bad-draft: --draft data/tiny-kimi/no-such-draft" in r.stdout
    assert "[dry-run] parse  ok   ok: check --target" in r.stdout
    assert r.stdout.splitlines()[-1] == "[dry-run] done   3 runs, 3 failure(s)"


def test_a_cpu_stand_in_in_the_launch_environment_is_caught():
    from helpers.engines.sglang import cpu

    m = _dry_run_module()
    found = m.stand_ins(["--device", "cpu"], {"PYTHONPATH": f"{cpu.SITE}:{ROOT}", m.HOOKS_ENV: "cpu",
                                             "SGLANG_USE_CPU_ENGINE": "1"})
    assert len(found) == 4 and "helpers/engines/sglang/cpu/site is on PYTHONPATH" in found[0]
    assert m.stand_ins(["--dtype", "float32"], {"PYTHONPATH": str(ROOT)}) == []


def _write_run(runs: Path, name: str, data, rc: str, log: str = "") -> None:
    path = runs / f"{name}.json"
    path.write_text(json.dumps(data) if data is not None else "")
    when = 1_700_000_000 + len(list(runs.glob("*.json")))     # the order the script ran them in
    os.utime(path, (when, when))
    (runs / f"{name}.rc").write_text(rc)
    (runs / f"{name}.log").write_text(log)


def test_the_summary_names_the_engine_on_every_row_with_intervals_and_guard_lines(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    guard_line = ("eagle3-workbook guard (warn): miswired: sglang 0.5.23 will feed draft boundaries "
                  "(3, 7, 10) (ids [2, 6, 9])")
    _write_run(runs, "sglang-059", {
        "backend": "sglang==0.5.23", "rules": "runtime 0.5.23, capture rule 0.5.9",
        "served_layout": [3, 7, 10], "accept_length": 1.62, "accepted_per_position": [0.41, 0.15, 0.06],
        "spec_tok_s": 812.4,
        "baseline_tok_s": 700.1, "speedup": 1.16, "speedup_interval": [1.08, 1.21], "timing": "ok",
        "timing_detail": {"spec_range": [790.0, 830.5]}, "guard": {"kind": "miswired", "served": [3, 7, 10]},
        "measured_boundaries": [3, 7, 10], "lossless": True}, "0", f"INFO x\n{guard_line}\n{guard_line}\n")
    _write_run(runs, "ref-served", {"engine": "sglang==0.5.9", "layout": [3, 7, 10], "tau": 1.7,
                                    "position_acceptance": [0.5, 0.2, 0.1], "spec_tok_s": 90.0,
                                    "speedup": 1.3, "speedup_interval": [1.2, 1.4]}, "0")
    _write_run(runs, "vllm-served", {"skipped": ".venv-vllm/bin/python missing"}, "skip")
    _write_run(runs, "sglang-fixb", None, "124", "loading\nerror: CUDA out of memory\n")
    r = subprocess.run([sys.executable, str(CI / "device_summary.py"), str(runs), "--json",
                        tmp_path / "s.json"], capture_output=True, text=True, timeout=scaled(60))
    assert r.returncode == 0, r.stderr
    rows = {ln.split()[0]: ln for ln in r.stdout.splitlines()[2:] if not ln.startswith(" ")}
    assert set(rows) == {"sglang-059", "ref-served", "vllm-served", "sglang-fixb"}
    s = rows["sglang-059"]
    for part in ("sglang==0.5.23", "runtime 0.5.23, capture rule 0.5.9", "(3, 7, 10)", "1.62",
                 "0.41 0.15 0.06", "812.4 [790.0, 830.5]", "1.160 [1.080, 1.210]", "[3, 7, 10]", "miswired"):
        assert part in s, (part, s)
    assert rows["ref-served"].split()[1:3] == ["reference", "sglang==0.5.9"] and "1.70" in rows["ref-served"]
    assert "skipped: .venv-vllm/bin/python missing" in rows["vllm-served"]
    assert "no result (rc 124): error: CUDA out of memory" in rows["sglang-fixb"]
    assert r.stdout.count(f"  sglang-059: {guard_line}") == 1      # each engine process prints it; shown once
    saved = json.loads((tmp_path / "s.json").read_text())
    assert saved["guard_lines"]["sglang-059"] == [guard_line, guard_line]
    assert [row["engine"] for row in saved["rows"]][:2] == ["sglang==0.5.23", "reference"]
