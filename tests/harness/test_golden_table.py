"""The committed golden digests' table (rlparity.golden): keys, load, update."""

from __future__ import annotations

import json

from rlparity import golden


# ---- golden ------------------------------------------------------------------------------------------------
def test_golden_key_and_update(tmp_path):
    assert golden.key("bf16", (1, 128, 4096), 0, "grad") == "bf16/1x128x4096/seed0/grad"
    assert golden.load("exact", tmp_path) == {}
    golden.update("exact", {"b": "2", "a": "1"}, tmp_path)
    p = golden.update("exact", {"b": "3", "c": "4"}, tmp_path)
    assert p == tmp_path / "exact.json"
    assert list(json.loads(p.read_text()).items()) == [("a", "1"), ("b", "3"), ("c", "4")]
    assert golden.load("exact", tmp_path) == {"a": "1", "b": "3", "c": "4"}
    assert golden.load("fast", tmp_path) == {}


def test_compute_runs_the_cell_side_and_gives_its_digests():
    """golden.compute (host, a subprocess) returns what rlparity.cell.golden computes in process."""
    from rlparity.cell import golden as cell_golden

    shapes, dtypes = [(1, 4, 64), (2, 3, 32)], ["fp32", "bf16"]
    host = golden.compute(shapes, dtypes, seed=1)
    assert host == cell_golden.compute(shapes, dtypes, seed=1)
    assert len(host) == len(shapes) * len(dtypes) * len(golden.OUTPUTS)
