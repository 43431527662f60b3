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


def test_golden_key_names_another_workloads_shapes():
    assert golden.shape_id((2, 32, 4099)) == "2x32x4099"
    assert golden.key("fp32", (2, 32, 4099), 0, "grad", "edges") == "fp32/edges:2x32x4099/seed0/grad"


def test_what_a_per_target_cell_records_is_what_record_writes(tmp_path):
    """The round trip of a per-target tier's digests: check_committed (the cell side) records each under
    golden.recorded_name in result.json, `rlparity golden --record RESULTS` writes them to the tier's table under
    the target; an all-devices cell, a failed one and a control's are not taken; nothing recorded is exit 3."""
    from rlparity import results
    from rlparity.cell.suite.plugin import Recorder, check_committed
    from rlparity.commands import golden as command
    from rlparity.config import ConfigError

    from harness.factories import make_cell, make_result

    fast = make_cell("sm90", tier="fast", dtype="bf16")
    key = golden.key("bf16", (1, 2, 3), 0, "logprobs")
    rec = Recorder()
    with pytest.raises(pytest.skip.Exception, match="no digest recorded for sm90"):  # nothing committed for it yet
        check_committed(fast, rec, "1x2x3", {"logprobs": key}, {"logprobs": "a" * 64})
    assert golden.recorded(rec.digests) == {f"sm90/{key}": "a" * 64}
    cells = [
        make_result(fast, digests={**rec.digests, "x/logprobs": "b" * 64}),
        make_result(make_cell("gfx942", tier="fast"), "failed", digests={"golden/gfx942/k": "c" * 64}),
        make_result(make_cell("cpu"), digests={"golden/cpu/k": "d" * 64}),
    ]
    out = tmp_path / "results"
    for r in cells:
        results.write(r, out / "cells" / r.cell.dirname)
    assert command.record(out, tmp_path / "golden") == 0
    assert json.loads((tmp_path / "golden" / "fast.json").read_text()) == {f"sm90/{key}": "a" * 64}
    assert not (tmp_path / "golden" / "exact.json").exists()
    with pytest.raises(ConfigError, match="nothing to write"):
        command.record(tmp_path / "empty", tmp_path / "golden")
