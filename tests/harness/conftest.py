"""Fixtures of the harness tests."""

from __future__ import annotations

import pytest

from rlparity.cells import Cell
from rlparity.matrix import load_matrix
from rlparity.select import select

from harness.scripted import CPU_CELL_ID, CPU_FILTER


@pytest.fixture(scope="module")
def cpu_cell() -> Cell:
    (cell,) = select(load_matrix("quick").cells, CPU_FILTER)
    assert cell.id == CPU_CELL_ID
    return cell
