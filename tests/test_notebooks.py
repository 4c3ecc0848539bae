"""Every notebook: committed without outputs, parameterised, and executed here on small settings.

Each notebook runs on its own (``-k 01`` runs notebook 01; 06 runs after the 05 it reads), and
its report is read back through ``helpers.notebook.reports``, so a notebook that writes a report its
readers cannot read fails here, not in the next notebook.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import nbformat
import pytest
from _pairs import tiny_default, tiny_draft, tiny_dump, tiny_llama

from helpers.notebook import reports
from helpers.notebook.lab import SMALL
from helpers.notebook.parameters import CELL, DEFAULTS, NAMES
from helpers.notebook.runner import NOTEBOOKS, ORDER, RunRecord, index_page, run_workbook
from helpers.notebook.setup import setup_notebook

# the notebooks a notebook reads the reports of, run before it
NEEDS = {"06_rebenchmark": ["05_apply_patch"]}


@pytest.mark.parametrize("name", ORDER)
def test_committed_without_outputs_and_parameterised(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(not c.outputs and c.execution_count is None for c in code), f"{name} has outputs committed"
    tagged = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    # one parameters cell, the same in every notebook, from one place (helpers/notebook/parameters.py);
    # after editing it there: .venv/bin/python -c "from pathlib import Path; from helpers.notebook.parameters
    # import write_cells; write_cells(sorted(Path('notebooks').glob('0*.ipynb')))"
    assert tagged[0].source == CELL, f"{name}'s parameters cell is not helpers/notebook/parameters.CELL"
    assert list(DEFAULTS) == list(NAMES)
    assert (DEFAULTS["BACKEND"], DEFAULTS["DRAFT_STEPS"]) == ("reference", 5)


@pytest.mark.parametrize("name", ORDER)
def test_sets_up_through_the_helper(name):
    """The setup cell is one call, not a copy that drifts from the other five."""
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert code.count("setup_notebook(") == 1
    assert "load_pair(" not in code and "write_text(json.dumps" not in code


def _outputs(executed: Path) -> str:
    nb = nbformat.read(executed, as_version=4)
    return "".join(o.get("text", "") + json.dumps(o.get("data", {})) for c in nb.cells
                   if c.cell_type == "code" for o in c.outputs)


def _check_01(out: Path):
    step = reports.read_step(out, reports.BaselineStep)
    assert step.plan["layout"] == [3, 7, 10] and not step.problems
    assert step.served["lossless"] and step.served["layout"] == [3, 7, 10]
    # the speed ratio carries its interval and timing verdict; SMALL runs one repeat, which cannot be "ok"
    assert len(step.served["speedup_interval"]) == 2 and step.served["timing"] in ("noisy", "unusable")
    # "start from your dashboard" on a pasted SGLang /metrics scrape (totals, no per-position counts)
    text = _outputs(out / "01_baseline_throughput.ipynb")
    assert "Explanation:" in text and "no per-position counts" in text


def _check_02(out: Path):
    step = reports.read_step(out, reports.IsolateStep)
    assert step.trained.layout == [0, 3, 7] and step.served.layout == [3, 7, 10]
    assert step.source == "target capture" and step.dump is None
    rows = {r["wiring"].split(" ")[0]: r for r in step.rows}
    assert rows["served"]["full_acc_0"] < rows["trained"]["full_acc_0"]


def _check_03(out: Path):
    step = reports.read_step(out, reports.LayoutsStep)
    assert step.served_layout == [3, 7, 10] and isinstance(step.served_rank, int)
    assert step.heatmap and step.permutations and len(step.best_layout) == 3


def _check_04(out: Path):
    step = reports.read_step(out, reports.BoundaryStep)
    plus_one = {r["ids"]: r for r in step.plus_one}
    assert plus_one["draft config"]["served_layout"] == [3, 7, 10]
    assert {r["engine"] for r in step.conventions} >= {"vllm"}
    assert step.identities


def _check_05(out: Path):
    step = reports.read_step(out, reports.PatchStep)
    assert step.trained == [0, 3, 7] and step.fix_a.layout == [0, 3, 7] and not step.fix_a.errors
    assert step.fix_b and step.root


def _check_06(out: Path):
    summary = reports.read_summary(out)
    assert summary.rows and all(r["lossless"] for r in summary.rows)
    by = {r["wiring"]: r for r in summary.rows}
    assert by["deployed"]["layout"] == [3, 7, 10]
    assert by["fix A"]["layout"] == [0, 3, 7]
    assert by["fix B"]["layout"] == [3, 7, 10]
    assert [c["wiring"] for c in summary.costs] == [r["wiring"] for r in summary.rows]
    assert all(r["engine"] == "reference" and len(r["speedup_interval"]) == 2 and r["timing"] in
               ("ok", "noisy", "unusable") for r in summary.rows)
    # the summary quotes the notebook's own numbers
    assert f"{by['deployed']['tau']:.2f}" in _outputs(out / "06_rebenchmark.ipynb")
    assert (out / "summary.md").read_text().count("| deployed |") == 1
    # notebook 01 did not run here, so 06 measured the deployed wiring itself and does not claim otherwise
    assert "not measured twice" not in summary.headline


@pytest.mark.parametrize("name", ORDER)
def test_notebook_runs_on_the_embedded_pair(name, tmp_path):
    d = tiny_default()
    params = {**SMALL, "TARGET": str(d / "target"), "DRAFT": str(d / "draft"),
              "RETRAINED_DRAFT": str(tiny_draft((3, 7, 10))), "PATCH_ROOT": str(tmp_path / "sglang-cache")}
    if name.startswith("01"):    # a real SGLang scrape (tests/exports), as a user would paste theirs
        scrape = Path(__file__).parent / "exports" / "sglang" / "deployed" / "metrics_after.txt"
        params["METRICS"] = str(scrape)
    out = tmp_path / "reports"
    runs = run_workbook(out, params, only=NEEDS.get(name, []) + [name], render=False, progress=False)
    assert all(r.ok for r in runs), [(r.name, r.cell, r.error) for r in runs]
    globals()[f"_check_{name[:2]}"](out)


def test_rebenchmark_without_notebook_05_says_to_run_it(tmp_path):
    d = tiny_default()
    params = {**SMALL, "TARGET": str(d / "target"), "DRAFT": str(d / "draft")}
    runs = run_workbook(tmp_path / "reports", params, only=["06_rebenchmark"], render=False, progress=False)
    assert not runs[0].ok and "MissingReport" in runs[0].error and "run notebook 05 first" in runs[0].error


def test_workbook_on_second_family_with_inferred_layout(tmp_path, monkeypatch):
    """A Llama target with a speculators-format draft, the training record hidden: inferred."""
    from helpers.engines.sglang.install import VENV_ENV

    monkeypatch.setenv(VENV_ENV, str(tmp_path / "no-sglang-here"))    # a host without SGLang
    d = tiny_llama()
    draft = tmp_path / "draft"
    shutil.copytree(d / "draft", draft)
    (draft / "training.json").unlink()
    # BACKEND sglang on a host without it: the notebooks must say so and fall back
    params = {**SMALL, "TARGET": str(d / "target"), "DRAFT": str(draft), "BACKEND": "sglang",
              "PATCH_ROOT": str(tmp_path / "sglang-cache"), "EVAL_WINDOWS": 10, "SEARCH_WINDOWS": 4}
    out = tmp_path / "reports"
    runs = run_workbook(out, params, progress=False)
    failed = [(r.name, r.cell, r.error) for r in runs if not r.ok]
    assert not failed, failed
    assert [r.name for r in runs] == ORDER
    for name in ORDER:
        assert (out / f"{name}.ipynb").is_file() and (out / f"{name}.html").is_file()
    assert (out / "index.html").is_file()
    summary = reports.read_summary(out)
    assert summary.rows and all(r["lossless"] for r in summary.rows)
    assert summary.isolate and summary.layouts           # 02's and 03's findings quoted
    assert "no SGLang venv at" in _outputs(out / "01_baseline_throughput.ipynb")
    assert "the reference engine measures instead" in _outputs(out / "01_baseline_throughput.ipynb")
    iso = reports.read_step(out, reports.IsolateStep)
    # this tiny 8-layer draft is only weakly identifiable (z ~ 1): the notebooks must say the layout was
    # inferred and carry the search's confidence; recovery itself is tested in test_layout_search
    assert "inferred" in iso.trained.source
    assert len(set(iso.trained.layout)) == 3 and iso.trained.layout[0] == 0


def test_isolated_test_from_a_dump(tmp_path):
    """DATA: notebook 02 scores the draft from a trainer's dump, and its report says so."""
    d = tiny_default()
    params = {**SMALL, "TARGET": str(d / "target"), "DRAFT": str(d / "draft"),
              "DATA": str(tiny_dump("speculators-legacy", (0, 3, 7, 10)))}   # the seed's shape
    runs = run_workbook(tmp_path / "reports", params, only=["02_isolate_draft"], progress=False)
    assert all(r.ok for r in runs), [(r.name, r.error) for r in runs]
    iso = reports.read_step(tmp_path / "reports", reports.IsolateStep)
    assert iso.source == "dump" and iso.dump["data_format"] == "speculators-legacy"
    assert iso.trained.layout == [0, 3, 7] and iso.served.layout == [3, 7, 10]
    rows = {r["wiring"].split(" ")[0]: r for r in iso.rows}
    assert rows["served"]["full_acc_0"] < rows["trained"]["full_acc_0"]
    html = (tmp_path / "reports" / "02_isolate_draft.html").read_text()
    assert "from the dump" in html


@pytest.mark.parametrize("heads_only", [False, True])
def test_setup_describes_the_pair_it_loaded(tmp_path, capsys, heads_only):
    """Both ways notebook 02 opens print the same two lines the other notebooks print."""
    d = tiny_default()
    nb = setup_notebook(d / "target", d / "draft", "cpu", tmp_path / "r", heads_only=heads_only)
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == nb.describe()
    assert lines[-2].startswith(f"target {d / 'target'} (DeepseekV3ForCausalLM, 12 layers, hidden ")
    assert lines[-1].endswith("config ids [2, 6, 9] in eagle_config)")
    assert (tmp_path / "r").is_dir() and nb.reports == tmp_path / "r"
    assert nb.num_layers == 12 and nb.recorded_layout == (0, 3, 7) and nb.draft.cfg.num_aux == 3
    assert (nb.pair is None) == heads_only and (nb.heads is not None) == heads_only


def test_index_page_survives_a_foreign_summary(tmp_path):
    (tmp_path / "summary.json").write_text('{"rows": []}')
    page = index_page(tmp_path, [RunRecord("06_rebenchmark", 1.0, True)], {}).read_text()
    assert "summary.json: no headline" in page and "rerun notebook 06" in page
