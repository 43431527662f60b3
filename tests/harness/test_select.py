"""`--filter`: the filter language over cells (rlparity.select)."""

from __future__ import annotations

import pytest

from rlparity.cells import Cell
from rlparity.config import ConfigError
from rlparity.matrix import load_matrix
from rlparity.select import parse_filter, select


# ---- filtering ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def quick_cells() -> tuple[Cell, ...]:
    """The quick matrix's exact-tier cells of the quick shape set (the counts below; the edges cells and the fast
    tier's have their own)."""
    return tuple(c for c in load_matrix("quick").cells if c.shapes == "quick" and c.tier == "exact")


def test_filter_empty_keeps_everything(quick_cells):
    assert select(quick_cells, None) == list(quick_cells)
    assert select(quick_cells, "") == list(quick_cells)


def test_filter_key_value(quick_cells):
    got = select(quick_cells, "target=cpu")
    assert got and all(c.target == "cpu" for c in got)
    assert len(got) == len([c for c in quick_cells if c.target == "cpu"]) == 9


def test_filter_alternatives(quick_cells):
    got = select(quick_cells, "target=cpu|sm90")
    assert {c.target for c in got} == {"cpu", "sm90"}
    assert len(got) == 9 + 6


def test_filter_glob(quick_cells):
    got = select(quick_cells, "target=gfx9*")
    assert {c.target for c in got} == {"gfx90a", "gfx942", "gfx950"}
    assert {c.profile for c in select(quick_cells, "profile=*-o*")} == {"sdma-off", "tunableop-on", "gfx-override"}


def test_filter_negation(quick_cells):
    got = select(quick_cells, "target!=cpu")
    assert got and "cpu" not in {c.target for c in got}
    assert len(got) == len(quick_cells) - 9
    assert {c.target for c in select(quick_cells, "target!=gfx*|cpu")} == {"sm90"}


def test_filter_bare_glob_matches_the_id(quick_cells):
    got = select(quick_cells, "local/cpu/*/split/*")
    assert {c.id for c in got} == {c.id for c in quick_cells if c.target == "cpu" and c.placement == "split"}
    assert len(got) == 4
    assert select(quick_cells, "*/fp16/*") == [c for c in quick_cells if c.dtype == "fp16"]


def test_filter_required(quick_cells):
    optional = select(quick_cells, "required=false")
    assert {c.target for c in optional} == {"gfx1201"} and len(optional) == 8
    assert len(select(quick_cells, "required=true")) == len(quick_cells) - 8
    assert select(quick_cells, "required!=true") == optional


def test_filter_and_of_terms(quick_cells):
    for expr in ("target=cpu dtype=bf16 placement!=split", "target=cpu,dtype=bf16,placement!=split"):
        got = select(quick_cells, expr)
        assert [c.id for c in got] == [
            "local/cpu/baseline/single/bf16/quick/exact",
            "local/cpu/threads-1/single/bf16/quick/exact",
        ]


def test_filter_that_matches_nothing(quick_cells):
    assert select(quick_cells, "target=cpu placement=dual-die") == []


def test_parse_filter_terms():
    assert parse_filter("target=cpu|gfx9* tier!=fast cpu/*") == [
        ("target", False, ["cpu", "gfx9*"]),
        ("tier", True, ["fast"]),
        ("id", False, ["cpu/*"]),
    ]


@pytest.mark.parametrize("expr", ["colour=red", "arch!=gfx942", "=cpu"])
def test_filter_unknown_axis(quick_cells, expr):
    with pytest.raises(ConfigError, match="unknown axis"):
        select(quick_cells, expr)


@pytest.mark.parametrize("expr", ["target=", "dtype!="])
def test_filter_empty_value(quick_cells, expr):
    with pytest.raises(ConfigError, match="empty value"):
        select(quick_cells, expr)
