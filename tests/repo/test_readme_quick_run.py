"""README's figures for `make run` on a CPU-only machine are held to the quick matrix: the number of CPU cells
it states is the number `rlparity run --matrix quick` selects for target cpu (README said 12 while 15 ran)."""

from __future__ import annotations

import re
from pathlib import Path

from rlparity.matrix import load_axes, load_matrix
from rlparity.targets import for_targets

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()


def test_the_readme_states_the_quick_matrix_cpu_cell_count() -> None:
    stated = re.findall(r"runs the quick matrix's (\d+) CPU cells", README)
    cells = for_targets(load_matrix("quick", axes=load_axes(), backend="local").cells, ("cpu",))
    assert stated, "README no longer states how many CPU cells `make run` runs"
    assert [int(n) for n in stated] == [len(cells)] * len(stated), (stated, len(cells))
