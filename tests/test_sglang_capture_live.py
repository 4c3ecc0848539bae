"""``capture --backend sglang``: SGLang 0.5.23 from .venv-sglang started by the workbook, what the draft's fc
receives written as a dump, its slots measured against the target's own forward, read back by ``check
--measured``.

The pair is ``tests/_pairs.py``'s ``tiny_default()``: a DeepSeek-V3 target and a draft deployed with ids
[2, 6, 9]. One engine per rule (0.5.23's own, then 0.5.9's setter installed in the live runtime), two short
windows each. Skipped only when ``EAGLE3_WORKBOOK_SGLANG=0`` says this host has no SGLang on purpose; a host
where setup failed fails here. Run by hand under ``flock /tmp/engine.lock`` (one engine on the machine at a
time).
"""
from __future__ import annotations

import json
import os
import time

import pytest
from _pairs import tiny_default
from conftest import scaled

from helpers.rules.conventions import parse_engine

pytestmark = [pytest.mark.live,
              pytest.mark.skipif(os.environ.get("EAGLE3_WORKBOOK_SGLANG") == "0",
                                 reason="EAGLE3_WORKBOOK_SGLANG=0: this host runs without SGLang on purpose")]

WINDOW, RECORDS = 48, 2


@pytest.fixture(scope="module")
def install(sglang_install):
    return sglang_install


def _capture(out, *engine) -> dict:
    """The command as a user runs it; the engine it starts is stopped before it returns (or raises)."""
    from helpers.commands.capture import main
    d = tiny_default()
    t0 = time.perf_counter()
    rc = main(["--backend", "sglang", *engine, "--target", str(d / "target"), "--draft", str(d / "draft"),
               "--text", str(d / "heldout.txt"), "--out", str(out), "--window", str(WINDOW),
               "--records", str(RECORDS), "--json"])
    seconds = time.perf_counter() - t0
    assert rc == 0 and (out / "capture.json").is_file(), rc
    return {"out": out, "seconds": seconds, "record": json.loads((out / "capture.json").read_text())}


@pytest.fixture(scope="module")
def own_rule(install, tmp_path_factory):
    return _capture(tmp_path_factory.mktemp("cap") / "dump")


@pytest.fixture(scope="module")
def rule_059(install, tmp_path_factory):
    return _capture(tmp_path_factory.mktemp("cap") / "dump", "--engine", "sglang==0.5.9")


def test_own_rule_measures_the_deployed_ids_literally(own_rule, install):
    """0.5.23 takes DeepSeek ids as boundaries: the draft is fed (b2, b6, b9), measured to float noise."""
    rec = own_rule["record"]
    assert sorted(p.name for p in own_rule["out"].iterdir()) == ["capture.json", "hs_0.safetensors",
                                                                 "hs_1.safetensors"]
    assert rec["measured_boundaries"] == [2, 6, 9] == rec["predicted_layout"] == rec["slot_boundaries"]
    assert rec["layer_ids"] == [2, 6, 9] and rec["layers_to_capture"] == [2, 6, 9]
    assert rec["engine"] == f"sglang=={install.version}" and rec["capture_rule"] is None
    assert all(m["max_abs_diff"] < 1e-3 for m in rec["slot_matches"])
    assert rec["records"] == RECORDS and "fc-probe" in rec["accommodations"]
    assert own_rule["seconds"] < scaled(150)


def test_0_5_9_setter_measures_the_original_case(rule_059, install):
    """``--engine sglang==0.5.9``: 0.5.9's own setter inside the live runtime feeds (b3, b7, b10)."""
    rec = rule_059["record"]
    assert rec["measured_boundaries"] == [3, 7, 10] == rec["predicted_layout"]
    assert rec["layers_to_capture"] == [3, 7, 10] and rec["capture_rule"] == "0.5.9"
    assert rec["rules"] == f"runtime {install.version}, capture rule 0.5.9"
    assert all(m["max_abs_diff"] < 1e-3 for m in rec["slot_matches"])
    assert rule_059["seconds"] < scaled(150)


def test_dump_is_read_by_check_measured_and_opens_as_a_dump(own_rule, rule_059):
    """``check --measured`` takes each dump as the served layout: it agrees with the rule that wrote it and
    is a blocking ``measured-differs`` under the other; the dump opens as any speculators dump."""
    from helpers.investigation.dumps import open_dump
    from helpers.investigation.gate import check
    d = tiny_default()
    dumps = {"own": own_rule, "0.5.9": rule_059}
    for rules, key, agrees in (("sglang==0.5.23", "own", True), ("sglang==0.5.9", "0.5.9", True),
                               ("sglang==0.5.9", "own", False)):
        report = check(d / "draft", parse_engine(rules), target=d / "target", across_releases=False,
                       measured=dumps[key]["out"])
        kinds = [str(p.kind) for p in report.problems]
        assert tuple(report.measured_layout) == tuple(dumps[key]["record"]["measured_boundaries"])
        assert ("measured-differs" not in kinds) == agrees, (rules, key, kinds)
    dump = open_dump(rule_059["out"])
    assert dump.format == "speculators" and dump.num_slots == 3 and dump.recorded_boundaries == (3, 7, 10)
    assert len(list(dump.records())) == RECORDS
