"""Every door asked the same question: what was this draft trained on, what will this engine feed it, does
it match, and what fixes it. ``check``, ``wiring``, ``fixes deploy``, the engine guard and ``diagnose`` each
answer from the one chain (``investigation.evidence.training_evidence``) and the one fix writer, so on each
test draft (a record, none, a trainer the config names, a trainer named by the user, a deployed copy) and
each engine (SGLang, vLLM, llama.cpp, TensorRT-LLM, LMDeploy) they must agree; and every fix command
``check`` prints must run as printed and serve the training layout on that engine (docs/architecture.md,
"Where a rule lives")."""
from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _pairs import tiny_default, tiny_llama

from helpers.commands.wiring import main as wiring_main
from helpers.engines.trtllm.options import OPTIONS_FILE
from helpers.errors import BadOption
from helpers.investigation.evidence import training_evidence
from helpers.investigation.fixes import deploy
from helpers.investigation.gate import check
from helpers.judgement import Judgement
from helpers.live import guard
from helpers.rules.conventions import parse_engine, read_draft_config, read_target

ENGINES = ("sglang==0.5.23", "vllm==0.32.0", "llamacpp==b11434", "trtllm", "lmdeploy==0.18.0")
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def drafts(tmp_path_factory) -> dict[str, tuple[Path, Path, str | None]]:
    """name -> (draft, target, trainer named or None)."""
    root = tmp_path_factory.mktemp("doors")
    kimi, llama = tiny_default(), tiny_llama()
    out = {"record": (kimi / "draft", kimi / "target", None)}
    bare = root / "kimi-no-record"
    shutil.copytree(kimi / "draft", bare)
    (bare / "training.json").unlink()
    out["none"] = (bare, kimi / "target", None)
    named_by_config = root / "llama-no-record"
    shutil.copytree(llama / "draft", named_by_config)
    (named_by_config / "training.json").unlink()
    out["config names its trainer"] = (named_by_config, llama / "target", None)
    out["trainer named"] = (bare, kimi / "target", "specforge-hf")
    copy = root / "kimi-deployed"
    deploy(kimi / "draft", copy, [parse_engine("sglang==0.5.23")], target=kimi / "target")
    out["deployed copy"] = (copy, kimi / "target", None)
    return out


def _wiring_served(draft: Path, target: Path, engine: str, capsys) -> list[int]:
    capsys.readouterr()
    wiring_main(["--draft", str(draft), "--target", str(target), "--engine", engine, "--json"])
    return json.loads(capsys.readouterr().out)["served_layout"]


def _guard(draft: Path, target: Path, engine: str, served, trainer: str | None):
    eng = parse_engine(engine)
    spec = read_target(target)
    ev = training_evidence(draft, read_draft_config(draft), engine=eng, arch=spec.arch,
                           num_layers=spec.num_layers, trainer=trainer, served=served)
    return guard.judge(engine=f"{eng.name} {eng.version}", draft=draft, indices=served,
                       highest=spec.num_layers, evidence=ev, target=str(target))


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("case", ["record", "none", "config names its trainer", "trainer named",
                                  "deployed copy"])
def test_every_door_gives_the_same_answer(drafts, case, engine, tmp_path, capsys):
    draft, target, trainer = drafts[case]
    eng = parse_engine(engine)
    report = check(draft, eng, target=target, trainer=trainer, across_releases=False)
    row = {"case": case, "engine": engine, "training": report.training_layout, "basis": report.evidence,
           "served": report.served_layout, "verdict": str(report.judgement), "fix": report.fix_command}
    # wiring: the same served layout (llama.cpp's DeepSeek graph feeds nothing: check says so as ())
    served = _wiring_served(draft, target, engine, capsys)
    assert tuple(served) == report.served_layout or (report.cannot_serve and not report.served_layout), row
    # the guard: the same training layout, the same verdict kind wherever it can judge
    if report.served_layout:
        g = _guard(draft, target, engine, report.served_layout, trainer)
        assert g.trained == report.training_layout, (row, g.as_dict())
        if report.training_layout is None:
            assert g.kind is Judgement.UNKNOWN and g.refused_by(guard.Mode.REFUSE), row
        else:
            kind = report.judgement if report.judgement is not Judgement.BLOCKED else g.kind
            assert g.kind is kind or (g.kind is Judgement.MATCH and report.agree), row
    else:
        assert report.judgement is Judgement.BLOCKED and "cannot serve this draft" in report.verdict, row
        assert not any(p.kind == "layout-mismatch" for p in report.problems), row
    # fixes deploy without --layout: it settles what check settles, or says it is not settled
    if trainer is None:
        out = tmp_path / "copy"
        if report.training_layout is None:
            with pytest.raises(BadOption, match="not settled"):
                deploy(draft, out, [eng], target=target)
            assert not out.exists()
        else:
            d = deploy(draft, out, [eng], target=target)
            assert tuple(sorted(d.trained)) == tuple(sorted(report.training_layout)), row
    # the printed fix runs as printed, and its copy serves the training layout on this engine
    if report.fix_command:
        argv = shlex.split(report.fix_command)
        assert argv[:3] == ["python", "-m", "helpers"]
        argv[argv.index("--out") + 1] = str(tmp_path / "printed")
        proc = subprocess.run([sys.executable, *argv[1:]], capture_output=True, text=True, cwd=tmp_path,
                              timeout=300)
        assert proc.returncode == 0, (row, proc.stdout[-2000:], proc.stderr[-2000:])
        options = tmp_path / "printed" / OPTIONS_FILE       # TensorRT-LLM: the ids are in its launch options
        again = check(tmp_path / "printed", eng, target=target, across_releases=False,
                      trtllm_options=options if options.is_file() else None)
        assert again.served_layout == tuple(sorted(report.training_layout)) and again.ok, again.verdict
    print(row)


@pytest.mark.parametrize("case", ["record", "none", "config names its trainer"])
def test_diagnose_settles_what_the_chain_settles(drafts, case):
    """diagnose on the pair: a layout the chain settles is the training layout whatever the ranking says (a
    disagreement is its note); an unsettled one is measured only where the ranking leaves it alone within
    noise, else the candidates are said and nothing is deployed to."""
    from helpers.investigation.diagnosis import diagnose
    from helpers.investigation.pair import eval_captures, load_pair

    draft, target, _ = drafts[case]
    engine = parse_engine("sglang==0.5.23")
    report = check(draft, engine, target=target, across_releases=False)
    pair = load_pair(target, draft)
    d = diagnose(pair, eval_captures(pair, max_windows=2, window=64), engine, steps=2, progress=False)
    out = d.to_dict()
    assert out["training_layout"] == out["trained_layout"]         # the old name, an alias
    if report.evidence == "config" and not d.wiring.trained_known:
        # a rule read on the config's ids, which the ranking separates from the best: the ids were edited
        # after training; the measurement decides, and says what it overruled
        assert "the config's ids are not the training's" in d.verdict, d.verdict
    elif report.training_layout is not None:
        assert d.training_layout == report.training_layout and d.wiring.trained_known
        if report.agree:          # check may block on more than the wiring (a format the engine cannot load)
            assert d.wiring.judged.judgement in (Judgement.MATCH, Judgement.IGNORED_FLAG)
        else:
            assert d.wiring.judged.judgement is report.judgement
    elif d.training_layout is None:
        assert out["candidate_layouts"] and out["fix_command"] is None and out["fix_ids"] is None
        assert d.exit_code in (0, 1, 3)
    else:
        assert d.confident_set == [d.training_layout] and "measured" in d.verdict
