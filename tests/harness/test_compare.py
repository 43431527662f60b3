"""`rlparity compare`: tensors (the cell-side comparison) and result dirs."""

from __future__ import annotations

import json
import subprocess
import sys
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
    results.write(make_result(c3, digests={"x/logprobs": D1}), results.cell_dir(a_dir, c3))
    got = compare.compare_dirs(a_dir, b_dir)
    deltas = {d.key: d for d in got.cells}
    assert set(deltas) == {c1.id, c2.id, c3.id} and got.ignored == ()  # one image on both sides: full ids
    assert deltas[c1.id].differing == ("x/grad",) and deltas[c1.id].verdict == compare.DIFFER
    # passed on one side, failed on the other, the same digests: the bits are equal (the statuses are shown)
    assert deltas[c2.id].differing == () and (deltas[c2.id].status_a, deltas[c2.id].status_b) == ("passed", "failed")
    assert deltas[c2.id].equal and deltas[c2.id].detail == "A passed, B failed"
    assert (deltas[c3.id].status_a, deltas[c3.id].status_b, deltas[c3.id].verdict) == ("passed", None, compare.ONLY_A)
    assert got.exit_code == 1 and "x/grad" not in got.problem and c1.id in got.problem
    same = compare.compare_dirs(a_dir, a_dir)
    assert same.cells and all(d.equal for d in same.cells) and same.exit_code == 0
    with pytest.raises(ConfigError, match="not a results directory"):
        compare.compare_dirs(a_dir, tmp_path / "empty")


# ---- compare of result dirs across images (a docker run and a local run) -----------------------------------
def write_run(out: Path, image: str, cells: dict[str, tuple[str, dict[str, str]]]) -> Path:
    """A results dir of `image`: {dtype: (status, digests)}, one cpu cell per dtype."""
    for dtype, (status, digests) in cells.items():
        cell = make_cell("cpu", dtype=dtype, image=image)
        results.write(make_result(cell, status, digests=digests), results.cell_dir(out, cell))
    return out


DIGESTS = {"x/logprobs": D1, "x/grad": D2}
KEY = "cpu/baseline/single/{}/quick/exact"  # a cpu cell's id without its image


def run_cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlparity.cli", "compare", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def test_a_docker_run_and_a_local_run_of_the_same_cells_are_equal(tmp_path):
    docker = write_run(tmp_path / "docker", "cpu", {"fp32": ("passed", DIGESTS), "bf16": ("passed", DIGESTS)})
    local = write_run(tmp_path / "local", "local", {"fp32": ("passed", DIGESTS), "bf16": ("failed", DIGESTS)})
    got = compare.compare_dirs(docker, local)
    assert got.ignored == ("image",) and (got.images_a, got.images_b) == (("cpu",), ("local",))
    assert [(d.key, d.verdict) for d in got.cells] == [(KEY.format("bf16"), "equal"), (KEY.format("fp32"), "equal")]
    assert got.cells[0].id_a == "cpu/" + KEY.format("bf16") and got.cells[0].id_b == "local/" + KEY.format("bf16")
    assert got.exit_code == 0 and got.problem == ""
    proc = run_cli(docker, local)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 equal, 0 differ; ignored axes: image" in proc.stdout and "differ:" not in proc.stdout


def test_one_changed_digest_differs_and_names_it(tmp_path):
    docker = write_run(tmp_path / "docker", "cpu", {"fp32": ("passed", DIGESTS), "bf16": ("passed", DIGESTS)})
    changed = {**DIGESTS, "x/grad": "3" * 64}
    local = write_run(tmp_path / "local", "local", {"fp32": ("passed", DIGESTS), "bf16": ("passed", changed)})
    got = compare.compare_dirs(docker, local)
    verdicts = {d.key: (d.verdict, d.differing) for d in got.cells}
    assert verdicts == {KEY.format("fp32"): ("equal", ()), KEY.format("bf16"): ("differ", ("x/grad",))}
    assert got.exit_code == 1 and KEY.format("bf16") in got.problem
    proc = run_cli(docker, local)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "differ: x/grad" in proc.stdout and "1 equal, 1 differ" in proc.stdout


def test_a_digest_one_side_lacks_differs(tmp_path):
    a = write_run(tmp_path / "a", "cpu", {"fp32": ("passed", DIGESTS)})
    b = write_run(tmp_path / "b", "local", {"fp32": ("passed", {"x/logprobs": D1})})
    (d,) = compare.compare_dirs(a, b).cells
    assert d.verdict == "differ" and d.differing == () and d.only_a == ("x/grad",)
    assert d.detail == "only in A: x/grad"
    assert compare.compare_dirs(a, b).exit_code == 1
    (d,) = compare.compare_dirs(b, a).cells  # and the other way round
    assert d.verdict == "differ" and d.differing == () and d.only_b == ("x/grad",)
    assert compare.compare_dirs(b, a).exit_code == 1


def test_one_sided_and_skipped_cells_are_reported_not_counted_as_differ(tmp_path):
    a = write_run(
        tmp_path / "a",
        "cpu",
        {"fp32": ("passed", DIGESTS), "bf16": ("passed", DIGESTS), "fp16": ("skipped", {}), "fp64": ("error", {})},
    )
    b = write_run(
        tmp_path / "b",
        "local",
        {"fp32": ("passed", DIGESTS), "fp16": ("passed", DIGESTS), "fp64": ("skipped", {}), "fp8": ("passed", DIGESTS)},
    )
    got = compare.compare_dirs(a, b)
    verdicts = {d.key.split("/")[3]: (d.verdict, d.detail) for d in got.cells}
    assert verdicts == {
        "fp32": ("equal", ""),
        "bf16": ("only in A", ""),
        "fp16": ("skipped", "A skipped"),
        "fp64": ("skipped", "A error, B skipped"),
        "fp8": ("only in B", ""),
    }
    assert got.counts() == {"equal": 1, "differ": 0, "only in A": 1, "only in B": 1, "skipped": 2, "no digests": 0}
    assert got.exit_code == 0
    proc = run_cli(a, b)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 equal, 0 differ, 1 only in A, 1 only in B, 2 skipped; ignored axes: image" in proc.stdout
    assert "skipped: A error, B skipped" in proc.stdout
    # negative control: the one cell both ran, with a changed digest, still fails among the others
    write_run(a, "cpu", {"fp32": ("passed", {**DIGESTS, "x/logprobs": D2})})
    assert compare.compare_dirs(a, b).exit_code == 1 and compare.compare_dirs(a, b).counts()["differ"] == 1


def test_a_cell_both_ran_without_digests_is_not_equal(tmp_path):
    a = write_run(tmp_path / "a", "cpu", {"fp32": ("failed", {})})
    b = write_run(tmp_path / "b", "local", {"fp32": ("failed", {})})
    got = compare.compare_dirs(a, b)
    assert got.cells[0].verdict == "no digests" and not got.cells[0].compared
    assert got.exit_code == 1 and "nothing was compared" in got.problem


def test_no_cell_in_common_exits_1(tmp_path):
    a = write_run(tmp_path / "a", "cpu", {"fp32": ("passed", DIGESTS)})
    b = write_run(tmp_path / "b", "local", {"bf16": ("passed", DIGESTS)})
    got = compare.compare_dirs(a, b)
    assert [d.verdict for d in got.cells] == ["only in B", "only in A"]
    assert got.problem == compare.NO_CELL_IN_COMMON and got.exit_code == 1
    proc = run_cli(a, b)
    assert proc.returncode == 1 and "no cell in common" in proc.stdout, proc.stdout + proc.stderr
    # cells in common, but none that both sides ran: nothing was compared, which is no pass either
    write_run(b, "local", {"fp32": ("skipped", {})})
    got = compare.compare_dirs(a, b)
    assert got.counts()["skipped"] == 1 and got.exit_code == 1 and "nothing was compared" in got.problem


def test_same_image_runs_match_on_the_full_id(tmp_path):
    a = write_run(tmp_path / "a", "cpu", {"fp32": ("passed", DIGESTS)})
    write_run(a, "rocm64-torch26", {"fp32": ("passed", DIGESTS)})
    b = write_run(tmp_path / "b", "cpu", {"fp32": ("passed", DIGESTS)})
    write_run(b, "rocm64-torch26", {"fp32": ("passed", {**DIGESTS, "x/grad": D1})})
    got = compare.compare_dirs(a, b)
    assert got.ignored == () and {d.key: d.verdict for d in got.cells} == {
        "cpu/" + KEY.format("fp32"): "equal",
        "rocm64-torch26/" + KEY.format("fp32"): "differ",
    }
    assert got.exit_code == 1
    proc = run_cli(a, b)
    assert proc.returncode == 1 and "matched on the full cell id" in proc.stdout, proc.stdout + proc.stderr
    # the same two images on both sides, only one of them differing: image is not ignored by default
    with pytest.raises(ConfigError, match="both match as"):
        compare.compare_dirs(a, b, ignore=["image"])


def test_ignore_names_an_axis(tmp_path):
    a = write_run(tmp_path / "a", "cpu", {"fp32": ("passed", DIGESTS)})
    b = write_run(tmp_path / "b", "cpu", {"bf16": ("passed", DIGESTS)})
    assert compare.compare_dirs(a, b).exit_code == 1  # fp32 vs bf16: nothing in common
    got = compare.compare_dirs(a, b, ignore=["dtype", "dtype"])
    assert got.ignored == ("dtype",) and [(d.key, d.verdict) for d in got.cells] == [
        ("cpu/cpu/baseline/single/quick/exact", "equal")
    ]
    with pytest.raises(ConfigError, match=r"unknown axis 'dtypes'; the axes are image, target, profile") as info:
        compare.compare_dirs(a, b, ignore=["dtype", "dtypes"])
    assert "tier" in str(info.value)
    proc = run_cli(a, b, "--ignore", "colour")
    assert proc.returncode == 3 and "unknown axis 'colour'" in proc.stdout, proc.stdout + proc.stderr
    proc = run_cli(a, b, "--ignore", "dtype")
    assert proc.returncode == 0 and "ignored axes: dtype" in proc.stdout, proc.stdout + proc.stderr


def test_ignored_axes_that_merge_two_cells_of_one_side_are_an_error(tmp_path):
    # a docker run of both images against a local run: without image, its two cells are one
    a = write_run(tmp_path / "a", "cpu", {"fp32": ("passed", DIGESTS)})
    write_run(a, "rocm64-torch26", {"fp32": ("passed", DIGESTS)})
    b = write_run(tmp_path / "b", "local", {"fp32": ("passed", DIGESTS)})
    with pytest.raises(ConfigError, match="both match as") as info:
        compare.compare_dirs(a, b)
    msg = str(info.value)
    assert "cpu/" + KEY.format("fp32") in msg and "rocm64-torch26/" + KEY.format("fp32") in msg and "of A" in msg
    proc = run_cli(a, b)
    assert proc.returncode == 3 and "configuration error" in proc.stdout, proc.stdout + proc.stderr
    # negative control: one cell per key on each side is no collision
    assert compare.compare_dirs(b, write_run(tmp_path / "c", "cpu", {"fp32": ("passed", DIGESTS)})).exit_code == 0


def test_compare_of_a_non_results_dir_is_bad_input(tmp_path):
    a = write_run(tmp_path / "a", "cpu", {"fp32": ("passed", DIGESTS)})
    (tmp_path / "empty").mkdir()
    proc = run_cli(a, tmp_path / "empty")
    assert proc.returncode == 3 and "not a results directory" in proc.stdout, proc.stdout + proc.stderr


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
