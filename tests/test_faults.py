"""Fault injection: every bad input or interruption of issue #12 ends in one line and a known exit
status, and changes nothing that should not change (checked by byte hashes).

The cases run the real CLIs in-process (``python -m helpers``'s own ``main``) on copies of the
tiny test pair, so a message, an exit code and the files on disk are all checked together.
``BAD_INPUTS`` counts the distinct faults below; the closing note of #12 quotes it.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _pairs import tiny_default
from safetensors.torch import load_file, save_file

from helpers import errors
from helpers.__main__ import main as cli
from helpers.engines.sglang import patch as ps
from helpers.engines.sglang import source as ss
from helpers.rules.conventions import parse_engine
from helpers.rules.wiring import served_plan

REPO = Path(__file__).resolve().parent.parent


def tree_hash(path: Path) -> dict[str, str]:
    """sha256 of every file under ``path`` (or of ``path`` itself): what 'nothing changed' means."""
    path = Path(path)
    if path.is_file():
        return {path.name: hashlib.sha256(path.read_bytes()).hexdigest()}
    return {str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(path.rglob("*")) if f.is_file()}


def run(capsys, *argv) -> tuple[int, str, str]:
    errors._said.clear()  # warnings are said once per process; each case is its own 'process'
    try:
        code = cli(list(argv))
    except SystemExit as exc:  # argparse's exit, as `python -m helpers` would end with it
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def no_result(out: str) -> bool:
    """Nothing on stdout, or with --json only the error as JSON (exit code 2)."""
    return out == "" or json.loads(out).keys() == {"error", "exit_code"}


def one_error_line(err: str) -> str:
    """The stderr of a refused input: exactly one 'error:' line and no traceback."""
    assert "Traceback" not in err, err
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> Path:
    """A private copy of the tiny pair; tests copy it again before breaking anything."""
    base = tmp_path_factory.mktemp("pair")
    src = tiny_default()
    for name in ("target", "draft"):
        shutil.copytree(src / name, base / name)
    for name in ("prompts.jsonl", "heldout.txt"):
        shutil.copy(src / name, base / name)
    return base


@pytest.fixture
def broken(pair, tmp_path):
    """A fresh copy to break: ``broken('draft')`` -> path of the copied folder."""
    def copy(name: str) -> Path:
        dest = tmp_path / name
        shutil.copytree(pair / name, dest)
        return dest
    return copy


def _nan_fc(draft: Path) -> None:
    w = load_file(str(draft / "model.safetensors"))
    w["fc.weight"] = w["fc.weight"].clone().fill_(float("nan"))
    save_file(w, str(draft / "model.safetensors"))


# --------------------------------------------------------------------------------------
# 2. Numbers that cannot be trusted.


def test_nan_draft_is_refused_by_diagnose_and_bench(pair, broken, capsys):
    draft = broken("draft")
    _nan_fc(draft)
    before = tree_hash(draft)
    n = load_file(str(draft / "model.safetensors"))["fc.weight"].numel()
    for cmd in (["diagnose", "--json", "--windows", "2"], ["bench", "--json", "--repeats", "1"]):
        code, out, err = run(capsys, *cmd, "--target", str(pair / "target"), "--draft", str(draft))
        line = one_error_line(err)
        assert code == 2 and no_result(out)
        assert "non-finite weights" in line and f"fc.weight ({n} of {n})" in line and str(draft) in line
    assert tree_hash(draft) == before


def test_nan_target_is_named_on_load(pair, broken, capsys):
    target = broken("target")
    w = load_file(str(target / "model.safetensors"))
    key = next(k for k in sorted(w) if k.endswith("mlp.down_proj.weight") or "down_proj" in k)
    w[key] = w[key].clone()
    w[key].view(-1)[:3] = float("inf")
    save_file(w, str(target / "model.safetensors"), metadata={"format": "pt"})
    before = tree_hash(target)
    code, _, err = run(capsys, "bench", "--json", "--target", str(target), "--draft", str(pair / "draft"))
    line = one_error_line(err)
    assert code == 2 and "target" in line and "(3 of " in line and key.removeprefix("model.") in line
    assert tree_hash(target) == before


def test_non_finite_scores_and_draft_logits_stop_the_work(pair, monkeypatch):
    """Weights can be finite and still overflow; the results are checked too. (The search itself
    is stubbed to its answer: ranking 1716 NaN layouts would only cost time.)"""
    import types

    from helpers.investigation import diagnosis as dg
    from helpers.investigation.pair import eval_captures, load_pair
    from helpers.model.engine import speculative_generate

    p = load_pair(pair / "target", pair / "draft")
    caps = eval_captures(p, max_windows=2)
    with torch.no_grad():
        p.draft.fc.weight.fill_(float("nan"))
    import pandas as pd

    ranking = pd.DataFrame({"layout": [(0, 3, 7)], "ce": [float("nan")]})
    monkeypatch.setattr(dg, "search", lambda *a, **k: types.SimpleNamespace(best=(0, 3, 7), margin_ce=0.5,
                                                                            ranking=ranking))
    with pytest.raises(errors.NonFiniteResult, match="not a finite number"):
        dg.diagnose(p, caps, parse_engine("sglang==0.5.9"), progress=False)
    with pytest.raises(errors.NonFiniteResult, match="NaN/Inf"):
        speculative_generate(p.target, p.draft, p.served(), torch.tensor([5, 6, 7]), 4, 2)


def test_strict_json_has_no_nan():
    text = errors.strict_json({"tau": float("nan"), "z": [float("inf"), 1.5], "ok": True})
    assert json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c}")) == {
        "tau": None, "z": [None, 1.5], "ok": True}


# --------------------------------------------------------------------------------------
# 4. Limits, checked before any work.


def test_oversized_inputs_are_refused_before_work(pair, tmp_path, capsys):
    huge = tmp_path / "huge.jsonl"
    huge.write_text(json.dumps({"prompt": "def f(x):\n    return x\n" * 6700}) + "\n")  # ~160 KB
    before = tree_hash(tmp_path)
    args = ["--target", str(pair / "target"), "--draft", str(pair / "draft"), "--json"]
    cases = [
        (["bench", "--steps", "100000000", *args], "--steps must be from 1 to 16"),
        (["diagnose", "--steps", "17", *args], "--steps must be from 1 to 16"),
        (["bench", "--max-new-tokens", "100000", *args],
         "leaves no room for a prompt in the target's 1024 positions"),
        (["bench", "--prompts", str(huge), *args], "prompt 1 is"),
    ]
    for argv, expected in cases:
        t0 = time.perf_counter()
        code, out, err = run(capsys, *argv)
        assert code == 2 and expected in one_error_line(err) and no_result(out)
        assert time.perf_counter() - t0 < 30  # refused up front, not after generating
    assert "--truncate-prompts" in one_error_line(run(capsys, "bench", "--prompts", str(huge), *args)[2])
    assert tree_hash(tmp_path) == before


def test_truncating_prompts_on_purpose_runs_and_says_so(pair, tmp_path, capsys):
    huge = tmp_path / "huge.txt"
    huge.write_text("import os\n".replace("\n", " ") * 3000 + "\n")
    code, out, err = run(capsys, "bench", "--prompts", str(huge), "--truncate-prompts", "--max-new-tokens",
                         "4", "--repeats", "1", "--steps", "2", "--json", "--target", str(pair / "target"),
                         "--draft", str(pair / "draft"))
    assert code == 0, err
    res = json.loads(out)
    assert any("truncated to their last" in n for n in res["engine_notes"])
    assert "warning: 1 prompt(s) truncated" in err


def test_run_workbook_refuses_too_many_steps_and_bad_device(tmp_path, capsys):
    out = tmp_path / "reports"
    code, _, err = run(capsys, "run-workbook", "--out", str(out), "--steps", "100", "--device", "banana")
    assert code == 2 and "DRAFT_STEPS must be at most 16" in err and "'banana' is not a torch device" in err
    assert not out.exists() and list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------
# 5. Fallbacks said out loud; an unwritable cache is an error.


def test_unwritable_cache_is_named(pair, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(ss.CACHE_ENV, "/proc/x")
    for argv in (["wiring", "--engine", "sglang==0.5.9", "--arch", "LlamaForCausalLM", "--layers", "12"],
                 ["patch-sglang", "status", "--version", "0.5.9"]):
        code, out, err = run(capsys, *argv)
        line = one_error_line(err)
        assert code == 2 and "/proc/x" in line and ss.CACHE_ENV in line and no_result(out)


def test_unwritable_cache_in_bench_falls_back_with_one_warning(pair, monkeypatch, capsys):
    monkeypatch.setenv(ss.CACHE_ENV, "/proc/x")
    code, out, err = run(capsys, "bench", "--json", "--repeats", "1", "--max-new-tokens", "4", "--steps", "2",
                         "--num-prompts", "1", "--target", str(pair / "target"), "--draft",
                         str(pair / "draft"), "--engine", "sglang==0.5.9")
    assert code == 0, err
    warnings = [l for l in err.splitlines() if l.startswith("warning:")]
    assert len(warnings) == 1
    assert "sglang==0.5.9" in warnings[0] and "/proc/x" in warnings[0] and "rule" in warnings[0]
    assert warnings[0].removeprefix("warning: ") in json.loads(out)["engine_notes"]


def test_offline_index_falls_back_with_one_warning(monkeypatch, capsys, tmp_path):
    """No index answers (pip lists no versions at all) and nothing is cached: the rule is used, and said."""
    monkeypatch.setenv(ss.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(ss, "_pip_download", lambda *a, **k: subprocess.CompletedProcess(
        a, 1, "",
        "ERROR: Could not find a version that satisfies the requirement sglang==0.5.8 (from versions: none)"))
    errors._said.clear()
    cfg = {"architectures": ["LlamaForCausalLMEagle3"],
           "eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 6, 9]}}
    plan = served_plan(cfg, 12, "DeepseekV3ForCausalLM", parse_engine("sglang==0.5.8"))
    plan2 = served_plan(cfg, 12, "DeepseekV3ForCausalLM", parse_engine("sglang==0.5.8"))
    err = capsys.readouterr().err
    assert plan.layout == plan2.layout == (3, 7, 10)
    lines = [l for l in err.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: sglang==0.5.8: engine source could not be read")
    assert "id + 1" in lines[0] and plan.warnings[0] == lines[0].removeprefix("warning: ")
    assert not (tmp_path / "cache" / "sglang" / "0.5.8").exists()


@pytest.mark.parametrize("engine", ["vllm==abc", "sglang==", "tgi==1.0"])
def test_engine_that_is_not_a_version_is_refused(engine, capsys):
    code, _, err = run(capsys, "wiring", "--engine", engine, "--arch", "LlamaForCausalLM", "--layers", "12")
    assert code == 2 and engine.split("==")[0] in one_error_line(err)
    code, _, err = run(capsys, "bench", "--engine", engine)
    assert code == 2 and engine in one_error_line(err)


def test_a_release_before_eagle3_writes_nothing_into_the_cache(monkeypatch, tmp_path, capsys):
    """vLLM's first EAGLE-3 release is a recorded constant: an older one is refused from it, before any of
    its files is fetched, so the refusal leaves the cache as it was (and needs no network)."""
    from helpers.rules import wheels

    def no_network(*_a, **_k):
        raise AssertionError("a refused release must not be fetched")

    monkeypatch.setattr(wheels, "_install_ranged", no_network)
    monkeypatch.setattr(wheels, "pip_download", no_network)
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv(wheels.CACHE_ENV, str(cache))
    pair = REPO / "data" / "tiny-kimi"
    code, out, err = run(capsys, "check", "--engine", "vllm==0.0.1", "--target", str(pair / "target"),
                         "--draft", str(pair / "draft"))
    line = one_error_line(err)
    assert code == 2 and no_result(out) and "vLLM 0.0.1 has no EAGLE-3 (it first appears in 0.8.5)" in line
    assert list(cache.iterdir()) == []


def test_a_release_before_eagle3_is_refused_before_any_model_loads(monkeypatch, capsys):
    """diagnose used to load the pair, evaluate and print its progress, then refuse vllm==0.0.1 at the end:
    the refusal is now where the engine is named, the only line on stderr."""
    from helpers.commands import bench, diagnose

    def no_load(*_a, **_k):
        raise AssertionError("no model may load for a refused engine")

    for command in (bench, diagnose):        # each command's own name for it (imported before patching)
        monkeypatch.setattr(command, "load_pair", no_load)
    pair = REPO / "data" / "tiny-kimi"
    for cmd in ("diagnose", "bench", "wiring"):
        code, out, err = run(capsys, cmd, "--engine", "vllm==0.0.1", "--target", str(pair / "target"),
                             "--draft", str(pair / "draft"))
        line = one_error_line(err)
        assert code == 2 and no_result(out), (cmd, code, out)
        assert line == ("error: engine 'vllm==0.0.1': vLLM 0.0.1 has no EAGLE-3 (it first appears in 0.8.5); "
                        "expected vllm==0.8.5 or later"), (cmd, line)


def test_a_release_the_index_lacks_leaves_no_cache_folder(tmp_path):
    from helpers.rules import wheels

    def missing(version, dest, extra):
        raise wheels.UnknownPackageVersion(f"sglang {version} does not exist on the package index")

    cache = tmp_path / "cache" / "sglang"
    with pytest.raises(wheels.UnknownPackageVersion):
        wheels.fetch("sglang", "0.0.1", ["sglang/"], cache=cache, download=missing)
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------------------------
# 6. One-line errors naming the file, for what used to end in a traceback.


def _truncate(f: Path) -> None:
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _bad_cases():
    """(name, what to break, how, argv builder, expected text in the one line)."""
    return [
        ("truncated draft safetensors", "draft", lambda d: _truncate(d / "model.safetensors"),
         lambda t, d, x: ["bench", "--target", t, "--draft", d],
         "model.safetensors is not a readable safetensors"),
        ("truncated target safetensors", "target", lambda d: _truncate(d / "model.safetensors"),
         lambda t, d, x: ["bench", "--target", t, "--draft", d],
         "model.safetensors is not a readable safetensors file"),
        ("draft config without hidden_size", "draft",
         lambda d: (d / "config.json").write_text(json.dumps({k: v for k, v in json.loads(
             (d / "config.json").read_text()).items() if k != "hidden_size"})),
         lambda t, d, x: ["bench", "--target", t, "--draft", d], "config.json: config lacks 'hidden_size'"),
        ("invalid JSON target config", "target",
         lambda d: (d / "config.json").write_text("{\"architectures\": [,}"),
         lambda t, d, x: ["diagnose", "--target", t, "--draft", d], "config.json is not valid JSON"),
        ("invalid JSON draft config", "draft", lambda d: (d / "config.json").write_text("{"),
         lambda t, d, x: ["bench", "--target", t, "--draft", d], "config.json is not valid JSON"),
        ("draft hidden_size 512 on 256-wide weights", "draft",
         lambda d: (d / "config.json").write_text(json.dumps({**json.loads((d / "config.json").read_text()),
                                                              "hidden_size": 512})),
         lambda t, d, x: ["bench", "--target", t, "--draft", d], "says hidden_size 512, but"),
        ("non-UTF-8 prompts", "extra", lambda d: (d / "p.txt").write_bytes(b"def f():\xff\xfe\n"),
         lambda t, d, x: ["bench", "--target", t, "--draft", d, "--prompts", f"{x}/p.txt"],
         "p.txt is not UTF-8"),
        ("non-UTF-8 text", "extra", lambda d: (d / "t.txt").write_bytes(b"\x80abc\n" * 10),
         lambda t, d, x: ["diagnose", "--target", t, "--draft", d, "--text", f"{x}/t.txt"],
         "t.txt is not UTF-8"),
        ("--device banana", None, None, lambda t, d, x: ["bench", "--device", "banana"],
         "'banana' is not a torch device"),
        ("wiring with target and draft swapped", None, None,
         lambda t, d, x: ["wiring", "--target", d, "--draft", t], "are --target and --draft swapped"),
        ("bench --layout -1,3,7", None, None,
         lambda t, d, x: ["bench", "--target", t, "--draft", d, "--layout", "-1,3,7"],
         "boundary -1 is outside 0..12"),
        ("bench --layout 3,3,7", None, None,
         lambda t, d, x: ["bench", "--target", t, "--draft", d, "--layout", "3,3,7"],
         "repeats a boundary (3)"),
        ("target folder given as the draft", None, None,
         lambda t, d, x: ["bench", "--target", t, "--draft", t], "config.json"),
    ]


@pytest.mark.parametrize("case", _bad_cases(), ids=lambda c: c[0])
def test_bad_input_is_one_line_naming_the_file(case, pair, tmp_path, capsys):
    name, part, breaker, argv, expected = case
    target, draft, extra = pair / "target", pair / "draft", tmp_path / "extra"
    extra.mkdir()
    if part == "draft":
        draft = tmp_path / "draft"
        shutil.copytree(pair / "draft", draft)
        breaker(draft)
    elif part == "target":
        target = tmp_path / "target"
        shutil.copytree(pair / "target", target)
        breaker(target)
    elif part == "extra":
        breaker(extra)
    before = {**tree_hash(tmp_path), **{f"pair/{k}": v for k, v in tree_hash(pair).items()}}
    code, out, err = run(capsys, *argv(str(target), str(draft), str(extra)))
    line = one_error_line(err)
    assert code == 2 and no_result(out), (code, out)
    assert expected in line, line
    if part in ("draft", "target"):
        assert str(tmp_path / part) in line  # the folder or file is named
    after = {**tree_hash(tmp_path), **{f"pair/{k}": v for k, v in tree_hash(pair).items()}}
    assert after == before


# --------------------------------------------------------------------------------------
# 3. Patch state is one truth: kill at every write, then status names it and apply/revert finish.


class _Killed(BaseException):
    """What a kill looks like to the code: nothing after the step runs, no cleanup catches it."""


@pytest.fixture(scope="module")
def mini_tree(tmp_path_factory) -> Path:
    """The two files the patch edits and the wheel's RECORD: all that apply/revert/status read
    on a tree whose anchors fit (copying the whole tree per kill point would dominate the time)."""
    try:
        src = ss.fetch_sglang("0.5.9")
    except ss.IndexUnreachableError as exc:
        pytest.skip(f"PyPI unreachable, cannot fetch sglang 0.5.9: {exc}")
    dest = tmp_path_factory.mktemp("mini-0.5.9")
    record = src.record_hashes()
    for e in ps.EDITS:
        (dest / e.file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(src.path(e.file), dest / e.file)
    for info in src.root.glob("sglang-*.dist-info"):
        (dest / info.name).mkdir()
        shutil.copy(info / "RECORD", dest / info.name / "RECORD")
    if any(ss.sha256_file(dest / e.file) != record[e.file] for e in ps.EDITS):  # a patched shared cache
        ps.revert_patch("0.5.9", root=dest)
    return dest


def _copy(tree: Path, dest: Path) -> Path:
    shutil.copytree(tree, dest)
    return dest


def _steps(action, tree: Path) -> list[str]:
    seen = []
    ps._FAULT = seen.append
    try:
        action(tree)
    finally:
        ps._FAULT = None
    return seen


def _kill_at(step: str):
    def fault(name):
        if name == step:
            raise _Killed(name)
    return fault


def _apply(tree):
    return ps.apply_patch("0.5.9", root=tree)


def _revert(tree):
    return ps.revert_patch("0.5.9", root=tree)


def _leftovers(tree: Path) -> list[str]:
    return sorted(p.name for p in tree.iterdir() if p.name.startswith(ps.BACKUP_DIR))


@pytest.mark.parametrize("interrupted", ["apply", "revert"])
def test_patch_killed_at_every_write_is_named_and_finished(mini_tree, tmp_path, interrupted, capsys):
    pristine = tree_hash(mini_tree)
    ref = _copy(mini_tree, tmp_path / "ref")
    _apply(ref)
    patched = {k: v for k, v in tree_hash(ref).items() if not k.startswith(ps.BACKUP_DIR)}
    start = ((lambda d: _copy(mini_tree, d)) if interrupted == "apply"
             else (lambda d: _apply(_copy(mini_tree, d)) and d))
    steps = _steps(_apply if interrupted == "apply" else _revert, start(tmp_path / "probe"))
    # 2 backups, manifest, publish, 2 writes | 2 restores, retire, delete: PATCH_KILLS counts these
    assert len(steps) == (6 if interrupted == "apply" else 4), steps
    for i, step in enumerate(steps):
        for finish, want in ((_apply, patched), (_revert, pristine)):
            tree = start(tmp_path / f"{i}-{finish.__name__}")
            ps._FAULT = _kill_at(step)
            try:
                with pytest.raises(_Killed):
                    (_apply if interrupted == "apply" else _revert)(tree)
            finally:
                ps._FAULT = None
            st = ps.patch_status("0.5.9", root=tree)
            assert st.state in ("pristine", "stranded", "partial", "patched"), (step, st.state)
            if st.state == "stranded":
                assert "interrupted apply or revert" in st.message and "revert" in st.message
            if _leftovers(tree) and st.state == "pristine":
                pytest.fail(f"kill at {step!r}: status says pristine but {_leftovers(tree)} is there")
            code, out, err = run(capsys, "patch-sglang", "status", "--version", "0.5.9", "--root", str(tree))
            assert code == 0 and st.state in out and err == ""
            finish(tree)  # no hand step: the same command a user would run next
            files = {k: v for k, v in tree_hash(tree).items() if not k.startswith(ps.BACKUP_DIR)}
            assert files == want, (step, finish.__name__)
            assert _leftovers(tree) == ([ps.BACKUP_DIR] if finish is _apply else []), (step, _leftovers(tree))


def test_revert_trusts_its_manifest_over_record_for_a_hand_edited_file(mini_tree, tmp_path, capsys):
    tree = _copy(mini_tree, tmp_path / "t")
    llama = tree / "sglang/srt/models/llama.py"
    llama.write_text("# edited by hand before patching\n" + llama.read_text())
    edited = tree_hash(tree)
    assert run(capsys, "patch-sglang", "apply", "--version", "0.5.9", "--root", str(tree))[0] == 0
    code, out, err = run(capsys, "patch-sglang", "revert", "--version", "0.5.9", "--root", str(tree))
    assert code == 0 and err == "" and "pristine" in out
    assert tree_hash(tree) == edited and _leftovers(tree) == []


def test_stranded_backup_without_manifest_is_reported_and_cleared(mini_tree, tmp_path, capsys):
    tree = _copy(mini_tree, tmp_path / "t")
    files = tree / ps.BACKUP_DIR / "files" / "sglang/srt/models"
    files.mkdir(parents=True)
    shutil.copy(tree / "sglang/srt/models/llama.py", files / "llama.py")  # copied, manifest never written
    code, out, _ = run(capsys, "patch-sglang", "status", "--version", "0.5.9", "--root", str(tree), "--json")
    st = json.loads(out)
    assert code == 0 and st["state"] == "stranded" and st["leftovers"] == [str(tree / ps.BACKUP_DIR)]
    assert "`patch-sglang revert` removes it" in st["message"]
    code, out, _ = run(capsys, "patch-sglang", "apply", "--version", "0.5.9", "--root", str(tree), "--json")
    assert code == 0 and json.loads(out)["state"] == "patched"
    code, out, _ = run(capsys, "patch-sglang", "revert", "--version", "0.5.9", "--root", str(tree), "--json")
    assert code == 0 and json.loads(out)["state"] == "pristine"
    assert tree_hash(tree) == tree_hash(mini_tree)


# --------------------------------------------------------------------------------------
# 1. run-workbook is atomic per run.


def _old_reports(out: Path) -> dict[str, str]:
    out.mkdir()
    (out / "index.html").write_text("<p>earlier run: ok</p>")
    (out / "runs.json").write_text('[{"name": "04_layer_boundary_forward", "ok": true}]')
    (out / "04_layer_boundary_forward.ipynb").write_text("{}")
    (out / "my-notes.txt").write_text("not the workbook's")
    return tree_hash(out)


def _wb_args(pair, out):
    return ["run-workbook", "--out", str(out), "--small", "--only", "04", "--no-render",
            "--target", str(pair / "target"), "--draft", str(pair / "draft")]


def test_failed_notebook_leaves_out_untouched_and_marks_staging(pair, tmp_path, capsys):
    out = tmp_path / "reports"
    before = _old_reports(out)
    args = _wb_args(pair, out)
    args[args.index("--target") + 1] = str(pair / "draft")  # a draft where the target goes: cell 2 raises
    code, stdout, err = run(capsys, *args)
    assert code == 1 and tree_hash(out) == before
    line = [l for l in err.splitlines() if l.startswith("error:")]
    assert (len(line) == 1 and "failed at 04_layer_boundary_forward cell" in line[0]
            and "BadCheckpoint" in line[0])
    assert "FAIL 04_layer_boundary_forward" in stdout and "ok  04" not in stdout
    staging = [p for p in tmp_path.iterdir() if p.name.startswith("reports.staging-")]
    assert len(staging) == 1 and str(staging[0]) in line[0]
    marker = (staging[0] / "INCOMPLETE").read_text()
    assert "04_layer_boundary_forward.ipynb, cell" in marker and "BadCheckpoint" in marker
    assert json.loads((staging[0] / "runs.json").read_text())[0]["ok"] is False
    assert "failed:" in (staging[0] / "index.html").read_text()


def test_successful_run_swaps_in_keeps_other_files_and_is_quiet(pair, tmp_path, capfd):
    out = tmp_path / "reports"
    _old_reports(out)
    errors._said.clear()
    code = cli(_wb_args(pair, out))
    captured = capfd.readouterr()
    assert code == 0, captured.err
    assert (out / "my-notes.txt").read_text() == "not the workbook's"
    assert json.loads((out / "runs.json").read_text())[0]["ok"] is True
    assert json.loads((out / "04_layer_boundary_forward.ipynb").read_text())["cells"]
    assert [p.name for p in tmp_path.iterdir()] == ["reports"]  # no staging or previous folder left
    for noise in ("ERROR", "Passed unknown parameter", "Unable to parse", "Traceback"):
        assert noise not in captured.err, captured.err
    assert "staging" not in (out / "04_layer_boundary_forward.ipynb").read_text()


def test_ctrl_c_stops_cleanly_and_changes_nothing(pair, tmp_path):
    """A real SIGINT to a real run: exit 130, one line, no traceback, --out byte-identical."""
    out = tmp_path / "reports"
    before = _old_reports(out)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "helpers", *_wb_args(pair, out)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not list(tmp_path.glob("reports.staging-*/INCOMPLETE")):
        time.sleep(0.2)
    time.sleep(3.0)  # into the notebook's cells
    proc.send_signal(signal.SIGINT)
    stdout, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (stdout, err)
    assert "Traceback" not in err and "KeyboardInterrupt caught" not in err
    line = [l for l in err.splitlines() if l.startswith("error:")]
    assert len(line) == 1 and line[0].startswith("error: interrupted at 04_layer_boundary_forward")
    assert tree_hash(out) == before
    staging = list(tmp_path.glob("reports.staging-*"))
    assert len(staging) == 1 and (staging[0] / "INCOMPLETE").read_text().startswith(
        "INCOMPLETE: interrupted at 04")


def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "reports"
    f.write_text("a file")
    code, _, err = run(capsys, "run-workbook", "--out", str(f), "--only", "04")
    assert code == 2 and f"--out {f} is a file" in err.splitlines()[0]
    assert f.read_text() == "a file" and list(tmp_path.iterdir()) == [f]


# Distinct faults injected above (the count #12's closing note quotes): NaN draft (diagnose, bench) 2,
# Inf target 1, NaN scores and NaN draft logits 2, NaN in JSON 1, oversized inputs 4, run-workbook
# steps/device 2, unwritable cache (wiring, patch-sglang status, bench) 3, offline index 1, engine
# strings 3 x 2 commands 6, file/option cases len(_bad_cases()) 13, patch kills: 6 apply writes and
# 4 revert writes, each finished by apply and by revert, 20, hand-edited file 1, manifest-less backup
# 1, failing notebook 1, Ctrl-C 1, --out a file 1.
PATCH_KILLS = 2 * (6 + 4)
BAD_INPUTS = 2 + 1 + 2 + 1 + 4 + 2 + 3 + 1 + 6 + len(_bad_cases()) + PATCH_KILLS + 1 + 1 + 1 + 1 + 1


# ======================================================================================
# Issues #20 and #22: the faults a careless or hostile user still found, and the silent wrong
# answers. Each: the exit status, one line naming the file or value, nothing written or left.

import socket  # noqa: E402
import threading  # noqa: E402
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer  # noqa: E402

from conftest import scaled  # noqa: E402


def error_after_bar(err: str) -> str:
    """The one 'error:' line of a command that had drawn a progress bar: on a line of its own (not
    glued onto a bar frame), the last thing on stderr (no bar redrawn after it), no traceback."""
    assert "Traceback" not in err, err
    lines = [ln for ln in err.replace("\r", "\n").splitlines() if ln.strip()]
    errs = [ln for ln in lines if "error:" in ln]
    assert len(errs) == 1 and errs[0].startswith("error: ") and lines[-1] == errs[0], lines
    return errs[0]


def _quiet(tmp_path: Path, before: dict) -> None:
    """Nothing written and nothing left behind under tmp_path (staging folders included)."""
    assert tree_hash(tmp_path) == before
    assert not [p for p in tmp_path.rglob("*") if ".partial" in p.name or p.name.endswith(".tmp")]


class _Fake:
    """A server on 127.0.0.1 that misbehaves in one chosen way per request."""

    def __init__(self):
        self.mode, self.seen = "ok", []
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                fake.seen.append(body)
                n = len(body["input_ids"])
                if fake.mode == "hang":
                    time.sleep(scaled(30))
                    return
                if fake.mode == "garbage":
                    self.wfile.write(b"SSH-2.0-OpenSSH_9.2\r\n")
                    return
                row = [float("nan") if fake.mode == "nan" else 0.5] * 3 * fake.hidden
                rows = json.dumps({"meta_info": {"hidden_states": [[row] * n]}})
                data = {"ok": rows, "nan": rows,
                        "text": "<html>hello</html>", "list": "[1, 2, 3]"}[fake.mode].encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def fake_server(pair):
    f = _Fake()
    f.hidden = json.loads((pair / "target" / "config.json").read_text())["hidden_size"]
    yield f
    f.server.shutdown()


def _capture(pair, tmp_path, url, *extra):
    return ["capture", "--engine-url", url, "--tokenizer", str(pair / "target"), "--text",
            str(pair / "heldout.txt"), "--out", str(tmp_path / "cap"), "--window", "16", "--records", "2",
            *extra]


def _refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]      # closed on exit: nothing listens there


@pytest.mark.parametrize("mode, expected", [
    ("refused", "cannot reach the engine at http://127.0.0.1:"),
    ("garbage", "did not answer as an HTTP server"),
    ("hang", "within 0.5 s (--timeout)"),
    ("text", "a body that is not JSON (it starts '<html>hello</html>')"),
    ("list", "answered a JSON list; expected an object with meta_info.hidden_states"),
    ("nan", "non-finite values (NaN or Inf; first in row 0)"),
])
def test_capture_against_a_misbehaving_server(mode, expected, pair, fake_server, tmp_path, capsys):
    url = f"http://127.0.0.1:{_refused_port()}" if mode == "refused" else fake_server.url
    fake_server.mode = mode
    before = tree_hash(tmp_path)
    t0 = time.monotonic()
    code, out, err = run(capsys, *_capture(pair, tmp_path, url, "--timeout", "0.5"))
    line = error_after_bar(err)
    assert code == 2 and expected in line, line
    assert url in line or mode in ("list", "nan")  # the URL (with /generate) names the server
    assert time.monotonic() - t0 < scaled(20)      # --timeout bounds the hang, not 600 s
    _quiet(tmp_path, before)


def test_capture_timeout_default_is_60_s():
    from helpers.commands.capture import DEFAULT_TIMEOUT_S
    assert DEFAULT_TIMEOUT_S == 60.0


def test_capture_takes_negative_layer_ids_and_checks_reference_first(pair, fake_server, tmp_path, capsys):
    fake_server.mode, fake_server.seen[:] = "ok", []
    code, out, err = run(capsys, *_capture(pair, tmp_path, fake_server.url, "--layer-ids", "-1,2,6"))
    assert code == 0, err
    assert json.loads((tmp_path / "cap" / "capture.json").read_text())["layer_ids"] == [-1, 2, 6]
    before = tree_hash(tmp_path)
    seen = len(fake_server.seen)
    code, out, err = run(capsys, *_capture(pair, tmp_path / "x", fake_server.url, "--reference",
                                           str(tmp_path / "no-such-dump")))
    assert code == 2 and "no dump at" in one_error_line(err) and str(tmp_path / "no-such-dump") in err
    assert len(fake_server.seen) == seen          # refused before a single request
    _quiet(tmp_path, before)


def test_capture_tokenizer_without_hidden_size(pair, broken, fake_server, tmp_path, capsys):
    target = broken("target")
    cfg = json.loads((target / "config.json").read_text())
    del cfg["hidden_size"]
    (target / "config.json").write_text(json.dumps(cfg))
    before = tree_hash(tmp_path)
    argv = _capture(pair, tmp_path, fake_server.url)
    argv[argv.index("--tokenizer") + 1] = str(target)
    code, _, err = run(capsys, *argv)
    line = one_error_line(err)
    assert code == 2 and "no integer hidden_size" in line and str(target) in line
    _quiet(tmp_path, before)


# --------------------------------------------------------------------------------------
# dump


def _dump(pair, out, *extra):
    return ["dump", "--target", str(pair / "target"), "--boundaries", "0,3,7,12", "--format", "speculators",
            "--out", str(out), "--window", "16", "--records", "2", *extra]


@pytest.mark.parametrize("case", ["cuda", "empty-boundaries", "out-under-file", "window", "no-text"])
def test_dump_refuses(case, pair, broken, tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    argv = _dump(pair, tmp_path / "out")
    if case == "cuda":
        if torch.cuda.is_available():
            pytest.skip("this torch build has CUDA")
        argv += ["--device", "cuda"]
        expected = "sees no CUDA device"
    elif case == "empty-boundaries":
        argv[argv.index("--boundaries") + 1] = ""
        expected = "--boundaries '' names no boundary"
    elif case == "out-under-file":
        argv[argv.index("--out") + 1] = str(tmp_path / "afile" / "out")
        expected = f"{tmp_path / 'afile'} is a file"
    elif case == "window":
        argv[argv.index("--window") + 1] = "2048"
        expected = "--window 2048 is longer than the target's 1024 positions"
    else:
        target = broken("target")               # a target with no heldout.txt beside it
        argv[argv.index("--target") + 1] = str(target)
        expected = "no heldout.txt beside"
    before = tree_hash(tmp_path)
    code, out, err = run(capsys, *argv)
    line = one_error_line(err)
    assert code == 2 and expected in line and no_result(out), line
    _quiet(tmp_path, before)


def test_dump_says_which_text_it_uses(pair, tmp_path, capsys):
    code, out, err = run(capsys, *_dump(pair, tmp_path / "out"))
    assert code == 0, err
    assert f"text: {pair / 'heldout.txt'} (heldout.txt beside the target" in err


def test_sigterm_removes_the_staging_folder(tmp_path):
    from helpers.investigation.dumps import staged_dir

    out = tmp_path / "dump"
    earlier = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exc:
        with staged_dir(out) as stage:
            (stage / "hs_0.safetensors").write_bytes(b"half")
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(scaled(5))                # the handler raises long before this ends
    assert exc.value.code == 143 and list(tmp_path.iterdir()) == []
    assert signal.getsignal(signal.SIGTERM) == earlier          # the handler is put back


# --------------------------------------------------------------------------------------
# diagnose --data on broken dumps


def _legacy_copy(tmp_path) -> Path:
    from _pairs import tiny_dump

    d = tmp_path / "dump"
    shutil.copytree(tiny_dump("speculators-legacy"), d)
    return d


def _spec_copy(tmp_path) -> Path:
    from _pairs import tiny_dump

    d = tmp_path / "dump"
    shutil.copytree(tiny_dump("speculators"), d)
    return d


def _edit_pt(f: Path, change) -> None:
    obj = torch.load(f, weights_only=True)
    change(obj)
    torch.save(obj, f)


def _edit_st(f: Path, change) -> None:
    w = load_file(str(f))
    change(w)
    save_file(w, str(f))


DUMP_CASES = {
    "lengths disagree": ("legacy", lambda d: _edit_pt(d / "data_1.pt", lambda o: o.update(
        input_ids=o["input_ids"][:-3])), "data_1.pt: 125 token ids for 128 positions"),
    "empty hidden_states": ("legacy", lambda d: _edit_pt(d / "data_0.pt", lambda o: o.update(
        hidden_states=[])), "data_0.pt: hidden_states is an empty list"),
    "data_config.json a list": ("legacy", lambda d: (d / "data_config.json").write_text("[1, 2]"),
                                "data_config.json holds a JSON list"),
    "data_config.json hidden_states a list": ("legacy", lambda d: (d / "data_config.json").write_text(
        '{"hidden_states": [2, 6]}'), "data_config.json holds a JSON hidden_states list"),
    "data_config.json not JSON": ("legacy", lambda d: (d / "data_config.json").write_text("{"),
                                  "data_config.json is not valid JSON"),
    "int32 hidden states": ("spec", lambda d: _edit_st(d / "hs_2.safetensors", lambda w: w.update(
        hidden_states=(w["hidden_states"].float() * 100).to(torch.int32))),
        "hs_2.safetensors: its hidden states are torch.int32; expected floating-point"),
    "NaN hidden states": ("spec", lambda d: _edit_st(d / "hs_3.safetensors", lambda w: w[
        "hidden_states"].view(-1)[:5].fill_(float("nan"))), "hs_3.safetensors: 5 non-finite values"),
    "layer id 40 on 12 layers": ("legacy", lambda d: (d / "data_config.json").write_text(json.dumps(
        {"hidden_states": {"layer_ids": [-1, 2, 6, 9, 39]}})),
        "the target has 12 layers (boundaries 0..12): [40]"),
    "duplicated layer ids": ("legacy", lambda d: (d / "data_config.json").write_text(json.dumps(
        {"hidden_states": {"layer_ids": [-1, 2, 2, 9, 11]}})), "layer_ids [-1, 2, 2, 9, 11] repeats [2]"),
}


@pytest.mark.parametrize("name", list(DUMP_CASES))
def test_broken_dump_is_one_line_naming_the_file(name, pair, tmp_path, capsys):
    kind, breaker, expected = DUMP_CASES[name]
    d = _legacy_copy(tmp_path) if kind == "legacy" else _spec_copy(tmp_path)
    breaker(d)
    before = tree_hash(tmp_path)
    # text mode, so the progress bar is drawn: the error must still be a line of its own
    code, out, err = run(capsys, "diagnose", "--data", str(d), "--draft", str(pair / "draft"), "--target",
                         str(pair / "target"), "--steps", "2")
    line = error_after_bar(err)
    assert code == 2 and expected in line and str(d) in line, line
    _quiet(tmp_path, before)


# --------------------------------------------------------------------------------------
# check


def _deep(n: int = 100_000) -> str:
    return "[" * n + "]" * n


def test_check_faults(pair, broken, tmp_path, capsys):
    base = ["check", "--engine", "sglang==0.5.9", "--target", str(pair / "target")]
    d = broken("draft")
    cases = []
    (d / "config.json").write_text("[1, 2, 3]")
    cases.append((d, "config.json holds a JSON list"))
    d2 = tmp_path / "deep"
    shutil.copytree(pair / "draft", d2)
    (d2 / "config.json").write_text('{"a": ' + _deep() + "}")
    cases.append((d2, "nests its JSON too deeply"))
    d3 = tmp_path / "noshape"
    shutil.copytree(pair / "draft", d3)
    raw = (d3 / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    key = next(k for k in header if k != "__metadata__")
    del header[key]["shape"]
    text = json.dumps(header).encode()
    text += b" " * (n - len(text)) if len(text) <= n else b""
    (d3 / "model.safetensors").write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])
    cases.append((d3, "model.safetensors is not a readable safetensors file (Error while deserializing"))
    before = tree_hash(tmp_path)
    for draft, expected in cases:
        code, out, err = run(capsys, *base, "--draft", str(draft))
        line = one_error_line(err)
        assert code == 2 and expected in line and str(draft) in line and no_result(out), line
    _quiet(tmp_path, before)


def test_check_refuses_a_truncated_draft_safetensors(pair, broken, tmp_path, capsys):
    """A draft whose model.safetensors was cut in half: one line naming the file and its size, exit 2, not
    a verdict read from what survived of the header, and nothing written anywhere."""
    d = broken("draft")
    f = d / "model.safetensors"
    _truncate(f)
    before = tree_hash(tmp_path)
    for extra in ((), ("--json",)):
        code, out, err = run(capsys, "check", "--engine", "sglang==0.5.9", "--target", str(pair / "target"),
                             "--draft", str(d), *extra)
        line = one_error_line(err)
        assert code == 2 and no_result(out), (code, out)
        assert f"{f} is not a readable safetensors file" in line and f"{f.stat().st_size} bytes" in line, line
    _quiet(tmp_path, before)


def test_check_draft_config_path_reads_the_folder(pair, tmp_path, capsys):
    draft = pair / "draft"
    assert (draft / "training.json").is_file()
    base = ["check", "--engine", "sglang==0.5.9", "--target", str(pair / "target"), "--json"]
    c1, o1, _ = run(capsys, *base, "--draft", str(draft))
    c2, o2, _ = run(capsys, *base, "--draft", str(draft / "config.json"))
    r1, r2 = json.loads(o1), json.loads(o2)
    assert c1 == c2 and r1["verdict"] == r2["verdict"] and r2["training_layout"] == r1["training_layout"]
    assert "training.json" in r2["training_source"]


def test_eagle_config_as_a_list_is_refused(pair, broken, capsys):
    d = broken("draft")
    cfg = json.loads((d / "config.json").read_text())
    cfg["eagle_config"] = [2, 6, 9]
    (d / "config.json").write_text(json.dumps(cfg))
    before = tree_hash(d)
    code, out, err = run(capsys, "check", "--engine", "sglang==0.5.9", "--target", str(pair / "target"),
                         "--draft", str(d))
    line = one_error_line(err)
    assert code == 2 and "eagle_config is a JSON list" in line and str(d) in line
    assert tree_hash(d) == before


# --------------------------------------------------------------------------------------
# wiring, SGLang trees, patch-sglang


@pytest.fixture(scope="module")
def tree_0523(tmp_path_factory) -> Path:
    """A private copy of a release's tree whose dist-info says 0.5.23."""
    try:
        src = ss.fetch_sglang("0.5.23")
    except ss.IndexUnreachableError as exc:
        pytest.skip(f"PyPI unreachable, cannot fetch sglang 0.5.23: {exc}")
    dest = tmp_path_factory.mktemp("t0523") / "site"
    shutil.copytree(src.root, dest, ignore=shutil.ignore_patterns(".complete"))
    return dest


def test_tree_version_is_compared_with_the_engine(tree_0523, pair, capsys):
    before = tree_hash(tree_0523)
    for argv in (["wiring", "--engine", "sglang==0.5.9", "--arch", "LlamaForCausalLM", "--layers", "12",
                  "--ids", "2,6,9", "--sglang-root", str(tree_0523)],
                 ["check", "--engine", "sglang==0.5.9", "--target", str(pair / "target"), "--draft",
                  str(pair / "draft"), "--sglang-root", str(tree_0523)],
                 ["patch-sglang", "apply", "--version", "0.5.9", "--root", str(tree_0523)]):
        code, out, err = run(capsys, *argv)
        line = one_error_line(err)
        assert code == 2 and "is sglang 0.5.23 (its dist-info), not 0.5.9 as asked" in line, line
    code, out, err = run(capsys, "wiring", "--engine", "sglang==0.5.23", "--arch", "LlamaForCausalLM",
                         "--layers", "12", "--ids", "2,6,9", "--sglang-root", str(tree_0523))
    assert code == 0 and "sglang==0.5.23" in out
    assert tree_hash(tree_0523) == before


def test_trees_that_are_not_sglang(tmp_path, capsys):
    empty = tmp_path / "empty"
    (empty / "sglang").mkdir(parents=True)
    (tmp_path / "nothing").mkdir()
    before = tree_hash(tmp_path)
    for root, expected in ((tmp_path / "nothing", "has no sglang/ folder"),
                           (empty, "has no srt/models/ folder")):
        for argv in (["wiring", "--engine", "sglang==0.5.9", "--arch", "LlamaForCausalLM", "--layers", "12",
                      "--sglang-root", str(root)],
                     ["patch-sglang", "apply", "--version", "0.5.9", "--root", str(root)]):
            code, out, err = run(capsys, *argv)
            line = one_error_line(err)
            assert code == 2 and expected in line and str(root) in line, line
    _quiet(tmp_path, before)


def test_matrix_faults(tmp_path, capsys):
    (tmp_path / "docdir").mkdir()
    before = tree_hash(tmp_path)
    cases = [
        (["--matrix", "--arch", "NoSuchForCausalLM", "--layers", "12", "--versions", "0.5.9"],
         "--arch NoSuchForCausalLM: no SGLang release read (0.5.9) registers"),
        (["--matrix", "--arch", "LlamaForCausalLM", "--layers", "12", "--versions", ""],
         "--versions '' has an empty entry"),
        (["--matrix", "--arch", "LlamaForCausalLM", "--layers", "12", "--versions", "0.5.9,"],
         "--versions '0.5.9,' has an empty entry"),
        (["--matrix-doc", str(tmp_path / "docdir"), "--versions", "0.5.9"],
         f"--matrix-doc {tmp_path / 'docdir'} is a folder"),
    ]
    for argv, expected in cases:
        code, out, err = run(capsys, "wiring", *argv)
        assert code == 2 and expected in error_after_bar(err), err
    _quiet(tmp_path, before)
    assert not (tmp_path / "docdir.tmp").exists()


# --------------------------------------------------------------------------------------
# The sandbox: a planted tree's setter, and the locked child itself


def _planted(tmp_path: Path, body: str) -> Path:
    """0.5.9's Llama file with the setter's body replaced by ``body``."""
    src = ss.fetch_sglang("0.5.9")
    root = tmp_path / "planted"
    shutil.copytree(src.root, root, ignore=shutil.ignore_patterns(".complete"))
    f = root / "sglang/srt/models/llama.py"
    text = f.read_text()
    i = text.index("    def set_eagle3_layers_to_capture")
    j = text.index("\n    def ", i + 10) if "\n    def " in text[i + 10:] else text.index("\nclass ", i)
    f.write_text(text[:i] + "    def set_eagle3_layers_to_capture(self, layer_ids=None):\n"
                 + textwrap.indent(textwrap.dedent(body), " " * 8) + text[j:])
    return root


ESCAPES = {
    "open": "open({out!r}, 'w').write('owned')\nself.model.layers_to_capture = [3]",
    "import": "import os\nos.system('touch {out}')\nself.model.layers_to_capture = [3]",
    "dunder escape": ("[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'Popen'][0]"
                      "(['touch', {out!r}])\nself.model.layers_to_capture = [3]"),
    "getattr escape": "g = getattr(self, '__class__')\nself.model.layers_to_capture = [3]",
    "socket": ("s = getattr(getattr(self, 'x'), 'socket')\nself.model.layers_to_capture = [3]\n"
               "eval(\"__import__('socket').create_connection(('127.0.0.1', {port}))\")"),
}

import textwrap  # noqa: E402


@pytest.mark.parametrize("name", list(ESCAPES))
def test_planted_tree_cannot_write_or_connect(name, tmp_path, capsys):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    out = tmp_path / "owned"
    root = _planted(tmp_path, ESCAPES[name].format(out=str(out), port=listener.getsockname()[1]))
    code, stdout, err = run(capsys, "wiring", "--engine", "sglang==0.5.9", "--arch", "LlamaForCausalLM",
                            "--layers", "12", "--ids", "2,6,9", "--sglang-root", str(root), "--json")
    assert "Traceback" not in err and code in (0, 1)
    assert not out.exists()
    with pytest.raises(OSError):
        listener.accept()[0].close()            # nobody connected
    listener.close()
    res = json.loads(stdout)
    if name in ("dunder escape", "getattr escape", "import"):
        assert any("Sandbox" in e or "sandbox" in e for e in res["errors"]), res["errors"]


def test_locked_child_refuses_writes_sockets_and_processes(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.5)
    script = textwrap.dedent(f"""
        import sys, os, subprocess, socket
        sys.path.insert(0, {str(REPO)!r})
        from helpers.engines.sglang.stub import _lock_down
        _lock_down()
        tries = {{
            "open-w": lambda: open({str(tmp_path / 'a')!r}, "w"),
            "os.open": lambda: os.open({str(tmp_path / 'b')!r}, os.O_CREAT | os.O_WRONLY),
            "mkdir": lambda: os.mkdir({str(tmp_path / 'c')!r}),
            "socket": lambda: socket.create_connection(("127.0.0.1", {listener.getsockname()[1]}), timeout=1),
            "popen": lambda: subprocess.run(["touch", {str(tmp_path / 'd')!r}]),
            "system": lambda: os.system("touch {tmp_path / 'e'}"),
            "import ctypes": lambda: __import__("ctypes"),
        }}
        for name, f in tries.items():
            try:
                f()
                print(name, "ALLOWED")
            except (PermissionError, OSError) as exc:
                print(name, "refused", type(exc).__name__)
        print(open({str(REPO / 'README.md')!r}).read(5))
    """)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    r = subprocess.run([sys.executable, "-I", "-B", "-c", script], capture_output=True, text=True, env=env,
                       timeout=scaled(60))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len([ln for ln in lines if ln.endswith(("PermissionError", "OSError"))]) == 7, lines
    assert not any("ALLOWED" in ln for ln in lines) and lines[-1] == "# EAG"    # reading still works
    assert sorted(p.name for p in tmp_path.iterdir()) == []
    with pytest.raises(OSError):
        listener.accept()[0].close()
    listener.close()


def test_sandboxed_setter_gives_the_release_answer():
    from helpers.engines.sglang import stub

    src = ss.fetch_sglang("0.5.9")
    here = stub._run_setter_here(src, "LlamaForCausalLM", 12, [2, 6, 9])
    there = stub.run_setter(src, "LlamaForCausalLM", 12, [2, 6, 9])
    assert there.layers_to_capture == here.layers_to_capture == [3, 7, 10]
    assert there.executed == here.executed and there.error is None


# --------------------------------------------------------------------------------------
# Pickles: every load is weights_only, so a planted record that would run code is one line.


class _Payload:
    def __reduce__(self):
        return (os.system, ("touch /tmp/eagle3-wb-pwned",))


def test_planted_pickles_are_refused(pair, tmp_path, capsys):
    marker = Path("/tmp/eagle3-wb-pwned")
    marker.unlink(missing_ok=True)
    evil = {"input_ids": torch.arange(8), "hidden_states": [torch.zeros(8, 4)], "x": _Payload()}
    cases = {}
    d = tmp_path / "pt"
    d.mkdir()
    torch.save(evil, d / "data_0.pt")
    cases["pt"] = (["diagnose", "--data", str(d), "--draft", str(pair / "draft")], d / "data_0.pt")
    d = tmp_path / "ckpt" / "rows_0-5000"
    d.mkdir(parents=True)
    torch.save(evil, d / "data_0.ckpt")
    cases["ckpt"] = (["diagnose", "--data", str(d.parent), "--draft", str(pair / "draft")], d / "data_0.ckpt")
    d = tmp_path / "gz" / "rows_0-5000"
    d.mkdir(parents=True)
    import gzip
    import io
    buf = io.BytesIO()
    torch.save(evil, buf)
    (d / "data_0.ckpt.gz").write_bytes(gzip.compress(buf.getvalue()))
    cases["ckpt.gz"] = (["diagnose", "--data", str(d.parent), "--draft", str(pair / "draft")],
                        d / "data_0.ckpt.gz")
    draft = tmp_path / "bin-draft"
    shutil.copytree(pair / "draft", draft)
    w = load_file(str(draft / "model.safetensors"))
    (draft / "model.safetensors").unlink()
    torch.save({**w, "x": _Payload()}, draft / "pytorch_model.bin")
    cases["bin"] = (["bench", "--target", str(pair / "target"), "--draft", str(draft), "--repeats", "1"],
                    draft / "pytorch_model.bin")
    before = tree_hash(tmp_path)
    for name, (argv, f) in cases.items():
        code, out, err = run(capsys, *argv)
        line = one_error_line(err)
        assert code == 2 and str(f) in line, (name, line)
        assert "it asks for posix.system, which a weights-only load refuses" in line, (name, line)
        assert not marker.exists(), name
    assert tree_hash(tmp_path) == before


def test_a_duplicate_is_named_where_it_is_refused(tmp_path):
    """A checkpoint or a capture record that holds one thing twice is refused naming what repeats: the
    tensor two shards both hold (and the shards), the boundary a capture record names twice."""
    from helpers.investigation.dumps import DumpError, open_dump
    from helpers.model.checkpoint import DraftFormatError, read_draft_weights

    draft = tmp_path / "sharded"
    draft.mkdir()
    fc, norm = torch.zeros(4, 12), torch.ones(4)
    save_file({"fc.weight": fc, "norm.weight": norm}, str(draft / "model-00001-of-00002.safetensors"))
    save_file({"fc.weight": fc}, str(draft / "model-00002-of-00002.safetensors"))
    (draft / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "fc.weight": "model-00002-of-00002.safetensors", "norm.weight": "model-00001-of-00002.safetensors"}}))
    with pytest.raises(DraftFormatError) as info:
        read_draft_weights(draft)
    assert ("tensor 'fc.weight' is in two shards (model-00001-of-00002.safetensors and "
            "model-00002-of-00002.safetensors)") in str(info.value)
    dump = tmp_path / "dump"
    dump.mkdir()
    save_file({"hidden_states": torch.zeros(16, 3, 64), "token_ids": torch.arange(16)},
              str(dump / "hs_0.safetensors"))
    (dump / "capture.json").write_text(json.dumps({"slot_boundaries": [3, 7, 3]}))
    with pytest.raises(DumpError, match=r"slot_boundaries \[3, 7, 3\] repeats boundary 3; each slot"):
        open_dump(dump)


# --------------------------------------------------------------------------------------
# Others


def test_run_workbook_param_of_the_wrong_type(tmp_path, capsys):
    code, _, err = run(capsys, "run-workbook", "--out", str(tmp_path / "r"), "-p", "TARGET=123")
    assert "Traceback" not in err and code == 2
    assert len(err.strip().splitlines()) == 1, err                  # every problem on the one error line
    assert err.startswith("error: target 123 does not exist; "), err   # a path, read as text, not a TypeError
    assert list(tmp_path.iterdir()) == []


def test_scale_check_bad_workdir(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    before = tree_hash(tmp_path)
    for wd, expected in ((tmp_path / "afile", "is a file"), (tmp_path / "afile" / "sub", "is a file"),
                         (Path("/proc/no/such"), "/proc/no/such")):
        code, _, err = run(capsys, "scale-check", "--workdir", str(wd), "--hidden", "128", "--vocab", "64",
                           "--intermediate", "64", "--tokens", "8", "--records", "1")
        line = one_error_line(err)
        assert code == 2 and "--workdir" in line and expected in line, line
    _quiet(tmp_path, before)


# ======================================================================================
# Issue #30: the last tracebacks of the hostile pass. Each ends in one line naming the file, field or
# option and what was expected, exit 2, nothing written.


def _rewrite_dump(src: Path, dest: Path, change) -> Path:
    """A copy of a legacy speculators dump (``data_i.pt``) with ``change(record)`` applied to every record."""
    dest.mkdir()
    for f in sorted(src.iterdir()):
        if f.suffix != ".pt":
            shutil.copy(f, dest / f.name)
            continue
        rec = torch.load(f, weights_only=True)
        change(rec)
        torch.save(rec, dest / f.name)
    return dest


def _set_id(value):
    def change(rec):
        rec["input_ids"] = rec["input_ids"].clone()
        rec["input_ids"].view(-1)[5] = value
    return change


@pytest.mark.parametrize("case, change, expected", [
    ("all-masked", lambda r: r.__setitem__("loss_mask", torch.zeros_like(r["loss_mask"])),
     "is masked out (loss_mask 0 everywhere"),
    ("id-beyond-vocab", _set_id(99999), "token id 99999 is outside the vocabulary 0..1023"),
    ("negative-id", _set_id(-3), "token id -3 is outside the vocabulary 0..1023"),
])
def test_dump_records_that_cannot_be_scored(case, change, expected, pair, tmp_path, capsys):
    from _pairs import tiny_dump

    dump = _rewrite_dump(tiny_dump("speculators-legacy"), tmp_path / "dump", change)
    before = tree_hash(tmp_path)
    code, out, err = run(capsys, "diagnose", "--data", str(dump), "--draft", str(pair / "draft"),
                         "--target", str(pair / "target"), "--max-records", "2", "--json")
    line = error_after_bar(err)
    assert code == 2 and expected in line and no_result(out), line
    assert case == "all-masked" or str(dump) in line
    _quiet(tmp_path, before)


def test_diagnose_data_max_tokens_below_what_scoring_needs(pair, tmp_path, capsys):
    from _pairs import tiny_dump

    code, out, err = run(capsys, "diagnose", "--data", str(tiny_dump("speculators")), "--draft",
                         str(pair / "draft"), "--max-tokens", "3")
    line = one_error_line(err)
    assert code == 2 and line.startswith("error: --max-tokens 3 is too few for 3 draft step(s)"), line


def test_shard_index_whose_weight_map_is_a_list(pair, broken, tmp_path, capsys):
    from _pairs import tiny_dump

    target = broken("target")
    (target / "model.safetensors").rename(target / "model-00001-of-00001.safetensors")
    (target / "model.safetensors.index.json").write_text(json.dumps({"weight_map": ["a", "b"]}))
    code, out, err = run(capsys, "diagnose", "--data", str(tiny_dump("speculators")), "--draft",
                         str(pair / "draft"), "--target", str(target))
    line = one_error_line(err)
    assert code == 2 and "weight_map is a JSON list; expected an object" in line
    assert str(target / "model.safetensors.index.json") in line


def test_target_pickle_that_would_run_code(pair, broken, capsys):
    marker = Path("/tmp/eagle3-wb-pwned")
    marker.unlink(missing_ok=True)
    target = broken("target")
    w = load_file(str(target / "model.safetensors"))
    (target / "model.safetensors").unlink()
    torch.save({**w, "x": _Payload()}, target / "pytorch_model.bin")
    before = tree_hash(target)
    code, out, err = run(capsys, "bench", "--target", str(target), "--draft", str(pair / "draft"),
                         "--repeats", "1")
    line = one_error_line(err)
    assert code == 2 and str(target / "pytorch_model.bin") in line and "weights-only" in line, line
    # the global the pickle asks for, in a few words, not torch's paragraph cut off mid-word
    assert "it asks for posix.system, which a weights-only load refuses" in line, line
    assert "In PyTorch 2.6" not in line
    assert not marker.exists() and tree_hash(target) == before


@pytest.mark.parametrize("command", ["check", "bench"])
def test_architectures_given_as_a_string(command, pair, broken, capsys):
    target = broken("target")
    cfg = json.loads((target / "config.json").read_text())
    cfg["architectures"] = cfg["architectures"][0]
    (target / "config.json").write_text(json.dumps(cfg))
    code, out, err = run(capsys, command, "--target", str(target), "--draft", str(pair / "draft"))
    line = one_error_line(err)
    assert code == 2 and '"architectures" is "DeepseekV3ForCausalLM"; expected a list' in line, line
    assert str(target / "config.json") in line


@pytest.mark.parametrize("args, expected", [
    (["--tokens", "0"], "--tokens must be a positive integer, got 0"),
    (["--steps", "0"], "--steps must be a positive integer, got 0"),
    (["--hidden", "200"], "--hidden must be a multiple of the 128-wide attention heads, got 200"),
    (["--tokens", "2"], "--tokens 2 is too few for --steps 1: a record needs at least --steps + 3 = 4"),
])
def test_scale_check_names_the_option(args, expected, tmp_path, capsys):
    code, out, err = run(capsys, "scale-check", "--workdir", str(tmp_path), *args)
    line = one_error_line(err)
    assert code == 2 and line.startswith(f"error: {expected}"), line
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("param, expected", [
    ("BACKEND=123", "BACKEND must be one of reference, vllm, sglang, llamacpp, got 123"),
    ("DRAFT_STEPS=null", "DRAFT_STEPS must be a positive integer, got None"),
])
def test_run_workbook_params_checked_before_any_kernel(param, expected, tmp_path, capsys):
    code, _, err = run(capsys, "run-workbook", "--out", str(tmp_path / "r"), "-p", param)
    assert code == 2 and one_error_line(err).startswith(f"error: {expected}"), err
    assert list(tmp_path.iterdir()) == []


def test_dump_refuses_boundaries_beyond_the_target_before_saying_anything(pair, tmp_path, capsys):
    argv = _dump(pair, tmp_path / "out")
    argv[argv.index("--boundaries") + 1] = "0,3,99"
    code, out, err = run(capsys, *argv)
    line = one_error_line(err)                # the "text: ..." line is not printed before it
    assert code == 2 and "[99] outside 0..12" in line and no_result(out), line
    assert list(tmp_path.iterdir()) == []


def test_capture_against_a_server_that_accepts_and_never_reads(pair, tmp_path, capsys):
    """A listening socket that never accepts: the connection lands in the backlog and the request
    waits on no one. --timeout bounds it and the line names the URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        t0 = time.monotonic()
        code, out, err = run(capsys, *_capture(pair, tmp_path, url, "--timeout", "0.5"))
    line = one_error_line(err)           # named by the /health probe, before any bar is drawn
    assert code == 2 and "within 0.5 s" in line and url in line, line
    assert time.monotonic() - t0 < scaled(20)


# --------------------------------------------------------------------------------------
# Hostile leftovers: each kind ends in one line naming the file or value, exit 2, nothing written.


def test_held_stderr_drops_what_came_before_an_error():
    """A command's stderr into a log: what it said before failing is dropped, so the error is the one
    line; a command that runs on passes everything on, late by at most the hold."""
    import io

    now = [0.0]
    sink = io.StringIO()
    held = errors.HeldStderr(sink, hold_s=10, clock=lambda: now[0])
    held.write("warning: a fallback\n")
    held.write("bar 10%\r")
    assert sink.getvalue() == ""
    held.drop()
    held.write("error: the input\n")
    held.release()
    assert sink.getvalue() == "error: the input\n"
    sink2 = io.StringIO()
    later = errors.HeldStderr(sink2, hold_s=10, clock=lambda: now[0])
    later.write("warning: kept\n")
    now[0] = 11.0
    later.write("bar 50%\r")
    assert sink2.getvalue() == "warning: kept\nbar 50%\r"


@pytest.mark.parametrize("breakage, expected", [
    ("truncated", "model.safetensors is not a readable safetensors file (Error while deserializing header"),
    ("no-tokenizer", "no tokenizer in "),
])
def test_a_broken_target_is_named_before_any_text_is_looked_for(breakage, expected, pair, broken, tmp_path,
                                                               capsys):
    """dump without --text looks for heldout.txt beside the target; a broken target must be named as
    such, not answered with a message about heldout.txt. diagnose and bench say the same."""
    target = broken("target")
    if breakage == "truncated":
        f = target / "model.safetensors"
        os.truncate(f, f.stat().st_size // 2)
    else:
        for f in target.glob("tokenizer*"):
            f.unlink()
    before = tree_hash(tmp_path)
    for cmd in (["dump", "--target", str(target), "--boundaries", "0,3", "--format", "speculators", "--out",
                 str(tmp_path / "d")],
                ["diagnose", "--target", str(target), "--draft", str(pair / "draft"), "--windows", "2"],
                ["bench", "--target", str(target), "--draft", str(pair / "draft"), "--repeats", "1"]):
        code, _, err = run(capsys, *cmd)
        line = one_error_line(err)
        assert code == 2 and "heldout.txt" not in line and expected in line and str(target) in line, line
    assert tree_hash(tmp_path) == before


def test_draft_config_with_a_repeated_id_is_refused(pair, broken, capsys):
    """ids [-1, 2, 2] would be read as a layout (0, 3, 3) with a repeated boundary and judged: refused,
    naming the file, by every command that reads the config."""
    draft = broken("draft")
    cfg = json.loads((draft / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [-1, 2, 2]
    (draft / "config.json").write_text(json.dumps(cfg))
    before = tree_hash(draft)
    for cmd in (["check"], ["wiring"], ["diagnose", "--windows", "2"]):
        code, _, err = run(capsys, *cmd, "--target", str(pair / "target"), "--draft", str(draft))
        line = one_error_line(err)
        assert code == 2 and str(draft / "config.json") in line and "repeats [2]" in line, (cmd, line)
    assert tree_hash(draft) == before


def test_capture_server_that_accepts_and_never_answers(pair, tmp_path, capsys):
    """A socket that accepts and says nothing: named within seconds by the /health probe, before any
    folder is made, whatever --timeout the requests have."""
    import socket as _socket

    srv = _socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    url = f"http://127.0.0.1:{srv.getsockname()[1]}"
    try:
        before = tree_hash(tmp_path)
        t0 = time.monotonic()
        code, _, err = run(capsys, *_capture(pair, tmp_path, url, "--timeout", "600"))
        line = one_error_line(err)
        assert code == 2 and f"no answer from {url}/health within 10 s" in line, line
        assert time.monotonic() - t0 < scaled(40)
        _quiet(tmp_path, before)
    finally:
        srv.close()


def _pickle_target(pair, dest: Path, marker: Path) -> Path:
    shutil.copytree(pair / "target", dest)
    (dest / "model.safetensors").unlink()

    class Runs:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"model.embed_tokens.weight": Runs()}, dest / "pytorch_model.bin")
    return dest


def test_code_running_pickle_target_on_every_path(pair, tmp_path, capsys):
    """A target whose weights are a pickle that would run code: refused on every path that reads a
    target (the whole model, or only its heads for a dump), one line naming the file, nothing run."""
    marker = tmp_path / "RAN"
    target = _pickle_target(pair, tmp_path / "target", marker)
    dump = tmp_path / "dump"
    code, _, err = run(capsys, "dump", "--target", str(pair / "target"), "--boundaries", "0,3,7,10,12",
                       "--format", "speculators", "--out", str(dump), "--records", "2", "--window", "32",
                       "--text", str(pair / "heldout.txt"))
    assert code == 0, err
    for cmd in (["diagnose", "--target", str(target), "--draft", str(pair / "draft"), "--windows", "2"],
                ["bench", "--target", str(target), "--draft", str(pair / "draft"), "--repeats", "1"],
                ["dump", "--target", str(target), "--boundaries", "0,3", "--format", "speculators", "--out",
                 str(tmp_path / "d2"), "--text", str(pair / "heldout.txt")],
                ["diagnose", "--data", str(dump), "--target", str(target), "--draft", str(pair / "draft")]):
        code, _, err = run(capsys, *cmd)
        line = one_error_line(err)
        assert code == 2 and str(target) in line, (cmd, line)
        assert not marker.exists()
    assert not (tmp_path / "d2").exists()


def test_target_whose_auto_map_names_its_own_code(pair, tmp_path, capsys):
    """auto_map naming a Python file in the target's folder: the workbook never runs it. A model_type
    transformers implements loads that implementation (said once); an unknown one is refused."""
    marker = tmp_path / "RAN"
    target = tmp_path / "target"
    shutil.copytree(pair / "target", target)
    (target / "modeling_mine.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    cfg = json.loads((target / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_mine.MyModel",
                       "AutoConfig": "modeling_mine.MyConfig"}
    (target / "config.json").write_text(json.dumps(cfg))
    code, out, err = run(capsys, "diagnose", "--target", str(target), "--draft", str(pair / "draft"),
                         "--windows", "2", "--steps", "1", "--json")
    assert code in (0, 1, 3) and json.loads(out)["exit_code"] == code, err    # judged: a verdict's code
    assert "auto_map names the checkpoint's own code (modeling_mine.py)" in err, err
    assert not marker.exists()
    cfg["model_type"] = "mine"
    (target / "config.json").write_text(json.dumps(cfg))
    code, out, err = run(capsys, "diagnose", "--target", str(target), "--draft", str(pair / "draft"),
                         "--windows", "2")
    line = one_error_line(err)
    assert code == 2 and "model_type 'mine' is not one transformers implements" in line, line
    assert str(target / "config.json") in line and not marker.exists() and no_result(out)


def test_notebook_parameters_of_the_wrong_type_in_lab():
    """EAGLE3_WORKBOOK_PARAMS with a number where a path goes (or text where a count goes): one line naming
    the parameter and what it must be, before any cell uses it."""
    from helpers.notebook.lab import overrides

    params = {"TARGET": None, "EVAL_WINDOWS": 12, "BACKEND": "reference"}
    for raw, said in (('{"TARGET": 123}', "TARGET must be text (a path or a value as written), got 123"),
                      ('{"EVAL_WINDOWS": "6"}', "EVAL_WINDOWS must be an integer, got '6'")):
        with pytest.raises(ValueError, match=None) as exc:
            overrides(params, {"EAGLE3_WORKBOOK_PARAMS": raw}, interactive=True)
        assert said in str(exc.value)


def test_fixes_record_and_build_refuse_what_cannot_be(pair, broken, tmp_path, capsys):
    """A recorded layout past the target's last boundary, repeated, or of the wrong width; a build whose
    --out is a file: refused before anything is written."""
    draft = broken("draft")
    before = tree_hash(draft)
    for layout, said in (("0,3,99", "boundary 99 is past the target's last, 12"),
                         ("0,3,3", "expected distinct boundaries"), ("0,3", "the draft's fc takes 3")):
        code, _, err = run(capsys, "fixes", "record", "--draft", str(draft), "--layout", layout)
        line = one_error_line(err)
        assert code == 2 and said in line, line
    assert tree_hash(draft) == before
    f = tmp_path / "afile"
    f.write_text("x")
    code, _, err = run(capsys, "build-default", "--out", str(f), "--tiny")
    assert code == 2 and "is a file; expected a folder" in one_error_line(err)
