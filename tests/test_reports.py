"""The step reports: each record survives its file, and a missing or foreign file says what to run."""
from __future__ import annotations

import dataclasses
import json

import pytest

from helpers.errors import InputError
from helpers.live.reference import BenchResult
from helpers.notebook import reports
from helpers.notebook.reports import (
    BaselineStep,
    BoundaryStep,
    FixA,
    IsolateStep,
    LayoutsStep,
    MissingReport,
    PatchStep,
    PlanRef,
    ReportError,
    Summary,
)


def _bench(label: str, layout=(3, 7, 10), tau=1.4) -> BenchResult:
    return BenchResult(layout=layout, label=label, steps=3, baseline_tok_s=80.0, spec_tok_s=60.0, tau=tau,
                       accept_rate=0.2, lossless=True, lossless_per_prompt=[True, True], histogram=[3, 1],
                       position_acceptance=[0.3, 0.1, 0.0], verify_steps=40, tokens=48, repeats=1,
                       decode_ms=12.0, verify_ms=14.0, draft_step_ms=0.6,
                       per_prompt=[{"prompt": 0, "speedup": 0.7}, {"prompt": 1, "speedup": 1.1}])


RECORDS = {
    "01": BaselineStep(plan={"layout": [3, 7, 10], "source": "sglang==0.5.9"}, problems=[],
                       served=_bench("served").to_dict(), seed_break_even_tau=2.535),
    "02": IsolateStep(trained=PlanRef([0, 3, 7], "training record"),
                      served=PlanRef([3, 7, 10], "sglang==0.5.9", []),
                      rows=[{"wiring": "trained (embed, b3, b7)", "full_acc_0": 0.8}], tokens=512,
                      source="target capture"),
    "02-dump": IsolateStep(trained=PlanRef([0, 3, 7], "dump"), served=PlanRef([3, 7, 10], "engine", ["x"]),
                           rows=[], tokens=10, source="dump",
                           dump={"data_format": "speculators"}),
    "03": LayoutsStep(best_layout=[0, 3, 7], runner_up=None, margin=None, margin_acc=None, z=None,
                      mode="exhaustive", evaluations=1, seconds=0.5, tokens=100, ranking=[{"rank": 1}],
                      notes=[], served_layout=[3, 7, 10], served_rank=None, heatmap=[], permutations=[]),
    "04": BoundaryStep(wiring={"version": "0.5.9"}, plus_one=[{"ids": "draft config"}], identities=[],
                       conventions=[{"engine": "vllm"}]),
    "05": PatchStep(engine="sglang==0.5.9", root="/tmp/sg", trained=[0, 3, 7],
                    fix_a=FixA("/r/draft-fixA", [-1, 2, 6], [0, 3, 7], []), before={"errors": ["e"]},
                    fix_b=None, fc_reordered=None),
    "05-no-fix": PatchStep(engine="vllm", root=None, trained=[0, 3, 7], fix_a=None, before={},
                           fix_b="/r/b", fc_reordered="/r/reordered"),
    "06": Summary(headline="Deployed (b3, b7, b10): accept length 1.40.", engine="sglang==0.5.9",
                  draft_steps=3, max_new_tokens=24, prompts=2, repeats=1, target="/t", draft="/d",
                  rows=[{"wiring": "deployed", "layout": [3, 7, 10]}], costs=[{"wiring": "deployed"}],
                  details={"deployed": {"tau": 1.4}}, isolate={"trained": {"layout": [0, 3, 7]}}),
}


@pytest.mark.parametrize("which", sorted(RECORDS))
def test_round_trip(tmp_path, which):
    record = RECORDS[which]
    path = reports.write_step(tmp_path, record)
    assert path == tmp_path / type(record).FILE
    assert reports.read_step(tmp_path, type(record)) == record
    assert not list(tmp_path.glob(".*.tmp"))


def test_file_keeps_the_keys_readers_use(tmp_path):
    """Other tools read these by key: the JSON names are the notebooks' historical ones."""
    patch = json.loads(reports.write_step(tmp_path, RECORDS["05"]).read_text())
    assert list(patch) == ["engine", "root", "trained", "fixA", "before", "fixB", "fc_reordered"]
    assert patch["fixA"] == {"draft": "/r/draft-fixA", "ids": [-1, 2, 6], "layout": [0, 3, 7],
                             "errors": []}
    summary = json.loads(reports.write_summary(tmp_path, RECORDS["06"]).read_text())
    assert list(summary) == ["headline", "engine", "draft_steps", "max_new_tokens", "prompts", "repeats",
                             "target", "draft", "rows", "costs", "details", "02_isolate"]  # no 03: no key
    iso = json.loads(reports.write_step(tmp_path, RECORDS["02"]).read_text())
    assert "dump" not in iso and iso["trained"] == {"layout": [0, 3, 7], "source": "training record"}
    assert iso["served"]["problems"] == []


def test_no_nan_in_the_files(tmp_path):
    step = dataclasses.replace(RECORDS["03"], margin=float("nan"), z=float("inf"))
    text = reports.write_step(tmp_path, step).read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert reports.read_step(tmp_path, LayoutsStep).margin is None


def test_missing_report_names_the_notebook_to_run(tmp_path):
    with pytest.raises(MissingReport, match=r"05_patch\.json is missing.*run notebook 05 first"):
        reports.read_step(tmp_path, PatchStep)
    with pytest.raises(InputError, match="run notebook 06 first"):
        reports.read_summary(tmp_path)
    assert reports.read_step_if_any(tmp_path, PatchStep) is None


def test_not_json(tmp_path):
    (tmp_path / "05_patch.json").write_text("{\"engine\": ")
    with pytest.raises(ReportError, match=r"05_patch\.json is not valid JSON.*rerun notebook 05"):
        reports.read_step(tmp_path, PatchStep)


def test_wrong_shape_lists_every_problem(tmp_path):
    data = reports.to_json(RECORDS["05"])
    del data["before"]
    data["trained"] = "0,3,7"
    data["fixA"] = {"draft": 3, "ids": [-1, 2, 6], "layout": [0, 3, 7], "errors": []}
    (tmp_path / "05_patch.json").write_text(json.dumps(data))
    with pytest.raises(ReportError) as err:
        reports.read_step(tmp_path, PatchStep)
    msg = str(err.value)
    assert "05_patch.json" in msg and "no before" in msg and "trained is '0,3,7', expected list[int]" in msg
    assert "fixA.draft is 3, expected str" in msg and "notebook 05 (05_apply_patch)" in msg
    (tmp_path / "05_patch.json").write_text("[1, 2]")
    with pytest.raises(ReportError, match="holds list, expected the JSON object notebook 05"):
        reports.read_step(tmp_path, PatchStep)
    # a malformed optional report still fails: it is not taken for a notebook that did not run
    (tmp_path / "02_isolate.json").write_text("{}")
    with pytest.raises(ReportError, match="no trained, served, rows, tokens, source"):
        reports.quoted_steps(tmp_path)


def test_bools_are_not_numbers(tmp_path):
    data = reports.to_json(RECORDS["02"]) | {"tokens": True}
    with pytest.raises(ReportError, match="tokens is True, expected int"):
        reports.from_json(IsolateStep, data, "02_isolate.json")


def test_bench_rows_become_the_summary_tables():
    res = _bench("deployed")
    row = res.row("deployed")
    assert row["wiring"] == "deployed" and row["layout"] == [3, 7, 10]
    assert row["speedup"] == 0.75 and row["slower_prompts"] == 1 and row["prompts"] == 2
    assert row["speedup_per_tau"] == round(0.75 / 1.4, 3) and row["break_even_tau"] == round(1.4 / 0.75, 3)
    rows, costs = reports.bench_tables([row, _bench("fix A", (0, 3, 7), 2.5).row("fix A")])
    assert [list(r) for r in rows] == [["wiring", "engine", "layout", "baseline_tok_s", "spec_tok_s",
                                        "speedup", "speedup_interval", "timing", "tau", "accept_rate",
                                        "speedup_per_tau", "lossless"]] * 2
    assert list(costs[0]) == ["wiring", "decode_ms", "verify_ms", "draft_step_ms", "draft_cost_ratio",
                              "predicted_speedup", "measured_speedup", "break_even_tau", "slower_prompts"]
    assert costs[0]["measured_speedup"] == row["speedup"] and costs[1]["wiring"] == "fix A"


def test_summary_quotes_02_and_03_and_writes_markdown(tmp_path):
    reports.write_step(tmp_path, RECORDS["02"])
    reports.write_step(tmp_path, RECORDS["03"])
    quoted = reports.quoted_steps(tmp_path)
    assert set(quoted["isolate"]) == {"trained", "served", "rows"}
    assert quoted["layouts"] == {"best_layout": [0, 3, 7], "margin": None, "z": None, "served_rank": None}
    rows, costs = reports.bench_tables([_bench("deployed").row("deployed")])
    summary = dataclasses.replace(RECORDS["06"], rows=rows, costs=costs, **quoted)
    reports.write_summary(tmp_path, summary)
    assert reports.read_summary(tmp_path) == summary
    md = (tmp_path / "summary.md").read_text()
    assert summary.headline in md
    assert "| deployed | reference | [3, 7, 10] | 1.40 | - | 0.75x | unusable | 80.0 | 60.0 | yes |" in md


def test_the_table_comes_first_and_names_each_rows_engine(tmp_path):
    """summary.md and the index page open with the wiring x engine table (accept length, speedup with its
    interval, timing verdict), the engine named in each row; the headline follows it."""
    from helpers.notebook.runner import RunRecord, index_page

    rows, costs = reports.bench_tables([_bench("deployed").row("deployed"), _bench("fix A", (0, 3, 7), 2.6)
                                        .row("fix A")])
    summary = dataclasses.replace(RECORDS["06"], rows=rows, costs=costs)
    reports.write_summary(tmp_path, summary)
    md = (tmp_path / "summary.md").read_text()
    assert md.index("| wiring | engine |") < md.index(summary.headline)
    page = index_page(tmp_path, [RunRecord("06_rebenchmark", 1.0, True)],
                      {"ENGINE_VERSION": "sglang==0.5.9"}).read_text()
    assert page.index("<th>engine</th>") < page.index(summary.headline[:40])
    assert page.count("<td>reference</td>") == 2 and "speedup [95%]" in page
    assert "served layouts by the rules of <code>sglang==0.5.9</code>" in page
    # a live engine's rows sit beside the reference engine's, its runtime and rules named
    live = [{"wiring": "deployed", "backend": "sglang==0.5.23", "rules": "runtime 0.5.23, capture rule 0.5.9",
             "served_layout": [3, 7, 10], "accept_length": 2.1, "accepted_per_position": [0.37, 0.24],
             "speedup": 1.2, "speedup_interval": [0.82, 1.76], "timing": "ok", "baseline_tok_s": 23.1,
             "spec_tok_s": 24.2, "lossless": True}]
    reports.write_summary(tmp_path, dataclasses.replace(summary, live=live))
    md = (tmp_path / "summary.md").read_text()
    assert ("| deployed | sglang==0.5.23 (runtime 0.5.23, capture rule 0.5.9) | [3, 7, 10] | 2.10 | "
            "37%, 24% | 1.20x [0.82, 1.76] | ok | 23.1 | 24.2 | yes |") in md
    assert md.index("| deployed | sglang==0.5.23") < md.index("| deployed | reference")
    # the prose under the table is the notes (what the table cannot say), not every row's figures again
    noted = dataclasses.replace(summary, live=live, notes="Faster than the baseline, the whole interval "
                                "above 1: fix A on the reference engine. Break-even accept length: 1.62.")
    reports.write_summary(tmp_path, noted)
    md = (tmp_path / "summary.md").read_text()
    assert noted.notes in md and noted.headline not in md and reports.read_summary(tmp_path) == noted
    page = index_page(tmp_path, [RunRecord("06_rebenchmark", 1.0, True)], {}).read_text()
    assert noted.notes in page and noted.headline not in page
    # names read as text (left), figures down their column (right)
    assert "<td>sglang==0.5.23 (runtime 0.5.23, capture rule 0.5.9)</td>" in page
    assert "<td class='n'>1.20x [0.82, 1.76]</td>" in page


def test_progress_bars_are_not_painted_as_errors():
    import nbformat

    from helpers.notebook.runner import progress_as_text

    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("x")
    texts = ["sglang deployed: 100%|####| 12/12 [00:40<00:00]", "starting SGLang 0.5.23 (deployed): 00:25\n",
             "UserWarning: a real warning\n"]
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text=t) for t in texts]
    nb.cells.append(cell)
    assert progress_as_text(nb) == 2 and [o["name"] for o in cell.outputs] == ["stdout", "stdout", "stderr"]
