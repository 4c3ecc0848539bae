"""Notebook 03's layout explorer, driven through its callbacks as a user's clicks would drive it."""
from __future__ import annotations

import base64
import re

import pytest
from _pairs import tiny_default

from helpers.investigation.evaluate import evaluate_layout
from helpers.investigation.pair import eval_captures, load_pair
from helpers.notebook.widgets import LayoutExplorer
from helpers.progress import interactive_frontend, text_bars_when_headless

SERVED, TRAINED, OTHER = (3, 7, 10), (0, 3, 7), (0, 3, 9)


@pytest.fixture(scope="module")
def pair():
    return load_pair(tiny_default() / "target", tiny_default() / "draft")


@pytest.fixture(scope="module")
def caps(pair):
    return eval_captures(pair, max_windows=4)


@pytest.fixture()
def explorer(pair, caps):
    return LayoutExplorer(pair.draft, caps, SERVED, steps=2, presets={"served": SERVED, "trained": TRAINED},
                          max_windows=4)


def _cells(html_text: str) -> dict[tuple[str, str], str]:
    """(layout, metric) -> the text in that table cell, read from the HTML the panel shows."""
    return {(lay, m): v for lay, m, v in
            re.findall(r"<td[^>]*data-layout='([\d,]+)' data-metric='(\w+)'>([^<]*)</td>", html_text)}


def _png(img_html: str) -> bytes:
    return base64.b64decode(re.search(r"base64,([A-Za-z0-9+/=]+)", img_html).group(1))


def test_presets_are_pinned_with_their_own_figures(explorer, pair, caps):
    cells = _cells(explorer.table.value)
    for lay in (SERVED, TRAINED):
        want = evaluate_layout(pair.draft, caps, lay, 2, max_windows=4)
        key = ",".join(map(str, lay))
        for j in range(2):
            assert cells[(key, f"full_acc_{j}")] == f"{want.full_acc[j]:.3f}"
            assert cells[(key, f"cond_acc_{j}")] == f"{want.cond_acc[j]:.3f}"
        assert cells[(key, "sim_accept_length")] == f"{want.sim_accept_length:.2f}"
        assert cells[(key, "ce")] == f"{want.ce:.3f}"
    # the trained layout is the better input, and the table says so
    assert float(cells[("0,3,7", "full_acc_0")]) > float(cells[("3,7,10", "full_acc_0")])
    assert float(cells[("0,3,7", "ce")]) < float(cells[("3,7,10", "ce")])


def test_hand_picked_layout_joins_and_stays(explorer):
    before = _png(explorer.plot.value)
    for slot, b in zip(explorer.slots, OTHER):
        slot.value = b
    rows = explorer.rows()
    assert [r["layout"] for r in rows] == [SERVED, TRAINED, OTHER]  # presets pinned first, dropdowns last
    assert rows[-1]["current"] and rows[-1]["names"] == []
    assert _png(explorer.plot.value) != before                        # the plot redrew with the new column
    explorer.add_button.click()
    explorer.buttons[0].click()                                       # back to the served preset
    assert explorer.layout == SERVED
    assert [r["layout"] for r in explorer.rows()] == [SERVED, TRAINED, OTHER]
    assert explorer.rows()[2]["names"] == ["added"] and not explorer.rows()[2]["current"]
    assert "0,3,9" in explorer.table.value
    explorer.clear_button.click()
    assert [r["layout"] for r in explorer.rows()] == [SERVED, TRAINED]


def test_steps_slider_rescores_every_column(explorer, pair, caps):
    explorer.add_current()  # the served preset is already pinned: nothing is added twice
    assert len(explorer.rows()) == 2
    n = len(explorer.history)
    explorer.steps_slider.value = 3
    assert len(explorer.history) == n + 1
    cells = _cells(explorer.table.value)
    want = evaluate_layout(pair.draft, caps, TRAINED, 3, max_windows=4)
    assert cells[("0,3,7", "cond_acc_2")] == f"{want.cond_acc[2]:.3f}"
    assert ("3,7,10", "full_acc_2") in cells


def test_snapshot_is_static_html_with_the_plot(explorer):
    snap = explorer.snapshot_html()
    assert "layout-comparison" in snap and "<script" not in snap
    assert _png(snap)[:8] == b"\x89PNG\r\n\x1a\n"
    assert _cells(snap) == _cells(explorer.table.value)


def test_no_widget_frontend_outside_a_kernel():
    assert interactive_frontend() is False
    assert text_bars_when_headless() is False   # a plain process keeps tqdm.auto as it is
