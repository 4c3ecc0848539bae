"""Boundaries, layouts and capture plans: the vocabulary of docs/boundaries.md (pure Python).

Every expectation below is written from the table in docs/conventions.md, for a 12-layer target
unless stated: boundary b is the residual stream entering decoder layer b, 0 is the
embedding output and L the final state before the norm.
"""
from __future__ import annotations

import pytest

from helpers.boundaries import (
    CapturePlan,
    WiringError,
    boundary_label,
    capture_name,
    check_boundary,
    check_layout,
    layout_label,
    parse_layout,
)

L = 12


# -- labels and names ---------------------------------------------------------------------


@pytest.mark.parametrize("b, label", [(0, "embed"), (1, "b1"), (3, "b3"), (11, "b11"), (12, "final")])
def test_boundary_label(b, label):
    assert boundary_label(b, L) == label


def test_final_label_follows_num_layers():
    # b12 is the final state of a 12-layer target but an ordinary boundary of a 24-layer one.
    assert boundary_label(12, 24) == "b12"
    assert boundary_label(24, 24) == "final"


def test_layout_label_keeps_order():
    assert layout_label((0, 3, 7), L) == "(embed, b3, b7)"
    assert layout_label((7, 3, 0), L) == "(b7, b3, embed)"
    assert layout_label((3, 7, 12), L) == "(b3, b7, final)"


def test_capture_name_is_stable():
    assert capture_name(0) == "resid.0"
    assert capture_name(12) == "resid.12"


# -- parsing --------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["0,3,7", "(0, 3, 7)", " 0, 3 ,7 ", "0,3,7,", "(0,3,7)"])
def test_parse_layout_strings(text):
    assert parse_layout(text) == (0, 3, 7)


def test_parse_layout_sequences_and_order():
    assert parse_layout([7, 3, 0]) == (7, 3, 0)      # order is meaning: never sorted
    assert parse_layout((0, 3, 7)) == (0, 3, 7)
    assert parse_layout("7,3,0") == (7, 3, 0)
    assert parse_layout("12") == (12,)


@pytest.mark.parametrize("text", ["a,b,c", "0;3;7", "0,3,x", "1.5,2", "[0,3,7]", "embed,b3,b7"])
def test_parse_layout_bad_strings(text):
    with pytest.raises(WiringError, match="cannot read a layout"):
        parse_layout(text)


def test_parse_layout_error_is_a_value_error():
    # Callers that only know ValueError (argparse, widgets) still catch it.
    with pytest.raises(ValueError):
        parse_layout("nope")


def test_parse_layout_space_separated_is_not_misread():
    assert parse_layout("0 3 7") == (0, 3, 7)


# -- checking ---------------------------------------------------------------------------------


def test_check_boundary_accepts_the_whole_range():
    for b in range(L + 1):
        assert check_boundary(b, L) == b


@pytest.mark.parametrize("b", [-1, 13, 100])
def test_check_boundary_out_of_range_names_the_range(b):
    with pytest.raises(WiringError, match=r"outside 0\.\.12"):
        check_boundary(b, L)


@pytest.mark.parametrize("b", [True, 1.0, "3", None])
def test_check_boundary_rejects_non_ints(b):
    with pytest.raises(WiringError, match="must be an int"):
        check_boundary(b, L)


def test_check_layout_ok():
    assert check_layout([0, 3, 7], L) == (0, 3, 7)
    assert check_layout((3, 7, 12), L, width=3) == (3, 7, 12)
    assert check_layout(iter([12, 0]), L) == (12, 0)      # any iterable, order kept


@pytest.mark.parametrize("layout", [(0, 3, 13), (-1, 2, 6), (3, 7, 99)])
def test_check_layout_range_error(layout):
    with pytest.raises(WiringError, match=r"outside 0\.\.12"):
        check_layout(layout, L)


@pytest.mark.parametrize("layout", [(0, 3), (0, 3, 7, 12), ()])
def test_check_layout_width_error(layout):
    with pytest.raises(WiringError, match="expects 3"):
        check_layout(layout, L, width=3)


# -- CapturePlan ------------------------------------------------------------------------------------


def test_capture_plan_boundaries_include_final():
    plan = CapturePlan((7, 0, 3), L, source="test")
    assert plan.layout == (7, 0, 3)                   # concatenation order kept
    assert plan.boundaries == (0, 3, 7, 12)           # what a forward must capture, sorted
    plan = CapturePlan((3, 7, 12), L)
    assert plan.boundaries == (3, 7, 12)              # L not duplicated
    assert plan.label == "(b3, b7, final)"


def test_capture_plan_rejects_bad_layout():
    with pytest.raises(WiringError, match=r"outside 0\.\.12"):
        CapturePlan((0, 3, 13), L)
    with pytest.raises(WiringError):
        CapturePlan((-1, 2, 6), L)


def test_capture_plan_is_frozen():
    plan = CapturePlan((0, 3, 7), L)
    with pytest.raises(AttributeError):
        plan.layout = (3, 7, 10)


def test_capture_plan_to_dict():
    plan = CapturePlan((0, 3, 7), L, source="training", notes=("a", "b"))
    d = plan.to_dict()
    assert d == {"layout": [0, 3, 7], "num_layers": 12, "source": "training",
                 "label": "(embed, b3, b7)", "notes": ["a", "b"], "errors": [], "warnings": [],
                 "problems": []}
    import json
    assert json.loads(json.dumps(d)) == d             # plain JSON types only
