"""llama.cpp as a live engine: its own converter, its guard before the launch, and ``llama-server`` itself.

The parts that need no binary run everywhere: the two launches' settings, the guard's verdicts and its
fail-closed refusal, the converter's cache. Where this machine has built ``llama-server`` (``bash
workbook.sh llamacpp``), the committed Llama pair (``data/tiny-llama``, built by ``build-default --family
llama``) is converted with llama.cpp's own converter and served: the GGUF's ``eagle3.target_layers`` are
what ``check`` predicts, the greedy output is the fp32 target's, and the accept length llama.cpp counts
for each converted draft is the reference engine's for the layout the file names, which measures
llama.cpp's rule (top-level ids only, used as boundaries) live.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import unavailable

from helpers.__main__ import main as cli
from helpers.engines.llamacpp import convert as lc
from helpers.engines.llamacpp.build import find_server
from helpers.engines.llamacpp.engine import ServerLaunch
from helpers.judgement import Judgement
from helpers.live import guard
from helpers.live.settings import argv_settings, side_by_side
from helpers.rules.conventions import parse_engine

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "data" / "tiny-llama"
KIMI = ROOT / "data" / "tiny-kimi"
ENGINE = parse_engine("llamacpp==b11434")


def test_baseline_and_speculative_launches_share_every_setting_but_the_draft():
    base = ServerLaunch(Path("/m/target.gguf"), None, steps=4, threads=2, ctx_size=512)
    spec = ServerLaunch(Path("/m/target.gguf"), Path("/m/draft.gguf"), steps=4, threads=2, ctx_size=512)
    a = argv_settings(base.argv(Path("/bin/llama-server"), 1000)[1:])
    b = argv_settings(spec.argv(Path("/bin/llama-server"), 1001)[1:])
    sbs = side_by_side(a, b)
    assert sbs.equal, sbs.differ
    assert b["--spec-type"] == "draft-eagle3" and b["--spec-draft-n-max"] == "4"
    assert b["--spec-draft-p-min"] == "0"          # a fixed-length chain, as the reference engine drafts
    assert a["--parallel"] == b["--parallel"] == "1"
    # a thread count that differs is caught
    other = ServerLaunch(Path("/m/target.gguf"), Path("/m/draft.gguf"), steps=4, threads=1, ctx_size=512)
    c = argv_settings(other.argv(Path("/bin/llama-server"), 1002)[1:])
    assert "--threads" in side_by_side(a, c).differ


def _verdicts():
    seen = []
    return seen, seen.append


def test_guard_before_llamacpp_refuses_a_gguf_that_serves_another_layout(capsys):
    seen, report = _verdicts()
    # the embedded DeepSeek pair's draft was trained on (0, 3, 7); llama.cpp's default ids [2, 6, 9]
    with pytest.raises(guard.GuardRefused) as exc:
        guard.before_llamacpp(engine=ENGINE, draft=KIMI / "draft", target_layers=[2, 6, 9], num_layers=12,
                              arch="DeepseekV3ForCausalLM", gguf="draft.gguf", how=guard.Mode.REFUSE,
                              report=report)
    assert seen[-1]["kind"] == "miswired" and seen[-1]["refused"]
    assert "(2, 6, 9)" in str(exc.value) and "(0, 3, 7)" in str(exc.value)
    assert "convert again" in seen[-1]["fix"] and "[0, 3, 7]" in seen[-1]["fix"]
    # warn: the same verdict, and the launch goes on
    v = guard.before_llamacpp(engine=ENGINE, draft=KIMI / "draft", target_layers=[0, 3, 7], num_layers=12,
                              arch="DeepseekV3ForCausalLM", gguf="draft.gguf", how=guard.Mode.WARN,
                              report=report)
    assert v.kind == Judgement.MATCH and not seen[-1]["refused"]


def test_guard_before_llamacpp_fails_closed_when_it_cannot_judge(tmp_path):
    broken = tmp_path / "draft"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    seen, report = _verdicts()
    with pytest.raises(guard.GuardRefused) as exc:
        guard.before_llamacpp(engine=ENGINE, draft=broken, target_layers=[2, 6, 9], num_layers=12,
                              arch="LlamaForCausalLM", gguf="d.gguf", how=guard.Mode.REFUSE, report=report)
    assert "refusing to serve unjudged" in str(exc.value) and len(str(exc.value).splitlines()) == 1
    assert seen[-1]["kind"] == "unjudged"
    assert guard.before_llamacpp(engine=ENGINE, draft=broken, target_layers=[2, 6, 9], num_layers=12,
                                 arch="LlamaForCausalLM", gguf="d.gguf", how=guard.Mode.WARN) is None


def test_a_config_written_again_unchanged_reuses_its_conversion(tmp_path):
    """``fixes deploy`` writes its fixed copy's JSON files again each run: the same content is the same
    conversion input (one cached GGUF, not one per run); new content or new weights are not."""
    import os
    d = tmp_path / "draft"
    d.mkdir()
    (d / "config.json").write_text('{"a": 1}')
    (d / "model.safetensors").write_bytes(b"w" * 8)
    key = lc._inputs_key(d, None, "f32", "b1")
    st = (d / "config.json").stat()
    (d / "config.json").write_text('{"a": 1}')
    os.utime(d / "config.json", ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert lc._inputs_key(d, None, "f32", "b1") == key
    (d / "config.json").write_text('{"a": 2}')
    assert lc._inputs_key(d, None, "f32", "b1") != key
    (d / "config.json").write_text('{"a": 1}')
    w = (d / "model.safetensors").stat()
    os.utime(d / "model.safetensors", ns=(w.st_atime_ns, w.st_mtime_ns + 10**9))
    assert lc._inputs_key(d, None, "f32", "b1") != key
    assert lc._inputs_key(d, None, "f16", "b1") != lc._inputs_key(d, None, "f32", "b1")


def test_converter_cache_is_complete_or_absent(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE3_WORKBOOK_CACHE", str(tmp_path / "cache"))
    tree = tmp_path / "tree"
    (tree / "conversion").mkdir(parents=True)
    (tree / "gguf-py" / "gguf").mkdir(parents=True)
    (tree / "convert_hf_to_gguf.py").write_text("print('stand-in')\n")
    assert lc.find_converter() is None
    with pytest.raises(Exception, match="no conversion"):
        shutil.rmtree(tree / "conversion")
        lc.install_converter(tree)
    assert lc.find_converter() is None          # a failed install leaves nothing that looks complete
    (tree / "conversion").mkdir()
    got = lc.install_converter(tree)
    assert lc.find_converter() == got and (got / "gguf-py" / "gguf").is_dir()


# ------------------------------------------------------------------------------------ the real engine

SERVER = find_server()
needs_server = pytest.mark.skipif(SERVER is None, reason="llama-server is not built here "
                                                         "(bash workbook.sh llamacpp)")
needs_pair = pytest.mark.skipif(not (PAIR / "build.json").is_file(), reason="data/tiny-llama is not built")


@needs_pair
def test_llamas_converter_takes_the_pair_and_writes_its_default_for_nested_ids():
    """The committed draft is SGLang-format (nested ids only): the converter writes [2, 6, 9], and check
    --gguf reads that file as llama.cpp's served layout, a mismatch with the trained (0, 3, 7)."""
    target = lc.convert(PAIR / "target", log=lambda *_: None)
    assert target.architecture == "llama"
    draft = lc.convert(PAIR / "draft", target_dir=PAIR / "target", log=lambda *_: None)
    assert draft.architecture == "eagle3" and draft.target_layers == (2, 6, 9)
    trained = tuple(json.loads((PAIR / "draft" / "training.json").read_text())["training_boundaries"])
    assert trained == (0, 3, 7)
    assert cli(["check", "--draft", str(PAIR / "draft"), "--target", str(PAIR / "target"), "--engine",
                "llamacpp==b11434", "--gguf", str(draft.gguf)]) == 1
    # the config alone predicts the same: check without the file
    assert cli(["check", "--draft", str(PAIR / "draft"), "--target", str(PAIR / "target"), "--engine",
                "llamacpp==b11434"]) == 1


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """The committed Llama pair (trained on (0, 3, 7)) served by llama-server, four ways: the deployed draft
    (SGLang format, nested ids [2, 6, 9] only), fix A (``fixes ids --engine llamacpp``: top-level [0, 3, 7],
    converted again), the same weights in speculators' format (top-level ids, its boundaries) and SGLang's
    own fix (nested [-1, 2, 6] only, which llama.cpp must ignore); each beside the reference engine fed the
    layout its GGUF names and the layouts a different rule would have served."""
    if SERVER is None or not (PAIR / "build.json").is_file():
        unavailable("llama-server or data/tiny-llama missing")
    import torch

    from helpers.engines.llamacpp import bench as lbench
    from helpers.investigation.fixes import with_engine_ids
    from helpers.investigation.pair import load_pair, plan_for
    from helpers.live.bench import LiveWiring
    from helpers.live.reference import encode_prompts, run_bench
    from helpers.model.checkpoint import load_draft, save_draft

    tmp = tmp_path_factory.mktemp("llamacpp")
    pair = load_pair(PAIR / "target", PAIR / "draft")
    fix_a = with_engine_ids(PAIR / "draft", tmp / "fix-a", [0, 3, 7], engine=ENGINE)
    sglang_fixed = with_engine_ids(PAIR / "draft", tmp / "sglang-fixed", [-1, 2, 6],
                                   engine=parse_engine("sglang"))
    speculators = load_draft(PAIR / "draft", target=pair.target)
    speculators.cfg.eagle_ids = [0, 3, 7]           # speculators' convention: the boundaries themselves
    speculators = save_draft(speculators, tmp / "speculators", "speculators")
    prompts = [json.loads(x)["prompt"] for x in (PAIR / "prompts.jsonl").read_text().splitlines()[:4]]
    ids = encode_prompts(pair.tokenizer, prompts)
    wirings = [LiveWiring("deployed", PAIR / "draft", (2, 6, 9)), LiveWiring("fix A", fix_a, (0, 3, 7)),
               LiveWiring("speculators", speculators, (0, 3, 7)),
               LiveWiring("sglang-fixed", sglang_fixed, (2, 6, 9))]
    rows = lbench.live_bench(SERVER, PAIR / "target", wirings, [p.tolist() for p in ids], steps=3,
                             max_new_tokens=48, repeats=1, rules=ENGINE, progress=False, log=lambda *_: None,
                             log_dir=tmp / "logs")
    torch.manual_seed(0)
    ref = {layout: run_bench(pair.target, pair.draft, plan_for(pair, ",".join(map(str, layout)), ENGINE), ids,
                             3, 48, 1, progress=False).tau
           for layout in ((2, 6, 9), (3, 7, 10), (0, 3, 7), (1, 4, 8))}
    return {r.wiring: r for r in rows}, ref


@needs_server
@needs_pair
def test_llamacpp_serves_the_layout_its_gguf_names_measured_against_the_reference(live):
    rows, ref = live
    assert rows["deployed"].served_layout == [2, 6, 9]      # the converter's default: nested ids ignored
    assert rows["sglang-fixed"].served_layout == [2, 6, 9]  # even nested ids that fix SGLang
    assert rows["fix A"].served_layout == [0, 3, 7]         # top-level ids, as given: no +1, 0 the embedding
    assert rows["speculators"].served_layout == [0, 3, 7]
    for name, layout in (("deployed", (2, 6, 9)), ("fix A", (0, 3, 7)), ("speculators", (0, 3, 7)),
                         ("sglang-fixed", (2, 6, 9))):
        row = rows[name]
        assert row.lossless, f"{name}: llama-server's greedy output differs from its own baseline"
        # llama.cpp's own counters give the reference engine's accept length for the file's layout
        assert abs(row.accept_length - ref[layout]) < 0.15, (name, row.accept_length, ref)
    # where another reading of the ids would serve a layout the text can tell apart, the engine is not
    # serving it: no +1 on top-level ids (1, 4, 8), and SGLang's fix read by llama.cpp would be (0, 3, 7)
    assert ref[(0, 3, 7)] - max(ref[(1, 4, 8)], ref[(2, 6, 9)]) > 0.3, ref
    for name in ("fix A", "speculators"):
        assert ref[(0, 3, 7)] - rows[name].accept_length < rows[name].accept_length - ref[(1, 4, 8)]
    assert ref[(0, 3, 7)] - rows["sglang-fixed"].accept_length > 0.3
    assert rows["fix A"].accept_length > rows["deployed"].accept_length + 0.3


@needs_server
@needs_pair
def test_each_launch_is_guarded_and_both_sides_share_their_settings(live):
    rows, _ = live
    assert rows["deployed"].guard["kind"] == "miswired" and not rows["deployed"].guard["refused"]
    assert rows["sglang-fixed"].guard["kind"] == "miswired"
    assert rows["fix A"].guard["kind"] == "match" and rows["speculators"].guard["kind"] == "match"
    for r in rows.values():
        assert r.settings["equal"], r.settings["differ"]
        assert r.backend == "llamacpp==b11434" and r.drafts > 0
        assert len(r.accepted_per_position) == 3
        c = r.costs
        assert c["decode"] > 0 and c["verify"] > 0 and c["round"] > 0 and c["break_even_tau"] > 1
        # decode and round: every request of the 4 prompts timed (one repeat: a greedy run's accept length
        # is the same in every repeat, and nothing here reads a speed); verify: once per prompt
        assert len(c["decode_ms"]) == len(c["round_ms"]) == len(c["rounds"]) == 4 and len(c["verify_ms"]) == 4
        assert all(n >= 4 for n in c["verify_tokens"]) and sum(c["rounds"]) == r.drafts


@needs_server
@needs_pair
@pytest.mark.parametrize("export", ["metrics", "completion", "log"])
def test_diagnose_metrics_reads_llamacpps_own_exports(export, tmp_path, capsys):
    """Every export a llama.cpp deployment has, from the real server: its /metrics page, its /completion
    responses (timings.draft_n, draft_n_accepted) and its log, read by diagnose --metrics into the same
    accept length as llama.cpp's own counters."""
    from helpers.engines.llamacpp.engine import LlamacppEngine
    from helpers.model.target import load_target

    target = lc.convert(PAIR / "target", log=lambda *_: None)
    draft = lc.convert(PAIR / "draft", target_dir=PAIR / "target", log=lambda *_: None)
    _, tok = load_target(PAIR / "target")
    prompts = [json.loads(x)["prompt"] for x in (PAIR / "prompts.jsonl").read_text().splitlines()[:3]]
    with LlamacppEngine(SERVER, ServerLaunch(target.gguf, draft.gguf, steps=3, threads=2, ctx_size=512),
                        log_dir=tmp_path) as e:
        bodies = [e.completion(tok(p)["input_ids"], 48) for p in prompts]
        page = e.metrics_text()
        log = e.log_path
    drafts = sum(b["timings"]["draft_n"] for b in bodies)
    accepted = sum(b["timings"]["draft_n_accepted"] for b in bodies)
    src = {"metrics": tmp_path / "metrics.txt", "completion": tmp_path / "responses.json", "log": log}[export]
    if export == "metrics":
        src.write_text(page)
    elif export == "completion":
        src.write_text(json.dumps(bodies))
    code = cli(["diagnose", "--metrics", str(src), "--draft", str(PAIR / "draft"), "--target",
                str(PAIR / "target"), "--engine", "llamacpp==b11434", "--json"])
    out = json.loads(capsys.readouterr().out)
    print(export, code, out["explanation"], out["accept_length"], out["level"], out["missing"])
    assert code in (0, 1, 3) and code == out["exit_code"], out      # 3: undetermined, said
    assert out["engine"] == "llamacpp" and out["accepted_tokens"] == accepted, out
    assert drafts > 0
    if export != "completion":      # a response counts drafted tokens, not rounds: no accept length alone
        assert out["accept_length"] >= 1.0
    assert out["served_layout"] == [2, 6, 9] and out["trained_layout"] == [0, 3, 7]


@needs_server
@needs_pair
def test_the_weight_type_and_round_are_chosen_from_this_hosts_own_servers():
    """``choose_regime`` on the real build: each weight type converted by llama.cpp's converter and timed on
    a baseline llama-server of its own, tried in order until one predicts ENOUGH, the first kept unless
    another predicts BETTER times as much; one this build cannot serve here is said in its entry (no
    weight type is assumed to load)."""
    from helpers.investigation.pair import load_pair
    from helpers.investigation.prompts import read_prompts
    from helpers.live.reference import encode_prompts
    from helpers.notebook import kernels
    pair = load_pair(PAIR / "target", PAIR / "draft", "cpu")
    ids = encode_prompts(pair.tokenizer, read_prompts(PAIR / "prompts.jsonl")[:2], "cpu")
    choice = kernels.choose_regime(SERVER, kernels.wide_target(2), pair, ids, 16, outtypes=("bf16", "f16"))
    tried = {t["outtype"]: t for t in choice.tried}
    assert list(tried)[0] == "bf16" and all(("predicted" in t) != ("error" in t) for t in tried.values())
    if "predicted" in tried["bf16"] and tried["bf16"]["predicted"] < kernels.ENOUGH:
        assert "f16" in tried                                   # too little: the next one was tried
    measured = [t for t in tried.values() if "predicted" in t]     # the first kept unless another is BETTER
    better = [t for t in measured[1:] if t["predicted"] >= kernels.BETTER * measured[0]["predicted"]]
    assert choice.outtype == max(measured[:1] + better, key=lambda t: t["predicted"])["outtype"]
    assert 1 <= choice.steps <= kernels.MAX_STEPS
    assert choice.sentence().startswith(f"{choice.outtype} weights")


@needs_server
@needs_pair
def test_notebooks_01_05_06_on_llamacpp(tmp_path):
    """BACKEND="llamacpp" on the Llama pair: the deployed draft served by llama-server as its converter wrote
    it (2, 6, 9), fix A (top-level ids, converted again) serving the trained (0, 3, 7), fix B retrained on
    (2, 6, 9); llama.cpp's accept length beside the reference engine's for each. The same run has the
    KERNELS chapter (a target widened 2x here, 96x by default): notebook 01 measures the deployed wiring,
    notebook 06 reuses that row and adds fix A (``fixes deploy``'s copy) and fix B, each with llama.cpp's
    round costs, and both findings and the summary's table lead with it."""
    from helpers.notebook import kernels, reports
    from helpers.notebook.lab import SMALL
    from helpers.notebook.runner import run_workbook
    out = tmp_path / "reports"
    params = {**SMALL, "BACKEND": "llamacpp", "ENGINE_VERSION": "llamacpp==b11434", "MAX_NEW_TOKENS": 32,
              "TARGET": str(PAIR / "target"), "DRAFT": str(PAIR / "draft"),
              "RETRAINED_DRAFT": str(PAIR / "draft-retrained"), "KERNELS": "llamacpp x2 f16"}
    runs = run_workbook(out, params, only=["01_baseline_throughput", "05_apply_patch", "06_rebenchmark"],
                        render=False, progress=False)
    assert all(r.ok for r in runs), [(r.name, r.cell, r.error) for r in runs]
    base = reports.read_step(out, reports.BaselineStep)
    assert base.plan["layout"] == [2, 6, 9] and base.live["backend"] == "llamacpp==b11434"
    live = {r["wiring"]: r for r in reports.read_summary(out).live}
    assert [live[w]["served_layout"] for w in ("deployed", "fix A", "fix B")] == [[2, 6, 9], [0, 3, 7],
                                                                                  [2, 6, 9]]
    for r in live.values():
        assert r["lossless"] and abs(r["tau_gap"]) <= 0.15, r
    assert live["deployed"]["accept_length"] < min(live["fix A"]["accept_length"],
                                                   live["fix B"]["accept_length"])
    # the chapter on llama.cpp's kernels: 01's deployed row reused by 06, fixes measured there
    k01 = kernels.KernelsRun.from_dict(base.kernels)
    summary = reports.read_summary(out)
    k06 = kernels.KernelsRun.from_dict(summary.kernels)
    assert [r.wiring for r in k01.rows] == ["deployed"] and k06.settings["widen"] == 2
    # the round's length chosen once, on this host, in notebook 01, and taken by notebook 06
    assert k01.choice and k06.choice == k01.choice, k01.lines
    assert 1 <= k01.choice["steps"] <= kernels.MAX_STEPS
    assert k06.settings["steps"] == k01.choice["steps"] == k06.rows[1].steps
    assert "chosen from this host's costs" in kernels.regime(k06)
    assert [r.wiring for r in k06.rows] == ["deployed", "fix A", "fix B"]
    assert k06.rows[0].to_dict() == k01.rows[0].to_dict()           # measured once, in notebook 01
    assert [r.served_layout for r in k06.rows] == [[2, 6, 9], [0, 3, 7], [2, 6, 9]]
    for r in k06.rows:
        assert r.lossless and abs(r.tau_gap) <= 0.15 and r.costs["break_even_tau"] > 1.0, r
        assert kernels.prediction(r) == pytest.approx(r.accept_length / r.costs["break_even_tau"])
    table = summary.table()
    assert table[0]["engine"].endswith("tiny-llama x2 f16") and [r["wiring"] for r in table[:3]] == \
        ["deployed", "fix A", "fix B"]
    assert summary.finding().startswith("On llama.cpp b11434")
    assert summary.headline.startswith("On the kernels of llama.cpp b11434")
    assert "every decode token" not in kernels.regime(k06) and "decode steps" in kernels.regime(k06)
    first = json.loads((out / "01_baseline_throughput.ipynb").read_text())
    finding = next(c for c in first["cells"] if "finding" in c["metadata"].get("tags", []))
    assert "deployed (2, 6, 9) runs" in json.dumps(finding["outputs"])


@needs_server
@needs_pair
def test_bench_guard_refuse_stops_the_miswired_draft_before_llama_server_starts(capsys):
    """``--guard refuse``: the deployed GGUF serves (2, 6, 9), trained (0, 3, 7): exit 2, one line, and no
    speculative llama-server is left behind."""
    from helpers.live import stopping

    code = cli(["bench", "--backend", "llamacpp", "--target", str(PAIR / "target"), "--draft",
                str(PAIR / "draft"), "--guard", "refuse", "--steps", "3", "--num-prompts", "1",
                "--max-new-tokens", "8", "--repeats", "2"])
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(err) == 1, err
    assert "llama-server not started" in err[0] and "(2, 6, 9)" in err[0] and "(0, 3, 7)" in err[0]
    assert not stopping.live()


def test_a_folder_the_converter_refuses_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    """The tests' byte-level Llama pair: llama.cpp's converter does not know its pre-tokenizer."""
    if lc.find_converter() is None:
        unavailable("llama.cpp's converter is not in the cache (bash workbook.sh llamacpp)")
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "target"
    shutil.copytree(KIMI / "target", folder)       # a DeepSeek-V3 target with a byte-level BPE
    with pytest.raises(lc.ConversionRefused) as exc:
        lc.convert(folder, out=tmp_path / "t.gguf", log=lambda *_: None)
    assert len(str(exc.value).splitlines()) == 1 and str(folder) in str(exc.value)
    assert not (tmp_path / "t.gguf").exists() and not list(tmp_path.glob(".*.partial"))


@needs_server
@needs_pair
def test_llama_servers_greedy_output_is_the_workbooks_fp32_target():
    """An f32 GGUF of the bf16-rounded target: llama.cpp's greedy continuation, id for id, is the one the
    workbook's fp32 Hugging Face target produces."""
    import torch

    from helpers.engines.llamacpp.engine import LlamacppEngine
    from helpers.model.engine import baseline_generate
    from helpers.model.target import load_target

    target = lc.convert(PAIR / "target", log=lambda *_: None)
    model, tok = load_target(PAIR / "target")
    prompts = [json.loads(x)["prompt"] for x in (PAIR / "prompts.jsonl").read_text().splitlines()[:3]]
    ids = [tok(p)["input_ids"] for p in prompts]
    with LlamacppEngine(SERVER, ServerLaunch(target.gguf, None, threads=2, ctx_size=512)) as e:
        got = e.generate(ids, 48).tokens
    want = [baseline_generate(model, torch.tensor(i), 48).tokens for i in ids]
    assert got == want
