"""The committed golden digests' table (rlparity.golden): keys, load, update."""

from __future__ import annotations

import json

import pytest

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


def test_record_writes_what_passing_per_target_cells_recorded_and_nothing_else(tmp_path):
    """`rlparity golden --record RESULTS`: a per-target tier's table from its cells' golden/<target>/<key>
    digests; an all-devices cell, a failed one and a control's are not taken; nothing recorded is exit 3."""
    import json

    from rlparity import results
    from rlparity.cell.suite import plugin
    from rlparity.commands import golden as command
    from rlparity.config import ConfigError

    from harness.factories import make_cell, make_result

    assert command.RECORDED == plugin.RECORDED
    fast = make_cell("sm90", tier="fast", dtype="bf16")
    cells = [
        make_result(fast, digests={"golden/sm90/bf16/1x2x3/seed0/logprobs": "a" * 64, "x/logprobs": "b" * 64}),
        make_result(make_cell("gfx942", tier="fast"), "failed", digests={"golden/gfx942/k": "c" * 64}),
        make_result(make_cell("cpu"), digests={"golden/cpu/k": "d" * 64}),
    ]
    out = tmp_path / "results"
    for r in cells:
        results.write(r, out / "cells" / r.cell.dirname)
    assert command.record(out, tmp_path / "golden") == 0
    assert json.loads((tmp_path / "golden" / "fast.json").read_text()) == {"sm90/bf16/1x2x3/seed0/logprobs": "a" * 64}
    assert not (tmp_path / "golden" / "exact.json").exists()
    with pytest.raises(ConfigError, match="nothing to write"):
        command.record(tmp_path / "empty", tmp_path / "golden")
