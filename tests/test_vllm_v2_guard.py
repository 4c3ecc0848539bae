"""The engine guard on vLLM 0.32's V2 model runner (docs/guard.md), which CPU launches never take (CPU forces
V1): the wheel's own V2 ``GPUModelRunner.load_model`` sets the capture layers through
``set_eagle3_aux_hidden_state_layers`` on weightless targets of the real classes, with the workbook's plugin
loaded by vLLM's own loader, and the guard judges (tests/vllm_v2_guard_probe.py, run in .venv-vllm, about
30 s). The assertions read the plugin's report rows, not its lines."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import scaled, unavailable

from helpers.engines.vllm.install import EngineUnavailable, find_vllm
from helpers.investigation.fixes import with_engine_ids
from helpers.model.target import target_config
from helpers.rules.conventions import parse_engine

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data" / "tiny-kimi"
PROBE = REPO / "tests" / "vllm_v2_guard_probe.py"


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    try:
        return find_vllm().python
    except EngineUnavailable as exc:
        unavailable(f"no .venv-vllm to run vLLM's V2 runner code in: {exc}")


def _run(python: Path, out: Path, cases: dict[str, tuple], mode: str = "refuse", release: Path | None = None):
    """The probe in .venv-vllm; ``release``: another vLLM release's Python put first on the path."""
    args = [f"{name}:{target}:{draft}:{arch}:{ranks}" for name, (target, draft, arch, ranks) in cases.items()]
    env = {**os.environ, "EAGLE3_WORKBOOK_GUARD": mode, "OMP_NUM_THREADS": "1"}
    if release is not None:
        env.update(PYTHONPATH=str(release), VLLM_TARGET_DEVICE="cpu")
    env.pop("EAGLE3_WORKBOOK_VLLM_REPORT", None)
    proc = subprocess.run([str(python), str(PROBE), str(out), *args], env=env, capture_output=True, text=True,
                          timeout=scaled(300), cwd=REPO)
    print(proc.stderr[-6000:])          # the guard's own lines, for the log
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]
    results = {r["case"]: r for r in lines if "case" in r}
    rows = {name: [json.loads(ln) for ln in (out / f"{name}.jsonl").read_text().splitlines()]
            if (out / f"{name}.jsonl").is_file() else [] for name in cases}
    return lines[0], results, rows, proc.stderr


def _verdict(rows: list[dict]) -> dict:
    verdicts = [r for r in rows if "guard" in r]
    assert len(verdicts) == 1, rows
    assert verdicts[0]["runner"] == "v2"
    return verdicts[0]["guard"]


def test_the_guard_judges_on_vllms_own_v2_runner_code(vllm_python, tmp_path):
    fix_b = with_engine_ids(DATA / "draft-retrained", tmp_path / "fix-b", [3, 7, 10],
                            engine=parse_engine("vllm==0.32.0"))
    llama = tmp_path / "llama"
    cfg = target_config("llama", 4096, 12, hidden=256)
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(llama)
    target, deployed, retrained = DATA / "target", DATA / "draft", DATA / "draft-retrained"
    cases = {"deployed": (target, deployed, "deepseek", "0/1"),
             "retrained": (target, retrained, "deepseek", "0/1"),
             "fix-b": (target, fix_b, "deepseek", "0/1"),
             "pp-first": (llama, deployed, "llama", "0/3"),
             "pp-last": (llama, deployed, "llama", "2/3"),
             "pp-deepseek": (target, deployed, "deepseek", "0/2")}
    install, results, rows, err = _run(vllm_python, tmp_path, cases)

    # vLLM's loader ran the workbook's entry point; both runners hooked, V2's name rebound where it is called
    assert install["install"]["state"] == "installed" and install["install"]["runners"] == ["V1", "V2"]
    assert install["runner_binds_wrapper"]
    marker = [ln for ln in err.splitlines() if "installed on" in ln]
    assert len(marker) == 1 and marker[0].startswith("eagle3-workbook guard (vllm 0.32.0")
    assert "refuse): installed on V1+V2 runners (V1: GPUModelRunner._setup_eagle3" in marker[0]

    # the deployed draft: trained on (0, 3, 7); V2 reads no ids from eagle_config (only V1 does), so the
    # model's default (2, L/2, L-3) = (2, 6, 9) is served: refused before load_model goes on
    v = _verdict(rows["deployed"])
    assert (v["kind"], v["served"], v["trained"], v["ids"], v["refused"]) == \
        ("miswired", [2, 6, 9], [0, 3, 7], None, True)
    assert "[0, 3, 7]" in v["fix"] and "boundary0" in v["fix"]       # DeepseekV2Model's residual at 0
    assert results["deployed"]["raised"] == "GuardRefused" and results["deployed"]["message"] == v["line"]

    # the retrained draft as shipped (nested ids [2, 6, 9]): the same default, trained on (3, 7, 10): refused
    v = _verdict(rows["retrained"])
    assert (v["kind"], v["served"], v["trained"], v["ids"]) == ("miswired", [2, 6, 9], [3, 7, 10], None)
    assert results["retrained"]["raised"] == "GuardRefused"

    # fix B: its training layout written where vLLM reads it (top level): a match, and load_model goes on
    # past the capture setup (it stops later, at init_model_state's arguments: a weightless stub)
    v = _verdict(rows["fix-b"])
    assert (v["kind"], v["served"], v["trained"], v["ids"], v["refused"]) == \
        ("match", [3, 7, 10], [3, 7, 10], [3, 7, 10], False)
    assert results["fix-b"]["raised"] != "GuardRefused" and "encoder_cache" in results["fix-b"]["message"]
    assert results["fix-b"]["aux_hidden_state_layers"] == [3, 7, 10]

    # pipeline parallel, Llama (V2 relays aux states between stages): the first stage is never miswired and
    # load_model configures the relay after the guard; the last stage is judged and refused, and the guard's
    # setter probes leave the relay layout the engine's setter cached (2 aux states from upstream, not 3)
    v = _verdict(rows["pp-first"])
    assert (v["kind"], v["refused"]) == ("other-rank", False)
    assert results["pp-first"]["raised"] != "GuardRefused"
    v = _verdict(rows["pp-last"])
    assert (v["kind"], v["served"], v["refused"]) == ("miswired", [2, 6, 9], True)
    assert results["pp-last"]["relay"] == [2, 2]
    assert results["pp-last"]["aux_hidden_state_layers"] == [2, 6, 9]

    # DeepSeek over PP: not the guard's to refuse on a first stage; vLLM's own check refuses the launch
    v = _verdict(rows["pp-deepseek"])
    assert v["kind"] == "other-rank" and not v["refused"]
    assert results["pp-deepseek"]["stopped_in"] == "verify_supports_aux_hidden_states_over_pp"


def test_off_installs_nothing_and_says_nothing(vllm_python, tmp_path):
    install, results, rows, err = _run(vllm_python, tmp_path, {"deployed": (DATA / "target", DATA / "draft",
                                                                            "deepseek", "0/1")}, mode="off")
    assert install["install"] is None and not install["runner_binds_wrapper"]
    assert "eagle3-workbook guard" not in err and rows["deployed"] == []
    assert results["deployed"]["raised"] != "GuardRefused"


def test_a_release_without_the_v2_setter_stops_a_refusing_launch_and_warns_otherwise(vllm_python):
    proc = subprocess.run([str(vllm_python), str(PROBE), "--hook-failure"], capture_output=True, text=True,
                          timeout=scaled(300), cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    refuse, warn = (json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{"))
    assert refuse["install"]["state"] == "partial" and list(refuse["install"]["failed"]) == ["V2"]
    assert refuse["raised"] and "refusing to serve unguarded" in refuse["raised"]
    assert warn["raised"] is None and warn["install"]["runners"] == ["V1"]
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("eagle3-workbook guard (vllm")
             and ", warn)" in ln]
    assert len(lines) == 1 and "not installed on V2" in lines[0] and "installed on V1 runners" in lines[0]


@pytest.fixture(scope="module")
def vllm_034() -> Path:
    """vLLM 0.34.0's own Python (no V1 runner; the CPU runner subclasses V2), read by ranges."""
    from helpers.engines.vllm.own import release_package
    from helpers.rules.wheels import PackageSourceError

    try:
        return release_package("0.34.0")
    except PackageSourceError as exc:
        unavailable(f"vLLM 0.34.0's Python cannot be read here: {exc}")


def _cases(tmp_path: Path) -> dict[str, tuple]:
    fix_b = with_engine_ids(DATA / "draft-retrained", tmp_path / "fix-b", [3, 7, 10],
                            engine=parse_engine("vllm==0.32.0"))
    llama = tmp_path / "llama"
    cfg = target_config("llama", 4096, 12, hidden=256)
    cfg.architectures = ["LlamaForCausalLM"]
    cfg.save_pretrained(llama)
    target, deployed, retrained = DATA / "target", DATA / "draft", DATA / "draft-retrained"
    return {"deployed": (target, deployed, "deepseek", "0/1"),
            "retrained": (target, retrained, "deepseek", "0/1"),
            "fix-b": (target, fix_b, "deepseek", "0/1"),
            "plamo3-deployed": (llama, deployed, "plamo3", "0/1"),
            "plamo3-fix-b": (llama, fix_b, "plamo3", "0/1"),
            "hf-deployed": (llama, deployed, "transformers", "0/1"),
            "hf-fix-b": (llama, fix_b, "transformers", "0/1")}


@pytest.mark.parametrize("release", ["0.32.0", "0.34.0"])
def test_the_guard_finds_what_the_setter_wrote_on_each_release(vllm_python, vllm_034, tmp_path, release):
    """vLLM 0.34.0 deleted the V1 runner: the guard installs on V2 alone, names the release and its hook site,
    and calls V1 absent, not failed. On both releases the holder is what the release's own setter wrote:
    Plamo3's decoder (not Plamo3Model's class default), the Transformers backend's recorded outputs."""
    install, results, rows, err = _run(vllm_python, tmp_path, _cases(tmp_path),
                                       release=vllm_034 if release == "0.34.0" else None)
    rec = install["install"]
    assert rec["state"] == "installed" and rec["release"].startswith(f"vllm {release}") and not rec["failed"]
    assert rec["runners"] == (["V2"] if release == "0.34.0" else ["V1", "V2"])
    assert rec["absent"] == (["V1"] if release == "0.34.0" else [])
    marker = [ln for ln in err.splitlines() if "installed on" in ln]
    assert len(marker) == 1 and f"(vllm {release}" in marker[0]
    assert ("no V1 runner in this release" in marker[0]) == (release == "0.34.0")
    expect = {"deployed": ("miswired", [2, 6, 9], True), "retrained": ("miswired", [2, 6, 9], True),
              "fix-b": ("match", [3, 7, 10], False),
              "plamo3-deployed": ("miswired", [2, 6, 9], True), "plamo3-fix-b": ("match", [3, 7, 10], False),
              "hf-deployed": ("miswired", [2, 6, 9], True), "hf-fix-b": ("match", [3, 7, 10], False)}
    for name, (kind, served, refused) in expect.items():
        v = _verdict(rows[name])
        assert (v["kind"], v["served"], v["refused"]) == (kind, served, refused), (name, v["line"])
        assert v["engine"].startswith(f"vllm {release}")
        assert (results[name]["raised"] == "GuardRefused") == refused, results[name]
    assert _verdict(rows["plamo3-fix-b"])["basis"].startswith("Plamo3Decoder.aux_hidden_state_layers")
    assert "RecordedCapture" in _verdict(rows["hf-fix-b"])["basis"]
