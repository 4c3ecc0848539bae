"""Reports a person would forward: the finding and one figure first, the evidence after, logs folded,
tables in words; and the widened target the speed story is measured on computes what the original does."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import nbformat
import pytest

from helpers.errors import BadConfig
from helpers.notebook import reports
from helpers.notebook.runner import FINDING, LOG, RunRecord, index_page, report_order

REPO = Path(__file__).resolve().parents[1]


def _summary(**kw) -> reports.Summary:
    rows = [{"wiring": "deployed", "engine": "reference", "layout": [3, 7, 10], "tau": 1.09, "speedup": 0.52,
             "speedup_interval": [0.49, 0.54], "timing": "ok", "baseline_tok_s": 47.0, "spec_tok_s": 24.2,
             "lossless": True},
            {"wiring": "fix B", "engine": "reference", "layout": [3, 7, 10], "tau": 2.5, "speedup": 1.08,
             "speedup_interval": [0.91, 1.25], "timing": "ok", "baseline_tok_s": 45.7, "spec_tok_s": 48.4,
             "lossless": True}]
    return reports.Summary(headline="h", engine="sglang==0.5.9", draft_steps=3, max_new_tokens=8, prompts=2,
                           repeats=2, target="/t", draft="/d", rows=rows, costs=[], details={},
                           notes="Break-even accept length on this machine: 2.41.", **kw)


def test_the_finding_says_what_each_interval_supports():
    s = _summary()
    assert s.finding() == ("On the reference engine, against no speculation: deployed 1.09 tokens per step "
                           "at 0.52x [0.49, 0.54] (slower); fix B 2.50 tokens per step at 1.08x [0.91, 1.25] "
                           "(no measurable difference).")
    live = [{"wiring": "deployed", "backend": "llamacpp==b11434", "served_layout": [2, 6, 9],
             "accept_length": 2.77, "speedup": 1.3, "speedup_interval": [1.1, 1.5], "timing": "ok"}]
    # the real engine's rows come first, and the finding is theirs
    assert dataclasses.replace(s, live=live).finding().startswith(
        "On llamacpp==b11434, against no speculation: deployed 2.77 tokens per step at 1.30x [1.10, 1.50] "
        "(faster).")


def test_the_index_page_opens_with_the_finding_and_a_figure(tmp_path):
    s = _summary()
    reports.write_summary(tmp_path, s)
    page = index_page(tmp_path, [RunRecord("06_rebenchmark", 1.0, True)], {}).read_text()
    finding, figure, table = (page.index(s.finding()[:40]), page.index("<img class='finding-figure'"),
                              page.index("<h2>Before and after</h2>"))
    assert finding < figure < table
    assert "src='data:image/png;base64," in page     # the page needs no other file
    # what the table cannot say is folded under it
    assert page.index("<details><summary>What the table cannot say</summary>") > table
    assert s.notes in page and 'name="viewport"' in page


def _nb() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    title = nbformat.v4.new_markdown_cell("# 06 · title")
    log = nbformat.v4.new_code_cell("run()", metadata={"tags": [LOG]})
    log.outputs = [nbformat.v4.new_output("stream", name="stdout", text="deployed plan\n"),
                   nbformat.v4.new_output("display_data", data={"text/html": "<table>evidence</table>"}),
                   nbformat.v4.new_output("stream", name="stdout", text="sglang fix a: applied\n"),
                   nbformat.v4.new_output("stream", name="stderr", text="guard (warn): match\n")]
    long = nbformat.v4.new_code_cell("print()")
    text = "".join(f"l{i}\n" for i in range(30))
    long.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
    short = nbformat.v4.new_code_cell("print()")
    short.outputs = [nbformat.v4.new_output("stream", name="stdout", text="one line\n")]
    found = nbformat.v4.new_code_cell("finding()", metadata={"tags": [FINDING]})
    found.outputs = [nbformat.v4.new_output("display_data", data={"text/markdown": "**the finding**"})]
    nb.cells = [title, log, long, short, found]
    return nb


def test_the_report_view_puts_the_finding_first_and_folds_logs():
    nb = _nb()
    view = report_order(nb)
    assert [c.source for c in view.cells] == ["# 06 · title", "finding()", "run()", "print()", "print()"]
    log = view.cells[2].outputs
    # a log cell's printed lines fold into one block where they began; its tables stay in view
    assert [o.output_type for o in log] == ["display_data", "display_data"]
    assert "<details class='log'><summary>deployed plan <small>(3 lines)</small>" in log[0].data["text/html"]
    assert "guard (warn): match" in log[0].data["text/html"]               # stderr folds with it
    assert "sglang fix a: applied" in log[0].data["text/html"] and "evidence" in log[1].data["text/html"]
    assert "(30 lines)" in view.cells[3].outputs[0].data["text/html"]       # long output folds too
    assert view.cells[4].outputs[0].output_type == "stream"                  # a short one stays
    assert [c.source for c in nb.cells][1] == "run()"                        # the executed notebook unchanged
    # a title cell with an intro: the heading, the finding, then the intro (a phone's first screen finds it)
    nb.cells[0].source = "# 06 · title\n\nWhat this notebook does.\n\nAnd why."
    view = report_order(nb)
    assert [c.source for c in view.cells][:3] == ["# 06 · title", "finding()",
                                                  "What this notebook does.\n\nAnd why."]
    assert nb.cells[0].source.startswith("# 06 · title\n\nWhat")               # unchanged in the notebook


def test_tables_in_words_without_an_index():
    from helpers.notebook.tables import words

    html = words([{"wiring": "deployed", "baseline_tok_s": 47.0, "speedup_interval": [0.489, 0.539],
                   "layout": [2, 6, 9], "break_even_tau": 2.41}]).to_html()
    for w in ("baseline tok/s", "speedup [95%]", "break-even accept length", "[0.49, 0.54]",
              "(2, 6, 9)"):
        assert w in html
    assert "baseline_tok_s" not in html and "row_heading" not in html


def test_engine_fixes_are_said_once_per_engine():
    from helpers.notebook.story import fixes_once

    @dataclasses.dataclass
    class Row:
        wiring: str
        backend: str
        fixes: list

    fix = {"fix": "cpu-ops", "state": "applied", "why": "no sgl_kernel"}
    rows = [Row("deployed", "sglang==0.5.23", [fix]), Row("fix A", "sglang==0.5.23", [fix]),
            Row("fix B", "sglang==0.5.23", [fix, {"fix": "x", "state": "not needed", "why": "y"}])]
    assert fixes_once(rows) == ["sglang==0.5.23 cpu-ops: applied (no sgl_kernel) [deployed, fix A, fix B]",
                                "sglang==0.5.23 x: not needed (y) [fix B]"]


@pytest.fixture(scope="module")
def widened(tmp_path_factory):
    from helpers.model.widen import widen

    return widen(REPO / "data/tiny-llama/target", tmp_path_factory.mktemp("wide") / "x3", 3)


def test_widen_pads_the_feed_forward_blocks_and_keeps_the_function(widened):
    from safetensors import safe_open

    from helpers.model.widen import same_function

    src = json.loads((REPO / "data/tiny-llama/target/config.json").read_text())
    cfg = json.loads((widened.path / "config.json").read_text())
    assert cfg["intermediate_size"] == 3 * src["intermediate_size"]
    assert cfg["hidden_size"] == src["hidden_size"]
    with safe_open(widened.path / "model.safetensors", "pt") as s:
        up = s.get_tensor("model.layers.0.mlp.up_proj.weight")
        down = s.get_tensor("model.layers.0.mlp.down_proj.weight")
    n = src["intermediate_size"]
    assert up.shape[0] == 3 * n and down.shape[1] == 3 * n
    assert not up[n:].any() and not down[:, n:].any() and up[:n].any()
    check = same_function(widened)
    assert check.argmax_equal == check.positions == 256 and check.max_relative_diff < 1e-5
    assert (widened.path / "tokenizer.json").is_file()
    assert widened.bytes_per_token < widened.bytes_total and "3x their width" in widened.sentence()


def test_widen_reuses_its_copy_and_a_wrong_pad_is_caught(widened, tmp_path):
    from safetensors.torch import load_file, save_file

    from helpers.model.widen import Widened, same_function, widen

    stamp = (widened.path / "model.safetensors").stat().st_mtime_ns
    again = widen(widened.source, widened.path, 3)
    assert again == widened and (widened.path / "model.safetensors").stat().st_mtime_ns == stamp
    with pytest.raises(BadConfig, match="expected a factor of 1 or more"):
        widen(widened.source, tmp_path / "x0", 0)
    # a copy whose padding is not zero computes something else: the check says so
    bad = tmp_path / "bad"
    shutil.copytree(widened.path, bad)
    (bad / "same_function.json").unlink()
    state = load_file(bad / "model.safetensors")
    state["model.layers.3.mlp.up_proj.weight"][-1] = 1.0
    state["model.layers.3.mlp.gate_proj.weight"][-1] = 1.0
    state["model.layers.3.mlp.down_proj.weight"][:, -1] = 1.0
    save_file(state, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(BadConfig, match="does not compute what"):
        same_function(dataclasses.replace(widened, path=bad))
    assert isinstance(widened, Widened)


def test_the_symptom_in_one_sentence(monkeypatch):
    from types import SimpleNamespace

    import helpers.notebook.story as story

    timing, said = SimpleNamespace(), []
    monkeypatch.setattr(story, "speed_phrase", lambda t: said.append(t) or "0.52x [0.49, 0.54] (slower)")
    live = SimpleNamespace(backend="llamacpp==b11434", accept_length=1.093, timing=timing)
    assert story.symptom("(b2, b6, b9)", None, live) == (
        "Deployed as served, (b2, b6, b9), on llamacpp==b11434, the draft is accepted for 1.09 tokens "
        "per verify step; speculation against none: 0.52x [0.49, 0.54] (slower).")
    served = SimpleNamespace(tau=2.0, timing=timing)
    assert story.symptom("(b3, b7, b10)", served).startswith("Deployed as served, (b3, b7, b10), on the ref")
    assert said == [timing, timing]     # the one phrase every headline uses, with its interval and verdict
