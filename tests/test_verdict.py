"""One verdict (helpers/investigation/verdict.py): the ways out of a mismatch, settled by format, and the
judgement.

The expected fixes below are what ``check`` (its own ``_layout_fixes``) and ``diagnose`` (``evaluate.
layout_fix``) printed before the two copies became ``verdict.ways_out``: the one algorithm must give the
same text to both, word for word.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from _pairs import tiny_llama

from helpers.investigation.verdict import (
    Settled,
    WayKind,
    by_format,
    judge,
    layout_fix,
    ways_out,
    writer_candidates,
)
from helpers.judgement import PairedTest
from helpers.rules.conventions import parse_engine

REPO = Path(__file__).resolve().parent.parent
TINY_KIMI = REPO / "data" / "tiny-kimi"
PATCH_0_5_9 = "python -m helpers patch-sglang apply --version 0.5.9 --arch DeepseekV3ForCausalLM"
IDS = "eagle_aux_hidden_state_layer_ids"

# (engine, arch, layers, trained, served, kinds, check's fix, diagnose's fix), as printed before the move
CASES = [
    ("sglang==0.5.9", "DeepseekV3ForCausalLM", 12, (0, 3, 7), (3, 7, 10), ["patch-then-ids", "retrain"],
     f"patch the engine (`{PATCH_0_5_9}`), then write ids [-1, 2, 6] in eagle_config.{IDS}; or "
     f"retrain the draft on the served layout (3, 7, 10)",
     f"patch SGLang (`{PATCH_0_5_9}`), then ids [-1, 2, 6] in eagle_config, or retrain the draft on "
     f"(3, 7, 10)"),
    ("vllm==0.32.0", "DeepseekV3ForCausalLM", 12, (0, 3, 7), (3, 7, 10), ["retrain"],
     "retrain the draft on the served layout (3, 7, 10)",
     "no ids make vllm==0.32.0 serve (0, 3, 7): `python -m helpers check` lists the ways out, or retrain the "
     "draft on (3, 7, 10)"),
    ("sglang==0.5.23", "DeepseekV3ForCausalLM", 12, (0, 3, 7), (3, 7, 10), ["write-ids", "retrain"],
     f"write ids [0, 3, 7] in eagle_config.{IDS} (no engine change); or retrain the draft on the "
     f"served layout (3, 7, 10)",
     "ids [0, 3, 7] in eagle_config, or retrain the draft on (3, 7, 10)"),
    ("sglang==0.5.9", "DeepseekV3ForCausalLM", 61, (0, 3, 31), (3, 31, 59), ["patch-then-ids", "retrain"],
     f"patch the engine (`{PATCH_0_5_9}`), then write ids [-1, 2, 30] in eagle_config.{IDS}; or "
     f"retrain the draft on the served layout (3, 31, 59)",
     f"patch SGLang (`{PATCH_0_5_9}`), then ids [-1, 2, 30] in eagle_config, or retrain the draft on "
     f"(3, 31, 59)"),
    ("sglang==0.5.9", "LlamaForCausalLM", 32, (3, 17, 30), (2, 16, 29), ["write-ids", "retrain"],
     f"write ids [2, 16, 29] in eagle_config.{IDS} (no engine change); or retrain the draft on the "
     f"served layout (2, 16, 29)",
     "ids [2, 16, 29] in eagle_config, or retrain the draft on (2, 16, 29)"),
    ("vllm", "LlamaForCausalLM", 32, (2, 16, 29), (1, 15, 28), ["write-ids", "retrain"],
     f"write ids [2, 16, 29] in top-level {IDS} (no engine change); or retrain the draft on the "
     f"served layout (1, 15, 28)",
     "ids [2, 16, 29] in the top-level key, or retrain the draft on (1, 15, 28)"),
    ("vllm", "LlamaForCausalLM", 12, (7, 3, 10), (3, 7, 10), ["reorder-fc", "write-ids", "retrain"],
     f"the draft was trained on (7, 3, 10), not in ascending order, and engines concatenate in ascending "
     f"order: permute the fc columns (helpers.investigation.fixes.reorder_fc) and write the ids; write ids "
     f"[3, 7, 10] in top-level {IDS} (no engine change); or retrain the draft on the served layout "
     f"(3, 7, 10)",
     "permute the fc columns (helpers.investigation.fixes.reorder_fc), then write ids [3, 7, 10] in the "
     "top-level key, or retrain the draft on (3, 7, 10)"),
    ("sglang==0.5.9", "DeepseekV3ForCausalLM", 12, (7, 0, 3), (3, 7, 10),
     ["reorder-fc", "patch-then-ids", "retrain"],
     f"the draft was trained on (7, 0, 3), not in ascending order, and engines concatenate in ascending "
     f"order: permute the fc columns (helpers.investigation.fixes.reorder_fc) and write the ids; patch the "
     f"engine (`{PATCH_0_5_9}`), then write ids [-1, 2, 6] in eagle_config.{IDS}; or retrain the "
     f"draft on "
     f"the served layout (3, 7, 10)",
     f"patch SGLang (`{PATCH_0_5_9}`), then ids [-1, 2, 6] in eagle_config, or retrain the draft on "
     f"(3, 7, 10)"),
    ("trtllm", "LlamaForCausalLM", 32, (2, 16, 29), (1, 15, 28), ["write-ids", "retrain"],
     "write ids [1, 15, 28] in eagle3_layers_to_capture of the speculative config (the launch options YAML, "
     "trtllm-serve --extra_llm_api_options FILE) (no engine change); "
     "or retrain the draft on the served layout (1, 15, 28)",
     "ids [1, 15, 28] in eagle3_layers_to_capture of the speculative config, or retrain the draft on "
     "(1, 15, 28)"),
]


@pytest.mark.parametrize("engine, arch, n, trained, served, kinds, listed, shortest", CASES,
                         ids=[f"{c[0]}-{c[1][:5]}-{c[2]}-{'-'.join(map(str, c[3]))}" for c in CASES])
def test_one_algorithm_gives_the_ways_out_check_and_diagnose_gave(engine, arch, n, trained, served, kinds,
                                                                  listed, shortest):
    ways = ways_out(trained, served, parse_engine(engine), arch, n)
    assert [str(k) for k in ways.kinds()] == kinds
    assert ways.listed == listed and ways.shortest == shortest
    assert layout_fix(trained, served, parse_engine(engine), arch, n) == shortest


def test_ways_out_are_data():
    """The patch's command comes from the resolver's typed problem, the ids and their key as values."""
    ways = ways_out((0, 3, 7), (3, 7, 10), parse_engine("sglang==0.5.9"), "DeepseekV3ForCausalLM", 12)
    patch = ways.of(WayKind.PATCH_THEN_IDS)
    assert patch.command == PATCH_0_5_9 and patch.ids == (-1, 2, 6) and patch.where == "eagle_config"
    assert patch.layout == (0, 3, 7) and ways.of(WayKind.RETRAIN).layout == (3, 7, 10)
    assert ways.of(WayKind.WRITE_IDS) is None
    assert json.loads(json.dumps(ways.to_list()))[0]["kind"] == "patch-then-ids"
    assert layout_fix(None, (3, 7, 10), parse_engine("vllm"), "LlamaForCausalLM", 12) is None


def test_embedded_pair_check_and_diagnose_name_the_same_ways_out():
    """data/tiny-kimi: check lists every way out, diagnose (from the pair and from its dump) names the
    shortest, both from ``ways_out``."""
    from helpers.investigation.diagnosis import diagnose
    from helpers.investigation.dump_diagnose import diagnose_dump
    from helpers.investigation.dumps import open_dump
    from helpers.investigation.gate import check
    from helpers.investigation.pair import eval_captures, load_pair

    _, arch, n, trained, served, _, listed, shortest = CASES[0]
    r = check(TINY_KIMI / "draft", parse_engine("sglang==0.5.9"), target=TINY_KIMI / "target",
              across_releases=False)
    assert next(p.fix for p in r.problems if p.kind == "layout-mismatch") == listed
    pair = load_pair(TINY_KIMI / "target", TINY_KIMI / "draft")
    caps = eval_captures(pair, max_windows=2, window=64)
    d = diagnose(pair, caps, parse_engine("sglang==0.5.9"), steps=2, progress=False)
    assert "training record" in d.wiring.trained_source and d.wiring.fix == shortest
    assert d.verdict.startswith("MISMATCH: served (3, 7, 10) ≠ trained (0, 3, 7) (the training record "
                                "(training.json))")
    dd = diagnose_dump(pair.draft, open_dump(TINY_KIMI / "dump"), engine=parse_engine("sglang==0.5.9"),
                       draft_config=pair.draft_config, arch=arch, num_layers=n, steps=2, max_records=2,
                       max_tokens=96, progress=False, recorded=pair.recorded_layout)
    assert dd.wiring.fix == shortest


# --------------------------------------------------------------------------------------
# Settled by the config's format


def _speculators_config(ids) -> dict:
    return {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3", IDS: list(ids),
            "transformer_layer_config": {"model_type": "llama"}}


def test_every_writer_agrees_and_the_ranking_confirms_it():
    """A speculators-format Llama draft, top-level ids [2, 5, 7]: every writer of that format reads them
    as (2, 5, 7). Where the ranking leaves that layout alone within noise of the best, the verdict decides
    by format, confirmed; before any ranking the format names the layout to score."""
    cands = writer_candidates(_speculators_config([2, 5, 7]), parse_engine("vllm"), "LlamaForCausalLM",
                              12, (2, 5, 7))
    assert [(c["trainer"], c["training_layout"], c["served_agrees"]) for c in cands] == [
        ("speculators==0.9.0", [2, 5, 7], True)]
    assert by_format(cands, width=3).known       # not scored yet: the layout to score
    settled = by_format(cands, width=3, ranked=[(2, 5, 7), (2, 5, 6)], confident_set=[(2, 5, 7)])
    assert settled.known and settled.layout == (2, 5, 7)
    assert settled.source.startswith("by format, confirmed by the ranking")
    v = judge((2, 5, 7), settled.layout, known=True, source=settled.source,
              confident_set=[(2, 5, 7)], cost=PairedTest(0.0, 0.01, 0.0, 40), engine=parse_engine("vllm"),
              arch="LlamaForCausalLM", num_layers=12, settled=settled)
    assert v.mismatch is False and v.line.startswith("OK: served (2, 5, 7) = trained (2, 5, 7) (by format, ")
    assert "inferred" not in v.line and "UNDECIDED" not in v.line
    # served otherwise: a mismatch by rule, with the fix
    off = judge((1, 4, 6), settled.layout, known=True, source=settled.source, engine=parse_engine("vllm"),
                arch="LlamaForCausalLM", num_layers=12, settled=settled)
    assert off.mismatch is True
    assert off.line.startswith("MISMATCH: served (1, 4, 6) ≠ trained (2, 5, 7) (by format")
    assert off.fix == "ids [2, 5, 7] in the top-level key, or retrain the draft on (1, 4, 6)"


def test_a_prior_the_ranking_cannot_confirm_is_undecided():
    """The same format layout with a neighbour within noise: the writers' reading is a prior, and the
    original case's bug is exactly ids written in the other convention, so the verdict is UNDECIDED: it
    names the writers' reading, the confidence set, what serving costs at most, and how to settle it.
    No OK, no mismatch false, whichever of the two is served."""
    cands = writer_candidates(_speculators_config([2, 5, 7]), parse_engine("vllm"), "LlamaForCausalLM",
                              12, (2, 5, 7))
    within = [(1, 4, 6), (2, 5, 7)]
    settled = by_format(cands, width=3, ranked=[(1, 4, 6), (2, 5, 7), (0, 1, 2)], confident_set=within)
    assert not settled.known and settled.layout is None
    assert settled.note.endswith("reads its ids as (2, 5, 7), a prior the ranking cannot confirm: 1 other "
                                 "layout scores within noise of it")
    for served in within:
        v = judge(served, (1, 4, 6), known=False, source="inferred by the layout search",
                  confident_set=within,
                  cost=PairedTest(0.05, 0.04, 1.25, 40), engine=parse_engine("vllm"), arch="LlamaForCausalLM",
                  num_layers=12,
                  settled=Settled((1, 4, 6), "inferred", False, settled.candidates, settled.note))
        assert v.mismatch is None and v.to_dict()["mismatch"] is None
        assert v.line.startswith(f"UNDECIDED: served {served} is in the confidence set")
        assert "a prior the ranking cannot confirm" in v.line
        assert "its accept length is at most 0.17 lower" in v.line         # 0.05 + 3 x 0.04
        assert "fixes record --draft" in v.line and "--windows" in v.line
        assert "OK" not in v.line and "=" not in v.line.split("(")[0]
    untested = by_format(cands, width=3, ranked=[(1, 4, 6)], confident_set=[(1, 4, 6)])
    assert not untested.known and "not among those scored" in untested.note


def test_format_refused_where_the_ranking_separates_it():
    """The ids may have been edited after training: a format layout the ranking scores outside the
    confidence set, or one that does not fit the fc, settles nothing."""
    cands = writer_candidates(_speculators_config([2, 5, 7]), parse_engine("vllm"), "LlamaForCausalLM",
                              12, (2, 5, 7))
    refused = by_format(cands, width=3, ranked=[(0, 3, 7), (2, 5, 7)], confident_set=[(0, 3, 7)])
    assert not refused.known and refused.layout is None and "separates" in refused.note
    assert "fc slots" in by_format(cands, width=4).note


def test_disagreeing_writers_are_listed():
    """An MLA draft in SGLang's format: SpecForge/TorchSpec/ModelOpt read [2, 30, 58] as layer outputs,
    TorchSpec's vLLM export and SpecForge's SGLang backend as boundaries, so the verdict stays inferred
    and names them."""
    cfg = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "model_type": "kimi_k2",
           "eagle_config": {IDS: [2, 30, 58], "use_aux_hidden_state": True}}
    cands = writer_candidates(cfg, parse_engine("sglang==0.5.23"), "DeepseekV3ForCausalLM", 61, (2, 30, 58))
    settled = by_format(cands, width=3)
    assert not settled.known and settled.note == (
        "the writers of its config format disagree: specforge-hf (3, 31, 59), specforge-sglang==0.5.23 "
        "(2, 30, 58), torchspec (3, 31, 59), torchspec-vllm (2, 30, 58), modelopt (3, 31, 59)")
    v = judge((2, 30, 58), (3, 31, 59), known=False, source="inferred by the layout search",
              confident_set=[(3, 31, 59), (2, 30, 58)], engine=parse_engine("sglang==0.5.23"),
              arch="DeepseekV3ForCausalLM", num_layers=61, settled=settled)
    assert v.mismatch is None and v.line.startswith("UNDECIDED")
    assert settled.note in v.line and "torchspec-vllm (2, 30, 58)" in v.line
    assert [c["trainer"] for c in v.to_dict()["candidates"]] == [c["trainer"] for c in cands]


def _without_record(tmp_path, ids, fmt: str) -> Path:
    """The tiny Llama pair's draft (trained on its record's layout), record removed, saved in ``fmt``
    with config ids ``ids``."""
    from helpers.model.checkpoint import load_draft, save_draft
    from helpers.model.target import load_target

    d = tiny_llama()
    draft = load_draft(d / "draft", target=load_target(d / "target")[0])
    draft.cfg.eagle_ids = list(ids)
    save_draft(draft, tmp_path / "draft", fmt)
    return tmp_path / "draft"


def test_a_draft_that_names_its_trainer_is_settled_alike_by_check_and_diagnose(tmp_path):
    """diagnose on a speculators-format Llama draft whose record is gone and whose ids are those it was
    trained on: its config names its trainer (speculators_version), whose rule settles the layout for
    ``check`` and the guard, so it settles it for ``diagnose`` too, even where the tiny target's layers are
    nearly interchangeable and the search leaves others within noise."""
    from helpers.investigation.diagnosis import diagnose
    from helpers.investigation.gate import check
    from helpers.investigation.pair import eval_captures, load_pair

    trained = tuple(json.loads((tiny_llama() / "draft" / "training.json").read_text())["training_boundaries"])
    pair = load_pair(tiny_llama() / "target", _without_record(tmp_path, trained, "speculators"))
    out = diagnose(pair, eval_captures(pair, max_windows=6, window=128), parse_engine("vllm"), steps=2,
                   progress=False)
    assert out.recorded_layout is None and trained in out.confident_set
    w = out.wiring
    assert w.trained_known and w.mismatch is False and out.training_layout == trained
    assert "named by the config (speculators_version" in w.trained_source
    report = check(pair.draft_dir, parse_engine("vllm"), target=tiny_llama() / "target",
                   across_releases=False)
    assert report.training_layout == trained and report.evidence == "config"
    assert out.verdict.startswith(f"OK: served {trained} = trained {trained}")


def test_ids_converted_across_conventions(tmp_path):
    """The original case's kind of bug on a pair of its own: a draft trained on (0, 2, 4) of the Llama
    target, its ids written in vLLM's convention ([0, 2, 4]: boundaries) into SGLang's format, whose
    writers and SGLang read them as layer outputs, (1, 3, 5). Everyone downstream of the config agrees,
    and everyone is wrong. On too little text the ranking cannot tell them apart: UNDECIDED, naming what
    the writers mean, the cost at most and how to settle it. On enough text the ranking puts the training
    layout first and separates the served one: MISMATCH; where it leaves several layouts within noise of the
    best, those are candidates, and the fix is to settle which, never ids aimed at one of them."""
    from helpers.investigation.diagnosis import diagnose
    from helpers.investigation.pair import eval_captures, load_pair

    trained = tuple(json.loads((tiny_llama() / "draft" / "training.json").read_text())["training_boundaries"])
    assert trained == (0, 2, 4)
    pair = load_pair(tiny_llama() / "target", _without_record(tmp_path, trained, "sglang"))
    engine = "sglang==0.5.23"
    assert tuple(pair.served(parse_engine(engine)).layout) == (1, 3, 5)
    little = diagnose(pair, eval_captures(pair, max_windows=2, window=32), parse_engine(engine),
                      steps=2, progress=False)
    assert little.wiring.mismatch is None and (1, 3, 5) in little.confident_set
    # the served layout and the writers' reading are the same layout: scored and listed once
    assert len(set(little.confident_set)) == len(little.confident_set)
    assert little.search.ranking["layout"].map(tuple).is_unique
    assert little.verdict.startswith("UNDECIDED: served (1, 3, 5) is in the confidence set")
    for said in ("reads its ids as (1, 3, 5), a prior the ranking cannot confirm", "at most",
                 "fixes record --draft", "--windows"):
        assert said in little.verdict, said
    assert "OK" not in little.verdict
    enough = diagnose(pair, eval_captures(pair, max_windows=8, window=128), parse_engine(engine),
                      steps=2, progress=False)
    assert enough.best_layout == trained and (1, 3, 5) not in enough.confident_set
    w = enough.wiring
    assert w.mismatch is True and w.significant and w.trained == trained
    assert enough.verdict.startswith("MISMATCH: served (1, 3, 5) is outside the confidence set ((0, 2, 4)")
    assert "the ranking separates that layout from the best" in enough.verdict
    if len(enough.confident_set) == 1:     # measured: the fix serves it, the command carrying the layout
        assert w.training_layout == trained and "--layout 0,2,4" in w.fix_command
    else:
        assert w.training_layout is None and w.fix_command is None and w.fix_ids is None
        assert w.fix.startswith("settle which of (0, 2, 4)") and "fixes record --draft" in w.fix
        assert enough.to_dict()["training_layout"] is None and enough.exit_code == 1


def test_every_judge_says_one_verdict_with_one_exit_code():
    """check (the files), the guard (inside the engine) and diagnose (a measured cost) each say what they
    found as one ``judgement.Verdict``: the same judgement for the same miswiring, the same exit code, and the
    fix as ``fixes deploy``'s command where ids alone serve the trained layout."""
    from helpers.investigation.gate import check
    from helpers.judgement import Judgement
    from helpers.live import guard

    engine = parse_engine("sglang==0.5.23")
    report = check(TINY_KIMI / "draft", engine, target=TINY_KIMI / "target").judged
    served = report.served                           # SGLang 0.5.23's own setter on the config's ids
    watched = guard.judge(engine="sglang 0.5.23", draft=str(TINY_KIMI / "draft"), indices=list(served),
                          highest=11, evidence=guard.record_evidence((0, 3, 7)), ids_for=lambda t: [-1, 2, 6],
                          ids_key="eagle_config.eagle_aux_hidden_state_layer_ids",
                          target=str(TINY_KIMI / "target")).judged
    costly = judge(served, (0, 3, 7), known=True, source="training record", engine=engine,
                   arch="DeepseekV3ForCausalLM", num_layers=12, cost=PairedTest(1.2, 0.05, 24.0, 24),
                   paths=(str(TINY_KIMI / "draft"), str(TINY_KIMI / "target"))).judged
    for v, who in ((report, "check"), (watched, "guard"), (costly, "diagnose")):
        assert (v.judge, v.judgement, v.served, v.trained, v.exit_code) == (
            who, Judgement.MISWIRED, served, (0, 3, 7), 1), v
        assert v.fix_command.startswith(f"python -m helpers fixes deploy --draft {TINY_KIMI / 'draft'} "), v
        assert json.loads(json.dumps(v.to_dict()))["judgement"] == "miswired"
    # a difference measured on enough text to cost nothing: the same judgement, exit 0, said so
    costless = judge((0, 3, 8), (0, 3, 7), known=True, source="training record",
                     cost=PairedTest(0.01, 0.01, 1.0, 24)).judged
    assert costless.judgement is Judgement.MISWIRED and costless.costless and costless.exit_code == 0
    assert not costless.blocking
    # nothing settles the training layout: UNKNOWN, exit 3, whoever judged
    assert guard.judge(engine="vllm 0.32.0", draft="d", indices=[2, 6, 9], highest=12,
                       evidence=None).judged.exit_code == 3
    assert judge((3, 7, 10), (3, 7, 10), known=False, source="inferred",
                 confident_set=[(3, 7, 10), (3, 7, 11)]).judged.judgement is Judgement.UNKNOWN


def test_the_judges_load_no_torch():
    """check and the guard run where a deployment runs (a CI gate, an engine's start): their verdict, its
    fixes and its statistics import no torch."""
    import subprocess
    import sys

    code = ("import sys, helpers.investigation.gate, helpers.investigation.verdict, helpers.live.guard, "
            "helpers.judgement; sys.exit('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO).returncode == 0
