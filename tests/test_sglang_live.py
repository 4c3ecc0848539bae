"""SGLang itself in the loop (docs/sglang-cpu.md): sglang 0.5.23 from .venv-sglang serving the tiny pair.

The pair is ``tests/_pairs.py``'s ``tiny_default()``: a DeepSeek-V3 target and an SGLang-format draft
trained on (0, 3, 7), deployed with ids [2, 6, 9]. Each engine starts once per module (10-25 s each on a
quiet 2-core CPU) and serves several checks: greedy output equal to the workbook's own fp32 target,
accept length equal to the reference engine's fed the layout SGLang serves, the slots the draft's ``fc``
really received equal to the boundaries the workbook predicts, under 0.5.23's own rule and under 0.5.9's
setter installed in the live engine. Skipped only when ``EAGLE3_WORKBOOK_SGLANG=0`` says this host has no
SGLang on purpose; a host where setup failed fails here, with the setup log's path.
"""
from __future__ import annotations

import json
import os
import shutil
import time

import pytest
import torch
from _pairs import tiny_default, tiny_draft
from conftest import scaled

from helpers.engines.sglang.engine import SGLangEngine, SglangLaunch
from helpers.rules.conventions import Engine

pytestmark = [pytest.mark.live,
              pytest.mark.skipif(os.environ.get("EAGLE3_WORKBOOK_SGLANG") == "0",
                                 reason="EAGLE3_WORKBOOK_SGLANG=0: this host runs without SGLang on purpose")]

STEPS, NEW = 3, 24
THREADS = int(os.environ.get("EAGLE3_WORKBOOK_SGLANG_TEST_THREADS", "2"))


@pytest.fixture(scope="module")
def install(sglang_install):
    return sglang_install


@pytest.fixture(scope="module")
def pair():
    from helpers.investigation.pair import load_pair
    root = tiny_default()
    return load_pair(root / "target", root / "draft")


@pytest.fixture(scope="module")
def prompts(pair):
    ids = pair.tokenizer((pair.target_dir.parent / "heldout.txt").read_text(), verbose=False)["input_ids"]
    return [ids[i * 300: i * 300 + 40 + i] for i in range(3)]   # distinct lengths: fc inputs are kept by rows


def _engine(install, spec, tmp_path_factory):
    return SGLangEngine(install, spec, threads=THREADS, progress=False, start_timeout=scaled(300),
                        log_dir=tmp_path_factory.mktemp("sglang"))


def _serve(install, spec, prompts, tmp_path_factory) -> dict:
    """Start, generate, read everything, stop: one engine at a time, never two."""
    t0 = time.perf_counter()
    with _engine(install, spec, tmp_path_factory) as e:
        gen = e.generate(prompts, NEW)
        out = {"gen": gen, "fc": e.fc_inputs(), "record": e.record(), "guard": e.guard_verdict()}
    out["seconds"] = time.perf_counter() - t0
    return out


@pytest.fixture(scope="module")
def deployed(install, pair, prompts, tmp_path_factory):
    """The deployed draft on 0.5.23's own rule: one engine, one generate, read by several tests."""
    return _serve(install, SglangLaunch(pair.target_dir, pair.draft_dir, steps=STEPS, probe=True), prompts,
                  tmp_path_factory)


@pytest.fixture(scope="module")
def rule_059(install, pair, prompts, tmp_path_factory):
    """The same draft with sglang 0.5.9's own setter installed in the live target class."""
    return _serve(install, SglangLaunch(pair.target_dir, pair.draft_dir, steps=STEPS, probe=True,
                                        capture_rule="0.5.9"), prompts, tmp_path_factory)


_REFERENCE: dict = {}


def _reference(pair, layout, prompts):
    """The workbook's fp32 reference engine fed ``layout``: tokens, pooled accept length, histogram."""
    from helpers.boundaries import CapturePlan
    from helpers.model.draft import run_as
    from helpers.model.engine import acceptance_histogram, speculative_generate
    key = (tuple(layout), tuple(map(tuple, prompts)))
    if key not in _REFERENCE:
        plan = CapturePlan(tuple(layout), pair.num_layers, source="test")
        with run_as(pair.draft, Engine("sglang", "0.5.23", live=True)), torch.no_grad():
            runs = [speculative_generate(pair.target, pair.draft, plan, torch.tensor(p), NEW, k=STEPS)
                    for p in prompts]
        rounds = sum(len(r.accepted) for r in runs)
        _REFERENCE[key] = {"tokens": [list(map(int, r.tokens)) for r in runs],
                           "tau": 1 + sum(sum(r.accepted) for r in runs) / rounds,
                           "histogram": acceptance_histogram(runs)}
    return _REFERENCE[key]


def _measured_slots(pair, prompts, fc: dict) -> tuple[list[int], float]:
    """Which boundary each slot of the draft's fc input is, for the first prompt (its prefill rows)."""
    rows = len(prompts[0])
    assert rows in fc, f"no fc input of {rows} rows saved (got {sorted(fc)})"
    x = fc[rows]
    with torch.no_grad():
        hs = pair.target(torch.tensor([prompts[0]]), output_hidden_states=True).hidden_states
    hidden = hs[0].shape[-1]
    slots, worst = [], 0.0
    for s in range(x.shape[1] // hidden):
        chunk = x[:, s * hidden:(s + 1) * hidden]
        diffs = [float((chunk - hs[b][0].float()).abs().max()) for b in range(pair.num_layers)]
        best = min(range(len(diffs)), key=diffs.__getitem__)
        slots.append(best)
        worst = max(worst, diffs[best])
    return slots, worst


def _baseline(pair, prompts):
    from helpers.model.engine import baseline_generate
    key = ("baseline", tuple(map(tuple, prompts)))
    if key not in _REFERENCE:
        with torch.no_grad():
            _REFERENCE[key] = [list(map(int, baseline_generate(pair.target, torch.tensor(p), NEW).tokens))
                               for p in prompts]
    return _REFERENCE[key]


def test_greedy_output_is_the_workbooks_fp32_target(deployed, pair, prompts):
    assert deployed["gen"].tokens == _baseline(pair, prompts)


def test_deployed_accept_length_matches_the_reference_fed_the_served_layout(deployed, pair, prompts):
    plan = pair.served(Engine("sglang", "0.5.23"))
    assert plan.layout == (2, 6, 9)               # 0.5.23 takes DeepSeek ids literally
    gen = deployed["gen"]
    ref = _reference(pair, plan.layout, prompts)
    assert ref["tokens"] == _baseline(pair, prompts)          # the reference is lossless too
    # greedy fp32 on both: the same proposals are accepted; the tolerance covers a near-tie argmax
    assert abs(gen.accept_length - ref["tau"]) <= 0.1, (gen.accept_length, ref["tau"])
    assert gen.drafts > 0 and len(gen.accepted_per_position) == STEPS
    assert gen.accepted_per_position[0] >= gen.accepted_per_position[1] >= gen.accepted_per_position[2]


def test_measured_slots_are_the_predicted_boundaries_on_0_5_23(deployed, pair, prompts):
    slots, worst = _measured_slots(pair, prompts, deployed["fc"])
    assert tuple(slots) == pair.served(Engine("sglang", "0.5.23")).layout == (2, 6, 9)
    assert worst < 1e-3, worst
    assert deployed["record"]["captures"][-1]["layers_to_capture"] == [2, 6, 9]


def test_accommodations_are_in_the_record(deployed):
    rec = deployed["record"]
    names = {a["name"] for a in rec["accommodations"]}
    assert {"cpu-engine", "sgl_kernel-stand-in", "amx-reported", "torchvision-schemas", "default-rope",
            "moe_layer_freq", "fork-children"} <= names, names
    assert rec["rules"] == "runtime 0.5.23" and rec["version"] == "0.5.23"
    assert all(a["why"] for a in rec["accommodations"])


def test_installed_0_5_9_setter_serves_the_original_case(rule_059, pair, prompts):
    """runtime 0.5.23, capture rule 0.5.9: the deployed ids [2, 6, 9] are served (b3, b7, b10)."""
    plan = pair.served(Engine("sglang", "0.5.9"))
    assert plan.layout == (3, 7, 10)
    slots, worst = _measured_slots(pair, prompts, rule_059["fc"])
    assert tuple(slots) == plan.layout and worst < 1e-3, (slots, worst)
    rec = rule_059["record"]
    assert rec["rules"] == "runtime 0.5.23, capture rule 0.5.9"
    assert rec["captures"][-1] == {"ids": [2, 6, 9], "layers_to_capture": [3, 7, 10]}
    assert any(a["name"] == "capture-rule" for a in rec["accommodations"])
    gen, ref = rule_059["gen"], _reference(pair, plan.layout, prompts)
    assert gen.tokens == _baseline(pair, prompts)
    assert abs(gen.accept_length - ref["tau"]) <= 0.1, (gen.accept_length, ref["tau"])


def test_patched_ids_under_0_5_9_setter_serve_fix_a(install, pair, prompts, tmp_path_factory):
    """Notebook 05's fix A: ids [-1, 2, 6] through 0.5.9's setter capture (embed, b3, b7) live."""
    from helpers.engines.sglang.resolve import source_for
    from helpers.engines.sglang.stub import run_setter
    draft = tmp_path_factory.mktemp("fixA") / "draft"
    shutil.copytree(pair.draft_dir, draft)
    cfg = json.loads((draft / "config.json").read_text())
    cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [-1, 2, 6]
    (draft / "config.json").write_text(json.dumps(cfg, indent=2))
    arch = pair.target.config.architectures[0]
    predicted = run_setter(source_for("0.5.9", None), arch, pair.num_layers, [-1, 2, 6]).layers_to_capture
    assert predicted == [0, 3, 7]
    run = _serve(install, SglangLaunch(pair.target_dir, draft, steps=STEPS, probe=True, capture_rule="0.5.9"),
                 prompts[:1], tmp_path_factory)
    gen, rec = run["gen"], run["record"]
    slots, worst = _measured_slots(pair, prompts, run["fc"])
    assert slots == predicted and worst < 1e-3, (slots, worst)
    assert rec["captures"][-1] == {"ids": [-1, 2, 6], "layers_to_capture": [0, 3, 7]}
    ref = _reference(pair, tuple(predicted), prompts[:1])
    assert abs(gen.accept_length - ref["tau"]) <= 0.1, (gen.accept_length, ref["tau"])
    assert run["seconds"] < scaled(120)


def test_guard_warns_in_the_workbooks_launch_and_names_this_releases_ids(deployed):
    """EAGLE3_WORKBOOK_GUARD=warn (the workbook's default launch): the engine starts, so the symptom stays
    measurable, and the guard's verdict names what the live setter serves and the ids that would fix it,
    found by running 0.5.23's own setter (it adds 1 only when the first id is 1)."""
    g = deployed["guard"]
    assert g["kind"] == "miswired" and g["mode"] == "warn"
    assert g["served"] == [2, 6, 9] and g["trained"] == [0, 3, 7] and g["ids"] == [2, 6, 9]
    assert "to [0, 3, 7]" in g["fix"] and g["seconds"] < 5


def test_guard_under_the_0_5_9_setter_names_fix_a(rule_059):
    """The original case's rule (id + 1): the guard's fix is the seed's fix A, ids [-1, 2, 6]."""
    g = rule_059["guard"]
    assert g["kind"] == "miswired" and g["served"] == [3, 7, 10] and "to [-1, 2, 6]" in g["fix"]


def test_guard_refuses_the_deployed_draft_and_starts_the_retrained(install, pair, prompts, tmp_path_factory):
    """refuse: the deployed draft never serves a token (one line: served, trained, fix); the draft
    retrained on what the original case's rule serves starts, and decodes losslessly."""
    from helpers.engines.sglang.engine import EngineStartError
    from helpers.live.guard import Mode
    with pytest.raises(EngineStartError) as info:
        _engine(install, SglangLaunch(pair.target_dir, pair.draft_dir, steps=STEPS, guard=Mode.REFUSE),
                tmp_path_factory)
    line = str(info.value)
    assert "eagle3-workbook guard" in line and "(2, 6, 9)" in line and "trained on (0, 3, 7)" in line
    assert "fix:" in line
    retrained = tiny_draft((3, 7, 10))
    run = _serve(install, SglangLaunch(pair.target_dir, retrained, steps=STEPS, capture_rule="0.5.9",
                                       guard=Mode.REFUSE), prompts[:1], tmp_path_factory)
    assert run["guard"]["kind"] == "match" and run["guard"]["served"] == [3, 7, 10]
    assert run["gen"].tokens[0] == _baseline(pair, prompts[:1])[0]


def test_bench_backend_sglang_runs_the_original_case(install, capsys):
    """``bench --backend sglang --engine sglang==0.5.9``: the deployed draft served (b3, b7, b10) by the
    live engine under 0.5.9's setter, SGLang's accept length equal to the reference engine's on that
    layout, the paired timing and the accommodations in the JSON."""
    from helpers.commands.bench import main
    d = tiny_default()
    rc = main(["--backend", "sglang", "--engine", "sglang==0.5.9", "--target", str(d / "target"),
               "--draft", str(d / "draft"), "--num-prompts", "2", "--max-new-tokens", "16", "--repeats", "1",
               "--steps", "3", "--json"])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0, out     # its error line: under a shared machine this once exited 2 (docs/timing.md)
    assert out["backend"] == f"sglang=={install.version}" and out["served_layout"] == [3, 7, 10]
    assert out["rules"] == f"runtime {install.version}, capture rule 0.5.9" and out["lossless"]
    assert abs(out["tau_gap"]) <= 0.1, out
    assert out["timing"] in ("ok", "noisy", "unusable") and len(out["speedup_interval"]) == 2
    assert any(f["fix"] == "capture-rule" for f in out["fixes"])
    # what each server resolved (its /server_info) sits beside what it was asked for
    resolved = {r["setting"]: r for r in out["settings"]["rows"] if r["setting"].startswith("resolved.")}
    assert resolved["resolved.max_running_requests"]["baseline"] == "4", resolved
    assert "resolved.mem_fraction_static" in resolved and "resolved.dtype" in resolved


@pytest.mark.live
def test_notebooks_01_05_06_on_sglang(install, tmp_path):
    """BACKEND="sglang": the original case's wiring measured on the live engine (runtime 0.5.23, capture
    rule 0.5.9), fix A served (embed, b3, b7) by the same setter, fix B retrained; the reference engine
    fed each predicted layout beside it."""
    from helpers.notebook import reports
    from helpers.notebook.lab import SMALL
    from helpers.notebook.runner import run_workbook
    d = tiny_default()
    out = tmp_path / "reports"
    params = {**SMALL, "BACKEND": "sglang", "MAX_NEW_TOKENS": 16, "TARGET": str(d / "target"),
              "DRAFT": str(d / "draft"), "RETRAINED_DRAFT": str(_retrained()),
              "PATCH_ROOT": str(tmp_path / "sglang-cache")}
    runs = run_workbook(out, params, only=["01_baseline_throughput", "05_apply_patch", "06_rebenchmark"],
                        render=False, progress=False)
    assert all(r.ok for r in runs), [(r.name, r.cell, r.error) for r in runs]
    base = reports.read_step(out, reports.BaselineStep)
    assert base.plan["layout"] == [3, 7, 10] and base.live["backend"] == f"sglang=={install.version}"
    live = {r["wiring"]: r for r in reports.read_summary(out).live}
    layouts = [live[w]["served_layout"] for w in ("deployed", "fix A", "fix B")]
    assert layouts == [[3, 7, 10], [0, 3, 7], [3, 7, 10]]
    for r in live.values():
        assert r["lossless"] and abs(r["tau_gap"]) <= 0.15, r
        assert r["rules"] == f"runtime {install.version}, capture rule 0.5.9"
    fixed = min(live["fix A"]["accept_length"], live["fix B"]["accept_length"])
    assert live["deployed"]["accept_length"] < fixed
    # notebook 06 used notebook 01's deployed rows (same pair, prompts, settings and engine) instead of
    # serving the deployed wiring again: the same pairs, so the same figures, recomputed
    summary = reports.read_summary(out)
    assert "not measured twice" in summary.headline
    assert live["deployed"]["timing_detail"]["pairs_measured"] == base.live["timing_detail"]["pairs_measured"]
    assert live["deployed"]["speedup_interval"] == base.live["speedup_interval"]
    assert summary.details["deployed"]["speedup"] == base.served["speedup"]


def _retrained():
    from _pairs import tiny_draft
    return tiny_draft((3, 7, 10))
