"""Cell results: result.json round trips, statistics over gated comparisons, the helpers, cells as dicts."""

from __future__ import annotations

import json
import math
import re

import pytest

from rlparity import results
from rlparity.backends import base
from rlparity.cells import Cell
from rlparity.config import ConfigError
from rlparity.matrix import load_matrix
from rlparity.results import CellResult

from harness.factories import (
    comparison,
    make_cell,
    make_result,
    write_log,
)

# ---- results ---------------------------------------------------------------------------------------------
COMPARISONS = [
    comparison("1x128x4096 rollout vs training", True),
    comparison(
        "stock log_softmax", False, count=900, max_abs=0.5, max_ulp=99999, first_index=[0, 0], informational=True
    ),
    comparison("1x128x4096 alone vs batch", False, count=3, max_abs=2.5e-7, max_ulp=2, first_index=[0, 17]),
    comparison("1x128x4096 golden grad", False, count=-1),
    comparison("4x64x32000 repeat 1 logprobs", False, count=5, max_abs=1e-6, max_ulp=8, first_index=[3, 1]),
]


def full_result() -> CellResult:
    return CellResult(
        make_cell("gfx942", "sdma-off", env={"HSA_ENABLE_SDMA": "0"}),
        "failed",
        "bitwise mismatch in 1x128x4096 alone vs batch",
        fingerprint={"torch": {"version": "2.13"}, "env": {"HSA_ENABLE_SDMA": "0"}},
        fingerprint_hash="f" * 64,
        digests={"1x128x4096/logprobs": "a" * 64, "1x128x4096/grad": "b" * 64},
        comparisons=[dict(c) for c in COMPARISONS],
        timings={"wall_s": 1.5, "tests": {"test_x": 0.5}},
        output_tail="",
        started="2025-01-01T00:00:00+00:00",
        finished="2025-01-01T00:00:02+00:00",
    )


def test_result_round_trip(tmp_path):
    res = full_result()
    path = results.write(res, tmp_path / "cells" / res.cell.dirname)
    assert path.name == "result.json" and not list(path.parent.glob("*.tmp"))
    back = results.read(path.parent)
    assert back == res
    assert back.cell == res.cell and back.cell.shape_list == ((1, 128, 4096),)
    assert results.read_all(tmp_path) == [res]
    on_disk = json.loads(path.read_text())
    assert on_disk["schema"] == results.SCHEMA and on_disk["required"] is True
    assert on_disk["mismatches"] == 9 and on_disk["max_ulp"] == 8
    assert on_disk["cell"]["id"] == res.cell.id


def test_result_statistics_use_only_gated_comparisons():
    res = full_result()
    assert res.mismatches == 3 + 1 + 5  # a digest comparison (count -1) counts 1; the stock control not at all
    assert res.max_abs == 1e-6
    assert res.max_ulp == 8
    assert res.first_mismatch == {"comparison": "1x128x4096 alone vs batch", "index": [0, 17]}
    assert res.stock_differ == (1, 1)


def test_result_statistics_when_only_informational_differs():
    res = make_result(
        make_cell(),
        comparisons=[comparison("a", True), comparison("stock", False, 10, 3.0, 77, [1], informational=True)],
    )
    assert (res.mismatches, res.max_abs, res.max_ulp, res.first_mismatch) == (0, 0.0, 0, None)


def test_result_infinite_max_abs_round_trips(tmp_path):
    res = make_result(make_cell(), "failed", comparisons=[comparison("nan row", False, 1, math.inf, 5, [0])])
    results.write(res, tmp_path)
    assert json.loads((tmp_path / "result.json").read_text())["max_abs"] == "inf"
    assert results.read(tmp_path).max_abs == math.inf


def test_invalid_status():
    with pytest.raises(ValueError, match="status"):
        CellResult(make_cell(), "ok")


def test_read_all_names_a_broken_file(tmp_path):
    results.write(make_result(make_cell()), tmp_path / "cells" / "a")
    (tmp_path / "cells" / "b").mkdir()
    for broken in ("{not json", "{}", '{"cell": {}}'):
        (tmp_path / "cells" / "b" / "result.json").write_text(broken)
        with pytest.raises(ValueError, match=re.escape("cells/b/result.json")):
            results.read_all(tmp_path)


@pytest.mark.parametrize("reader", ["read_all", "judge"])
def test_result_json_that_is_not_an_object(tmp_path, reader):
    out = tmp_path / "cells" / "b"
    write_log(out)
    (out / "result.json").write_text("[]")
    if reader == "read_all":
        with pytest.raises(ValueError, match=re.escape("cells/b/result.json")):
            results.read_all(tmp_path)
    else:
        res = base.judge(make_cell(), out, 0, 1.0, "t0", 240.0)
        assert res.status == "error" and "unreadable result.json" in res.reason


def test_skipped_and_errored_helpers():
    s = results.skipped(make_cell(), "no GPU")
    assert (s.status, s.reason) == ("skipped", "no GPU") and s.started == s.finished
    e = results.errored(make_cell(), "crashed", "tail", "t0", 2.5)
    assert (e.status, e.output_tail, e.started, e.timings) == ("error", "tail", "t0", {"wall_s": 2.5})


def test_cell_dict_round_trip():
    cell = load_matrix("quick").cells[0]
    d = json.loads(json.dumps(cell.to_dict()))
    assert d["id"] == cell.id
    assert Cell.from_dict(d) == cell
    assert cell.dirname == cell.id.replace("/", "__") and "/" not in cell.dirname


# ---- open_dir: reading a results dir back (compare, report) ---------------------------------------
def test_open_dir_reads_every_cell(tmp_path):
    c1, c2 = make_cell("cpu"), make_cell("cpu", dtype="bf16")
    for c in (c1, c2):
        results.write(make_result(c), results.cell_dir(tmp_path, c))
    assert [r.cell.id for r in results.open_dir(tmp_path)] == sorted([c1.id, c2.id])


@pytest.mark.parametrize(
    ("layout", "says"),
    [
        ("missing", "does not exist"),
        ("no-cells", "no cells/ inside"),
        ("empty-cells", "no cells/*/result.json inside"),
        ("unreadable", "not a readable cell result"),
    ],
)
def test_open_dir_names_the_path_of_what_is_wrong(tmp_path, layout, says):
    d = tmp_path / "res"
    if layout != "missing":
        d.mkdir()
    if layout in ("empty-cells", "unreadable"):
        (d / "cells").mkdir()
    if layout == "unreadable":
        (d / "cells" / "x").mkdir()
        (d / "cells" / "x" / "result.json").write_text("{not json")
    with pytest.raises(ConfigError, match=re.escape(says)) as info:
        results.open_dir(d)
    assert str(d) in str(info.value)
