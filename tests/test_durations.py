"""How long a run will take, said before it starts (helpers/notebook/durations.py): from the last run like it
on this machine, else the project's own measurement, and a llama-server build beside it said."""
from __future__ import annotations

from helpers.notebook import durations, runner


def test_a_run_is_announced_from_the_last_run_like_it(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLE3_WORKBOOK_CACHE", str(tmp_path))
    monkeypatch.delenv(durations.BUILD_LOG_ENV, raising=False)
    kind = runner.run_kind({"BACKEND": "reference", "TARGET": "/a/target", "MAX_NEW_TOKENS": 64})
    assert "no run like this one has finished on this machine" in durations.start_line(kind)
    durations.record(kind, 125.4, {"01_baseline_throughput": 60.0})
    # the paths do not make another kind of run; a parameter or the notebooks do
    assert runner.run_kind({"BACKEND": "reference", "TARGET": "/b/target", "MAX_NEW_TOKENS": 64}) == kind
    assert durations.start_line(kind).startswith("[run] about 2 min 05 s here")
    assert "no run like this one" in durations.start_line(runner.run_kind({"BACKEND": "sglang"}))
    assert runner.run_kind({"BACKEND": "reference"}, ["01"]) != runner.run_kind({"BACKEND": "reference"})
    monkeypatch.setenv(durations.BUILD_LOG_ENV, str(tmp_path / "build.log"))
    assert "llama-server is being built beside it" in durations.start_line(kind)
    # a first run, which waited on the build, is not quoted for a later one as its length
    durations.record(kind, 950.0, {})
    assert durations.start_line(kind).startswith("[run] about 15 min 50 s here")
    monkeypatch.delenv(durations.BUILD_LOG_ENV)
    assert durations.start_line(kind).startswith("[run] about 2 min 05 s here")
    other = runner.run_kind({"BACKEND": "reference", "MAX_NEW_TOKENS": 32})
    monkeypatch.setenv(durations.BUILD_LOG_ENV, str(tmp_path / "build.log"))
    durations.record(other, 950.0, {})
    monkeypatch.delenv(durations.BUILD_LOG_ENV)
    assert "while llama-server was built beside it" in durations.start_line(other)
    monkeypatch.delenv(durations.BUILD_LOG_ENV, raising=False)
    # the last few runs of each kind are kept, so runs of other kinds (the suite's small ones share a
    # person's cache) never push the default run's out, for as many kinds as KEEP
    for i in range(durations.PER_KIND + 3):
        durations.record(kind, float(i), {})
    for i in range(durations.KEEP - 2):
        durations.record(runner.run_kind({"BACKEND": "reference", "NUM_PROMPTS": i}), 1.0, {})
    runs = durations.history()
    assert [r["seconds"] for r in runs if r["kind"] == kind] == [3.0, 4.0, 5.0][:durations.PER_KIND]
    assert durations.start_line(kind).startswith("[run] about 5 s here")
    durations.record(runner.run_kind({"BACKEND": "sglang"}), 1.0, {})
    durations.record(runner.run_kind({"BACKEND": "vllm"}), 1.0, {})
    assert other not in {r["kind"] for r in durations.history()}                   # the least recent kind
    assert len({r["kind"] for r in durations.history()}) == durations.KEEP


def test_an_unreadable_history_is_no_history(monkeypatch, tmp_path):
    monkeypatch.setenv("EAGLE3_WORKBOOK_CACHE", str(tmp_path))
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / durations.HISTORY).write_text("{not json")
    assert durations.history() == []
    durations.record("k", 1.0, {})
    assert [r["kind"] for r in durations.history()] == ["k"]


def test_a_first_run_is_announced_before_anything_is_installed():
    """`bash workbook.sh run` says it with the system Python, before .venv exists: the module must import with
    the standard library alone (``-S``: no site-packages)."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-S", "-c",
                          "from helpers.notebook import durations; print(durations.first_run_line(2))"],
                         cwd=root, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip()
    assert line.startswith("[run] first run on this machine (2 cores)")
    # the fastest and the slowest of the project's hosts, each named
    refs = sorted(durations.REFERENCES, key=lambda r: r.first_s)
    assert all(durations._minutes(r.first_s) in line and r.host in line for r in (refs[0], refs[-1]))
    assert not any(r.host in line for r in refs[1:-1])
    assert "expect longer" in durations.first_run_line(1)
