"""One vocabulary and stated defaults: ``--engine NAME[==VERSION]`` is whose rules, ``--backend`` which
runtime; a static question without ``--engine`` names the release it assumed in its first line; a live
run takes the installed release's own rules; only the embedded pair replays the original case
(sglang 0.5.9's capture rule); ``bench --guard`` left out is the user's ``EAGLE3_WORKBOOK_GUARD``."""
from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers.__main__ import main as cli
from helpers.commands import bench, workbook
from helpers.errors import BadOption, InputError
from helpers.live import guard
from helpers.live.backends import Backend
from helpers.notebook.runner import Runs
from helpers.rules.conventions import CASE_ENGINE, DEFAULT_ENGINE, Engine, assumed_engine_line, parse_engine
from helpers.rules.families import SGLANG

REPO = Path(__file__).resolve().parent.parent
PAIR = REPO / "data" / "tiny-kimi"
CHECK = ["check", "--target", str(PAIR / "target"), "--draft", str(PAIR / "draft")]


def test_the_defaults_are_stated_and_the_case_replay_is_the_embedded_pairs_only():
    assert str(DEFAULT_ENGINE) == f"sglang=={SGLANG.newest_read}" != str(CASE_ENGINE) == "sglang==0.5.9"
    assert DEFAULT_ENGINE == Engine("sglang", SGLANG.newest_read) and CASE_ENGINE == Engine("sglang", "0.5.9")
    for nb in sorted((REPO / "notebooks").glob("*.ipynb")):      # the notebooks' defaults replay the case
        cells = json.loads(nb.read_text())["cells"]
        params = next("".join(c["source"]) for c in cells if "parameters" in c["metadata"].get("tags", []))
        assert re.search(r'^ENGINE_VERSION = "(.*)"', params, re.M).group(1) == str(CASE_ENGINE), nb.name


def test_check_without_engine_names_the_release_it_assumed_first(capsys):
    assert cli(CHECK) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == assumed_engine_line(DEFAULT_ENGINE)
    assert lines[0].startswith(f"assumed engine {DEFAULT_ENGINE} (no --engine given")
    assert f"on  {DEFAULT_ENGINE}" in lines[1]
    assert "served     : (2, 6, 9)" in "\n".join(lines)        # 0.5.23 serves (b2, b6, b9)
    assert cli(CHECK + ["--json"]) == 1
    d = json.loads(capsys.readouterr().out)
    assert next(iter(d)) == "assumed_engine" and d["assumed_engine"] == str(DEFAULT_ENGINE)
    assert d["engine"] == str(DEFAULT_ENGINE)


def test_check_with_engine_assumes_nothing(capsys):
    assert cli(CHECK + ["--engine", str(CASE_ENGINE)]) == 1
    out = capsys.readouterr().out
    assert not out.startswith("assumed") and out.splitlines()[0].startswith("check ")
    assert "(3, 7, 10)" in out                       # the original case: 0.5.9 serves (b3, b7, b10)
    assert cli(CHECK + ["--engine", str(CASE_ENGINE), "--json"]) == 1
    assert json.loads(capsys.readouterr().out)["assumed_engine"] is None


def test_wiring_without_engine_names_the_release_it_assumed_first(capsys):
    assert cli(["wiring", "--target", str(PAIR / "target"), "--draft", str(PAIR / "draft")]) == 0
    assert capsys.readouterr().out.splitlines()[0] == assumed_engine_line(DEFAULT_ENGINE)
    assert cli(["wiring", "--target", str(PAIR / "target"), "--draft", str(PAIR / "draft"),
                "--engine", "vllm", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["assumed_engine"] is None


# -- bench: --engine and --backend parsed, never sniffed; the guard's mode from the user ----------------


class _Stop(InputError):
    """Raised by the fake backend where a real one would start an engine: the test has what it needs."""


class FakeBackend:
    """Stands in for ``live.backends.Backend``: records what bench hands it, starts nothing."""

    family, label, live, unavailable = "sglang", "fake SGLang", True, None

    def __init__(self, named, seen):
        self.engine = named if named is not None else Engine("sglang", "0.5.23", live=True)
        self.seen = seen
        seen["named"] = named

    def refuses(self, named):
        return None

    def bench(self, target, wirings, prompt_ids, **kw):
        self.seen.update(kw, wirings=wirings)
        if kw["guard"].refusing:         # what a refusing engine raises (EngineStartError): one line
            raise _Stop(f"SGLang 0.5.23 refused draft: {guard.PREFIX}: sglang serves (2, 6, 9) but the "
                        f"draft was trained on (0, 3, 7)")
        raise _Stop("fake backend: no engine started")


@pytest.fixture
def fake_choose(monkeypatch):
    seen = {}

    def choose(family, named):
        seen["family"] = family
        return FakeBackend(named, seen)

    monkeypatch.setattr(bench, "choose", choose)
    monkeypatch.delenv(guard.GUARD_ENV, raising=False)
    return seen


BENCH = ["--target", str(PAIR / "target"), "--draft", str(PAIR / "draft"), "--num-prompts", "1",
         "--max-new-tokens", "4", "--repeats", "1", "--steps", "1"]


def test_bench_takes_engine_and_backend_as_parsed(fake_choose, capsys):
    assert bench.main(["--backend", "sglang"] + BENCH) == 2      # the fake stops where an engine would start
    assert fake_choose["family"] == "sglang" and fake_choose["named"] is None      # none named: installed
    assert fake_choose["guard"] is guard.Mode.WARN
    assert bench.main(["--backend", "sglang", "--engine", str(CASE_ENGINE)] + BENCH) == 2
    assert fake_choose["named"] == parse_engine(CASE_ENGINE)
    capsys.readouterr()
    src = Path(bench.__file__).read_text()
    assert "in argv" not in src and "engine_named" not in src         # parsed, never sniffed


def test_the_users_guard_setting_reaches_the_engine_and_a_refusal_exits_2(fake_choose, monkeypatch, capsys):
    monkeypatch.setenv(guard.GUARD_ENV, "refuse")
    assert bench.main(["--backend", "sglang", "--json"] + BENCH) == 2      # --json: no progress bars
    assert fake_choose["guard"] is guard.Mode.REFUSE
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: SGLang 0.5.23 refused") and guard.PREFIX in err[0]
    assert bench.main(["--backend", "sglang", "--guard", "warn"] + BENCH) == 2      # the flag wins
    assert fake_choose["guard"] is guard.Mode.WARN


@pytest.mark.parametrize("value", ["refuze", "on"])
def test_a_bad_guard_setting_exits_2_with_one_line_before_anything_loads(fake_choose, monkeypatch, capsys,
                                                                         value):
    monkeypatch.setenv(guard.GUARD_ENV, value)
    assert bench.main(["--backend", "sglang"] + BENCH) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and guard.GUARD_ENV in err[0] and repr(value) in err[0]
    assert "family" not in fake_choose                # refused before the backend was chosen


def test_guard_mode_flag_then_environment_then_warn():
    assert bench.guard_mode(None, {}) is guard.Mode.WARN
    assert bench.guard_mode(None, {guard.GUARD_ENV: " "}) is guard.Mode.WARN
    assert bench.guard_mode(None, {guard.GUARD_ENV: "Refuse"}) is guard.Mode.REFUSE
    assert bench.guard_mode(None, {guard.GUARD_ENV: "off"}) is guard.Mode.OFF
    assert bench.guard_mode("warn", {guard.GUARD_ENV: "refuse"}) is guard.Mode.WARN
    with pytest.raises(BadOption, match="expected off, warn"):
        bench.guard_mode(None, {guard.GUARD_ENV: "bogus"})


def test_a_live_backend_refuses_rules_it_cannot_run():
    vllm = Backend("vllm", Engine("vllm", "0.32.0", "v1", live=True), SimpleNamespace(version="0.32.0"))
    assert vllm.refuses(None) is None and vllm.refuses(parse_engine("vllm")) is None
    assert vllm.refuses(parse_engine("vllm==0.32.0")) is None
    assert "another engine's rules" in vllm.refuses(parse_engine(CASE_ENGINE))
    assert "runs its own release's rules" in vllm.refuses(parse_engine("vllm==0.33.0"))
    sglang = Backend("sglang", parse_engine(CASE_ENGINE), SimpleNamespace(version="0.5.23"),
                     capture_rule="0.5.9")
    assert sglang.refuses(parse_engine(CASE_ENGINE)) is None
    assert "another engine's rules" in sglang.refuses(parse_engine("vllm"))


# -- run-workbook: --backend the runtime, --engine the rules, the old spellings one release more ------------


def test_run_workbook_defaults_replay_the_case_only_on_the_embedded_pair(monkeypatch):
    monkeypatch.setattr(workbook, "installed", lambda family: Engine("sglang", "0.5.23", live=True)
                        if family == "sglang" else None)
    monkeypatch.setattr(workbook, "case_replay_line", lambda family: f"case replay on {family}")
    assert workbook.default_rules({}, "sglang") == (str(CASE_ENGINE), "case replay on sglang")
    assert workbook.default_rules({"TARGET": str(PAIR / "target")}, "reference")[0] == str(CASE_ENGINE)
    mine = {"TARGET": "/models/target", "DRAFT": "/models/draft"}
    rules, line = workbook.default_rules(mine, "sglang")          # a user's pair, live: the installed release
    assert rules == "sglang==0.5.23" and "installed SGLang's own" in line
    assert workbook.default_rules(mine, "reference") == (str(DEFAULT_ENGINE),
                                                         assumed_engine_line(DEFAULT_ENGINE))
    assert not workbook.embedded_pair({"TARGET": str(PAIR / "target"), "DRAFT": "/models/draft"})


def test_run_workbook_old_spellings_still_work_with_one_line_each():
    said = []
    assert workbook.old_spellings(None, "auto", None, said.append) == ("auto", None)
    assert workbook.old_spellings(None, "sglang", "sglang==0.5.9", said.append) == ("sglang", "sglang==0.5.9")
    assert len(said) == 3 and all(s.startswith("note: ") and "\n" not in s for s in said)
    said.clear()
    assert workbook.old_spellings("vllm", "vllm==0.32.0", None, said.append) == ("vllm", "vllm==0.32.0")
    assert workbook.old_spellings(None, "sglang==0.5.23", None, said.append) == (None, "sglang==0.5.23")
    assert not said


def test_run_workbook_passes_the_rules_it_chose_and_says_which(monkeypatch, tmp_path, capsys):
    """The notebooks get BACKEND (the runtime) and ENGINE_VERSION (the rules) as resolved; nothing runs."""
    seen = []

    def fake_run(out, params, only=None, render=True, progress=True):
        seen.append(params)
        return Runs()

    monkeypatch.setattr(workbook, "run_workbook", fake_run)
    out = ["--out", str(tmp_path / "r"), "--no-render"]
    assert workbook.main(out + ["--backend", "reference"]) == 0
    assert seen[-1]["BACKEND"] == "reference" and seen[-1]["ENGINE_VERSION"] == str(CASE_ENGINE)
    assert "case replay: capture rule sglang 0.5.9" in capsys.readouterr().out.splitlines()[0]
    mine = ["--target", str(PAIR / "target"), "--draft", str(PAIR / "draft-retrained")]    # not the case
    assert workbook.main(out + mine + ["--backend", "reference"]) == 0
    assert seen[-1]["ENGINE_VERSION"] == str(DEFAULT_ENGINE)
    assert capsys.readouterr().out.splitlines()[0] == assumed_engine_line(DEFAULT_ENGINE)
    assert workbook.main(out + mine + ["--backend", "reference", "--engine", "vllm==0.32.0"]) == 0
    assert seen[-1]["ENGINE_VERSION"] == "vllm==0.32.0" and not capsys.readouterr().out.startswith("[engine]")
    assert workbook.main(out + ["--engine", "reference", "--engine-version", "sglang==0.5.23"]) == 0   # old
    assert seen[-1]["BACKEND"] == "reference" and seen[-1]["ENGINE_VERSION"] == "sglang==0.5.23"
    assert capsys.readouterr().err.count("note: ") == 2
