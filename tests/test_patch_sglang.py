"""The boundary-0 patch on private copies of the cached SGLang trees (the shared cache is never written)."""
from __future__ import annotations

import json
import py_compile
import shutil
from pathlib import Path

import pytest

from helpers.commands import patch_sglang
from helpers.engines.sglang import patch as ps
from helpers.engines.sglang import source as ss
from helpers.engines.sglang.inspect import inspect_model
from helpers.engines.sglang.stub import exec_capture_site, run_setter
from helpers.rules import wiring
from helpers.rules.conventions import parse_engine

L = 12
FILES = [e.file for e in ps.EDITS]
SLIM = ("sglang/srt/models", "sglang/srt/model_executor", "sglang/srt/layers")


def _fetch(version):
    try:
        return ss.fetch_sglang(version)
    except ss.IndexUnreachableError as exc:
        pytest.skip(f"PyPI unreachable, cannot fetch sglang {version}: {exc}")


def _copy_tree(src: ss.SglangSource, dest: Path) -> Path:
    """The parts the resolver and the patch read, plus the dist-info (RECORD hashes)."""
    for rel in SLIM:
        shutil.copytree(src.root / rel, dest / rel)
    for info in src.root.glob("sglang-*.dist-info"):
        shutil.copytree(info, dest / info.name)
    return dest


@pytest.fixture(scope="module")
def master_059(tmp_path_factory):
    """One pristine 0.5.9 copy per module; tests copy it again before writing."""
    dest = _copy_tree(_fetch("0.5.9"), tmp_path_factory.mktemp("master-0.5.9"))
    if ps.patch_status("0.5.9", root=dest).state == "patched":  # the shared cache was patched
        ps.revert_patch("0.5.9", root=dest)
    return dest


@pytest.fixture
def tree(master_059, tmp_path) -> Path:
    return _copy_tree(ss.source_at(master_059, "0.5.9"), tmp_path / "sglang-0.5.9")


def _hashes(root: Path) -> dict[str, str]:
    return {rel: ss.sha256_file(root / rel) for rel in FILES}


def _resolve(root, arch="DeepseekV3ForCausalLM", ids=(-1, 2, 6)):
    return wiring.resolve(parse_engine("sglang==0.5.9"), arch, L, ids=list(ids), root=root)


def test_status_of_pristine_tree(tree):
    st = ps.patch_status("0.5.9", root=tree)
    record = ss.source_at(tree).record_hashes()
    assert (st.state, st.patched, st.needed, st.backup) == ("pristine", False, True, None)
    assert st.files == {rel: record[rel] for rel in FILES}


@pytest.mark.parametrize("arch", ["DeepseekV3ForCausalLM", "LlamaForCausalLM"])
def test_apply_makes_boundary0_capturable(tree, arch):
    before = _resolve(tree, arch)
    assert before.served_layout == (0, 3, 7)
    assert any("residual` is None" in e for e in before.errors)

    st = ps.apply_patch("0.5.9", root=tree)
    assert (st.state, st.patched, st.changed) == ("patched", True, True)
    for rel in FILES:
        py_compile.compile(str(tree / rel), cfile=str(tree / "pyc" / (rel + "c")), doraise=True)
        assert ps.MARKER in (tree / rel).read_text()

    after = _resolve(tree, arch)
    assert after.served_layout == (0, 3, 7) and after.errors == []
    site = inspect_model(arch, source=ss.source_at(tree, "0.5.9")).capture
    assert site.style == "inline-guarded"
    # the patched statement itself, executed: the embedding alone at i == 0, the sum elsewhere
    assert exec_capture_site(site, 0, 1.0, None, [0]) == [1.0]
    assert exec_capture_site(site, 3, 1.0, 2.0, [3]) == [3.0]


def test_setter_needs_no_edit(tree):
    # 0.5.9's `[val + 1 for val in layer_ids]` already sends id -1 to capture index 0
    run = run_setter(ss.source_at(tree, "0.5.9"), "DeepseekV3ForCausalLM", L, [-1, 2, 6])
    assert run.layers_to_capture == [0, 3, 7]
    assert all("set_eagle3" not in e.anchor for e in ps.EDITS)


def test_apply_twice_is_a_noop(tree):
    ps.apply_patch("0.5.9", root=tree)
    patched = _hashes(tree)
    manifest = (tree / ps.BACKUP_DIR / ps.MANIFEST).read_bytes()
    again = ps.apply_patch("0.5.9", root=tree)
    assert (again.state, again.changed) == ("patched", False)
    assert _hashes(tree) == patched
    assert (tree / ps.BACKUP_DIR / ps.MANIFEST).read_bytes() == manifest


def test_revert_restores_bytes(tree):
    pristine = {rel: (tree / rel).read_bytes() for rel in FILES}
    ps.apply_patch("0.5.9", root=tree)
    assert _hashes(tree) != {rel: ss.sha256_bytes(b) for rel, b in pristine.items()}
    st = ps.revert_patch("0.5.9", root=tree)
    assert (st.state, st.changed) == ("pristine", True)
    assert {rel: (tree / rel).read_bytes() for rel in FILES} == pristine
    record = ss.source_at(tree).record_hashes()
    assert all(record[rel] == sha for rel, sha in st.files.items())
    assert not (tree / ps.BACKUP_DIR).exists()
    assert ps.revert_patch("0.5.9", root=tree).changed is False  # second revert: nothing to do


def test_revert_without_backup_uses_record_hash(tree):
    pristine = _hashes(tree)
    ps.apply_patch("0.5.9", root=tree)
    shutil.rmtree(tree / ps.BACKUP_DIR)
    ps.revert_patch("0.5.9", root=tree)
    assert _hashes(tree) == pristine


def test_revert_finishes_an_interrupted_apply(tree):
    pristine = _hashes(tree)
    ps.apply_patch("0.5.9", root=tree)
    # as if the process died after writing only deepseek_v2.py
    shutil.copyfile(tree / ps.BACKUP_DIR / "files" / FILES[0], tree / FILES[0])
    st = ps.patch_status("0.5.9", root=tree)
    assert st.state == "partial" and "revert it" in st.message and "apply again to finish" in st.message
    patched = ps.apply_patch("0.5.9", root=tree)  # finishes from the manifest: the files it records, checked
    assert patched.state == "patched" and patched.changed
    shutil.copyfile(tree / ps.BACKUP_DIR / "files" / FILES[0], tree / FILES[0])
    assert ps.revert_patch("0.5.9", root=tree).state == "pristine"
    assert _hashes(tree) == pristine and not (tree / ps.BACKUP_DIR).exists()


def test_partial_tree_without_backup_is_not_finished_by_apply(tree):
    pristine = _hashes(tree)
    ps.apply_patch("0.5.9", root=tree)
    shutil.copyfile(tree / ps.BACKUP_DIR / "files" / FILES[0], tree / FILES[0])
    shutil.rmtree(tree / ps.BACKUP_DIR)
    with pytest.raises(ps.PatchError, match="no backup to finish from"):  # no manifest: apply does not guess
        ps.apply_patch("0.5.9", root=tree)
    assert ps.revert_patch("0.5.9", root=tree).state == "pristine"  # reverse edit, proved by RECORD
    assert _hashes(tree) == pristine


def test_revert_refuses_a_file_edited_after_patching(tree):
    ps.apply_patch("0.5.9", root=tree)
    llama = tree / FILES[0]
    llama.write_text(llama.read_text() + "\n# local edit\n")
    edited = _hashes(tree)
    with pytest.raises(ps.PatchError, match="changed since it was patched"):
        ps.revert_patch("0.5.9", root=tree)
    assert _hashes(tree) == edited


@pytest.mark.parametrize("how", ["absent", "twice"])
def test_anchor_misfit_refuses_that_file_and_writes_nothing_to_it(tree, how):
    deepseek = tree / "sglang/srt/models/deepseek_v2.py"
    anchor = next(e.anchor for e in ps.EDITS if e.file.endswith("deepseek_v2.py"))
    text = deepseek.read_text()
    if how == "absent":  # e.g. a local fork wrote the sum the other way round
        text = text.replace(anchor, anchor.replace("hidden_states + residual", "residual + hidden_states"))
    else:
        text += f'\n_COPY = """\n{anchor}"""\n'
    deepseek.write_text(text)
    before = _hashes(tree)
    rel = "sglang/srt/models/deepseek_v2.py"
    st = ps.patch_status("0.5.9", root=tree)
    assert st.state == "pristine" and st.file_states[rel] == "misfit"
    assert "anchor found" in st.skipped[rel]
    # asked for DeepSeek: its file does not fit, so nothing at all is written
    with pytest.raises(ps.PatchError, match="nothing written"):
        ps.apply_patch("0.5.9", root=tree, arch="DeepseekV3ForCausalLM")
    assert _hashes(tree) == before and not (tree / ps.BACKUP_DIR).exists()
    # the DeepSeek advice agrees: it does not send the user to a patch that would refuse
    r = _resolve(tree, "DeepseekV3ForCausalLM")
    assert any("does not fit sglang/srt/models/deepseek_v2.py" in e for e in r.errors), r.errors
    assert not any("patch-sglang apply" in e for e in r.errors)
    # without --arch the fitting file is patched and the misfit one is left byte for byte
    st = ps.apply_patch("0.5.9", root=tree)
    assert st.state == "patched" and st.changed and rel in st.skipped
    assert ss.sha256_file(deepseek) == before[rel]
    assert ss.sha256_file(tree / FILES[0]) != before[FILES[0]]
    manifest = json.loads((tree / ps.BACKUP_DIR / ps.MANIFEST).read_text())
    assert list(manifest["files"]) == [FILES[0]]
    assert ps.revert_patch("0.5.9", root=tree).state == "pristine"
    assert _hashes(tree) == before and not (tree / ps.BACKUP_DIR).exists()


def test_unknown_version_writes_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv(ss.CACHE_ENV, str(tmp_path))
    try:
        with pytest.raises(ps.PatchError, match=r"0\.0\.1"):
            ps.apply_patch("0.0.1")
    except ss.IndexUnreachableError as exc:
        pytest.skip(f"PyPI unreachable: {exc}")
    assert not (tmp_path / "sglang" / "0.0.1").exists()


def test_0523_needs_no_patch_and_is_left_untouched(tmp_path):
    tree = _copy_tree(_fetch("0.5.23"), tmp_path / "sglang-0.5.23")
    before = _hashes(tree)
    st = ps.apply_patch("0.5.23", root=tree)
    assert (st.state, st.needed, st.patched, st.changed) == ("not-needed", False, False, False)
    assert "DeepseekV3ForCausalLM: id 0" in st.message and "LlamaForCausalLM: id -1" in st.message
    assert _hashes(tree) == before and not (tree / ps.BACKUP_DIR).exists()
    assert ps.show_diff("0.5.23", root=tree).startswith("# sglang 0.5.23 already captures boundary 0")


def test_show_diff(tree):
    diff = ps.show_diff("0.5.9", root=tree)
    assert "--- a/sglang/srt/models/llama.py" in diff and "+++ b/sglang/srt/models/deepseek_v2.py" in diff
    assert "-                aux_hidden_states.append(hidden_states + residual)" in diff
    assert f"# {ps.MARKER}" in diff
    ps.apply_patch("0.5.9", root=tree)
    assert ps.show_diff("0.5.9", root=tree) == diff  # same diff, read from the backup


def test_cli(tree, capsys):
    root = str(tree)
    assert patch_sglang.main(["status", "--version", "0.5.9", "--root", root, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["version"] == "0.5.9" and d["patched"] is False and set(d["files"]) == set(FILES)
    assert patch_sglang.main(["apply", "--version", "0.5.9", "--root", root, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["patched"] is True
    assert patch_sglang.main(["diff", "--version", "0.5.9", "--root", root]) == 0
    assert "eagle3-workbook patch" in capsys.readouterr().out
    assert patch_sglang.main(["revert", "--version", "0.5.9", "--root", root]) == 0
    assert "pristine" in capsys.readouterr().out


def test_cli_bad_input(capsys):
    assert patch_sglang.main(["apply"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--version" in err and err.count("\n") == 1
    assert patch_sglang.main(["apply", "--version", "not-a-version"]) == 2
    assert "not an sglang version" in capsys.readouterr().err
    if ss.installed_sglang() is None:
        assert patch_sglang.main(["status", "--version", "0.5.9", "--target", "installed"]) == 2
        assert "no sglang is installed" in capsys.readouterr().err


# --------------------------------------------------------------------------------------
# Per-file application: 0.5.4 has the Llama capture but no EAGLE3 for DeepSeek at all.


@pytest.fixture
def tree_054(tmp_path) -> Path:
    return _copy_tree(_fetch("0.5.4"), tmp_path / "sglang-0.5.4")


def test_054_patches_llama_and_leaves_deepseek_alone(tree_054):
    llama, deepseek = FILES  # llama.py, deepseek_v2.py
    before = _hashes(tree_054)
    st = ps.patch_status("0.5.4", root=tree_054)
    assert st.state == "pristine"
    assert st.file_states == {llama: "pristine", deepseek: "no-capture"}
    assert "cannot use EAGLE3 in sglang 0.5.4" in st.skipped[deepseek]

    # DeepSeek has nothing to patch in 0.5.4: asking for it writes nothing
    with pytest.raises(ps.PatchError, match="nothing written"):
        ps.apply_patch("0.5.4", root=tree_054, arch="DeepseekV3ForCausalLM")
    assert _hashes(tree_054) == before and not (tree_054 / ps.BACKUP_DIR).exists()

    st = ps.apply_patch("0.5.4", root=tree_054, arch="LlamaForCausalLM")
    assert (st.state, st.changed) == ("patched", True)
    assert ss.sha256_file(tree_054 / deepseek) == before[deepseek]
    py_compile.compile(str(tree_054 / llama), cfile=str(tree_054 / "pyc" / "llama.pyc"), doraise=True)
    r = wiring.resolve(parse_engine("sglang==0.5.4"), "LlamaForCausalLM", 32, ids=[-1, 15, 28], root=tree_054)
    assert r.served_layout == (0, 16, 29) and r.errors == []
    diff = ps.show_diff("0.5.4", root=tree_054)
    assert f"+++ b/{llama}" in diff and f"# {deepseek}: not patched" in diff

    assert ps.revert_patch("0.5.4", root=tree_054).state == "pristine"
    record = ss.source_at(tree_054).record_hashes()
    assert _hashes(tree_054) == before == {rel: record[rel] for rel in FILES}


def test_054_advice_is_a_command_that_works(tree_054, capsys):
    """The audit's case: wiring advised `apply --version 0.5.4`, and apply refused."""
    r = wiring.resolve(parse_engine("sglang==0.5.4"), "LlamaForCausalLM", 32, ids=[-1, 15, 28], root=tree_054)
    advice = next(e for e in r.errors if "patch-sglang apply" in e)
    cmd = advice.split("`python -m helpers patch-sglang ")[1].split("`")[0].split()
    assert cmd == ["apply", "--version", "0.5.4", "--root", str(tree_054), "--arch", "LlamaForCausalLM"]
    assert patch_sglang.main(cmd) == 0
    assert "patched (changed)" in capsys.readouterr().out
    assert wiring.resolve(parse_engine("sglang==0.5.4"), "LlamaForCausalLM", 32, ids=[-1, 15, 28],
                          root=tree_054).capturable


def test_advice_for_a_file_the_patch_does_not_edit(tree_054):
    # apertus.py evaluates the same unguarded sum, but the patch edits only llama.py and deepseek_v2.py
    r = wiring.resolve(parse_engine("sglang==0.5.4"), "ApertusForCausalLM", 32, ids=[-1, 15, 28],
                       root=tree_054)
    assert any("does not cover sglang/srt/models/apertus.py" in e for e in r.errors), r.errors
    assert not any("patch-sglang apply" in e for e in r.errors)
    with pytest.raises(ps.PatchError, match="apertus.py, which the patch does not edit"):
        ps.apply_patch("0.5.4", root=tree_054, arch="ApertusForCausalLM")
    assert not (tree_054 / ps.BACKUP_DIR).exists()


def test_cli_arch_only_for_apply(tree, capsys):
    args = ["status", "--version", "0.5.9", "--root", str(tree), "--arch", "LlamaForCausalLM"]
    assert patch_sglang.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--arch only applies to `apply`" in err and err.count("\n") == 1
