"""`rlparity compare`: tensors (the cell-side comparison) and result dirs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from rlparity import compare, results
from rlparity.cell import tensors
from rlparity.config import ConfigError

from harness.factories import (
    D1,
    D2,
    make_cell,
    make_result,
)


# ---- compare --------------------------------------------------------------------------------------------
def save(path: Path, t) -> Path:
    if path.suffix == ".npy":
        np.save(path, t)
    else:
        torch.save(t, path)
    return path


@pytest.mark.parametrize("suffix", [".pt", ".npy"])
def test_compare_equal_and_one_bit(tmp_path, suffix):
    a = torch.linspace(-3.0, 3.0, 24, dtype=torch.float32).reshape(4, 6)
    b = a.clone()
    b.view(torch.int32)[2, 5] ^= 1
    conv = (lambda t: t.numpy()) if suffix == ".npy" else (lambda t: t)
    pa, pa2, pb = (save(tmp_path / f"{n}{suffix}", conv(t)) for n, t in (("a", a), ("a2", a.clone()), ("b", b)))
    same = tensors.compare_tensors(pa, pa2)
    assert same.equal and same.count == 0 and same.total == 24
    d = tensors.compare_tensors(pa, pb)
    assert not d.equal and d.count == 1 and d.max_ulp == 1
    assert d.first_index == (2, 5) and d.first_a == float(a[2, 5])


def test_compare_signed_zero_differs(tmp_path):
    pa = save(tmp_path / "a.pt", torch.tensor([0.0, 1.0]))
    pb = save(tmp_path / "b.pt", torch.tensor([-0.0, 1.0]))
    d = tensors.compare_tensors(pa, pb)
    assert not d.equal and d.count == 1 and d.first_index == (0,)


def test_compare_bf16(tmp_path):
    a = torch.randn(8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    b = a.clone()
    b.view(torch.int16)[3] ^= 1
    d = tensors.compare_tensors(save(tmp_path / "a.pt", a), save(tmp_path / "b.pt", b))
    assert d.count == 1 and d.first_index == (3,)


def test_compare_shape_mismatch(tmp_path):
    pa = save(tmp_path / "a.pt", torch.zeros(2, 3))
    pb = save(tmp_path / "b.pt", torch.zeros(3, 2))
    with pytest.raises(ConfigError, match="cannot be compared"):
        tensors.compare_tensors(pa, pb)
    pc = save(tmp_path / "c.pt", torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ConfigError):
        tensors.compare_tensors(pa, pc)


def test_compare_non_tensor_files(tmp_path):
    pa = save(tmp_path / "a.pt", torch.zeros(2))
    with pytest.raises(ConfigError, match="dict") as info:
        tensors.compare_tensors(pa, save(tmp_path / "d.pt", {"logprobs": torch.zeros(2)}))
    assert "d.pt" in str(info.value)
    text = tmp_path / "t.pt"
    text.write_text("not a tensor")
    with pytest.raises(ConfigError, match="cannot load"):
        tensors.compare_tensors(text, pa)
    with pytest.raises(ConfigError, match="not a file"):
        tensors.compare_tensors(pa, tmp_path / "missing.pt")
    obj = tmp_path / "o.npy"
    np.save(obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ConfigError, match="cannot load"):
        tensors.compare_tensors(obj, pa)


def test_compare_dirs(tmp_path):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    c1, c2, c3 = make_cell("cpu"), make_cell("cpu", dtype="bf16"), make_cell("gfx942")
    for d, grad, status2 in ((a_dir, D1, "passed"), (b_dir, D2, "failed")):
        results.write(make_result(c1, digests={"x/logprobs": D1, "x/grad": grad}), results.cell_dir(d, c1))
        results.write(make_result(c2, status2, digests={"x/logprobs": D1}), results.cell_dir(d, c2))
    results.write(make_result(c3), results.cell_dir(a_dir, c3))
    deltas = {d.cell: d for d in compare.compare_dirs(a_dir, b_dir)}
    assert set(deltas) == {c1.id, c2.id, c3.id}
    assert deltas[c1.id].differing == ("x/grad",) and not deltas[c1.id].equal
    assert deltas[c2.id].differing == () and (deltas[c2.id].status_a, deltas[c2.id].status_b) == ("passed", "failed")
    assert not deltas[c2.id].equal
    assert (deltas[c3.id].status_a, deltas[c3.id].status_b) == ("passed", "absent")
    assert compare.compare_dirs(a_dir, a_dir) and all(d.equal for d in compare.compare_dirs(a_dir, a_dir))
    with pytest.raises(ConfigError, match="not a results directory"):
        compare.compare_dirs(a_dir, tmp_path / "empty")


def test_the_host_compare_gives_the_cell_sides_verdict(tmp_path):
    """compare.compare_tensors (host, a subprocess) reports what rlparity.cell.tensors computes."""
    a = torch.linspace(-1.0, 1.0, 12, dtype=torch.float32)
    b = a.clone()
    b.view(torch.int32)[7] ^= 1
    pa, pb = save(tmp_path / "a.pt", a), save(tmp_path / "b.pt", b)
    host, cell = compare.compare_tensors(pa, pb), tensors.compare_tensors(pa, pb)
    assert (host.equal, host.summary) == (cell.equal, cell.summary())
    assert json.dumps(host.diff, default=str) == json.dumps(cell.to_dict(), default=str)
    with pytest.raises(ConfigError, match="not a file"):
        compare.compare_tensors(pa, tmp_path / "missing.pt")
