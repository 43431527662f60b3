"""`rlparity compare A B` never passes vacuously: every way a new user can end up comparing nothing exits
non-zero (1, or 3 for input that is not a results dir or a tensor), through the CLI as the user runs it, each
with the control that a real comparison of the same kind exits 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from rlparity import results
from rlparity.cells import AXES

from harness.factories import D1, D2, make_cell, make_result

DIGESTS = {"x/logprobs": D1, "x/grad": D2}


def cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlparity.cli", "compare", *map(str, args)], capture_output=True, text=True, timeout=120
    )


def run_dir(out: Path, cells: dict[str, tuple[str, dict[str, str]]]) -> Path:
    """A results dir with one cpu cell per dtype: {dtype: (status, digests)}."""
    for dtype, (status, digests) in cells.items():
        cell = make_cell("cpu", dtype=dtype)
        results.write(make_result(cell, status, digests=digests), results.cell_dir(out, cell))
    return out


# ---- tensors ---------------------------------------------------------------------------------------------
def _save(path: Path, t: torch.Tensor) -> Path:
    if path.suffix == ".npy":
        np.save(path, t.numpy())
    else:
        torch.save(t, path)
    return path


@pytest.mark.parametrize("suffix", [".pt", ".npy"])
@pytest.mark.parametrize("shape", [(0,), (3, 0)], ids=["0", "3x0"])
def test_two_empty_tensors_are_not_a_pass(tmp_path: Path, suffix: str, shape: tuple[int, ...]) -> None:
    a = _save(tmp_path / f"a{suffix}", torch.empty(shape))
    b = _save(tmp_path / f"b{suffix}", torch.empty(shape))
    proc = cli(a, b)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "nothing was compared" in proc.stdout, proc.stdout
    # the control: one element, bitwise equal, is a pass
    one_a = _save(tmp_path / f"one_a{suffix}", torch.tensor([1.5]))
    one_b = _save(tmp_path / f"one_b{suffix}", torch.tensor([1.5]))
    proc = cli(one_a, one_b)
    assert proc.returncode == 0 and "bitwise equal (1 elements)" in proc.stdout, proc.stdout + proc.stderr


def test_two_files_of_zero_bytes_are_bad_input(tmp_path: Path) -> None:
    a, b = tmp_path / "a.pt", tmp_path / "b.pt"
    a.write_bytes(b"")
    b.write_bytes(b"")
    proc = cli(a, b)
    assert proc.returncode == 3 and "cannot load a tensor" in proc.stdout, proc.stdout + proc.stderr


# ---- result dirs -----------------------------------------------------------------------------------------
def test_empty_dirs_are_bad_input(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b" / "cells").mkdir(parents=True)  # a run that wrote no cell
    for a, b in ((tmp_path / "a", tmp_path / "a"), (tmp_path / "b", tmp_path / "b")):
        proc = cli(a, b)
        assert proc.returncode == 3 and "not a results directory" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("a_cells", "b_cells", "why"),
    [
        ({"fp32": ("passed", DIGESTS)}, {"bf16": ("passed", DIGESTS)}, "no cell in common"),  # disjoint filters
        ({"fp32": ("skipped", {})}, {"fp32": ("skipped", {})}, "nothing was compared"),  # only skipped cells
        ({"fp32": ("passed", DIGESTS)}, {"fp32": ("error", {})}, "nothing was compared"),  # one side errored
        ({"fp32": ("passed", {})}, {"fp32": ("passed", {})}, "nothing was compared"),  # cells without digests
    ],
    ids=["disjoint", "only skipped", "errored", "no digests"],
)
def test_dirs_that_compare_nothing_exit_1(tmp_path: Path, a_cells, b_cells, why: str) -> None:
    a, b = run_dir(tmp_path / "a", a_cells), run_dir(tmp_path / "b", b_cells)
    proc = cli(a, b)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert why in proc.stdout, proc.stdout


def test_every_axis_ignored_still_compares_or_fails(tmp_path: Path) -> None:
    """--ignore of every axis: one cell a side is matched and really compared (0 when equal, 1 when a digest
    differs); a skipped cell so matched compares nothing (1); two cells of a side are an error (3)."""
    ignore = [x for axis in AXES for x in ("--ignore", axis)]
    a = run_dir(tmp_path / "a", {"fp32": ("passed", DIGESTS)})
    b = run_dir(tmp_path / "b", {"bf16": ("passed", DIGESTS)})
    assert cli(a, b, *ignore).returncode == 0
    c = run_dir(tmp_path / "c", {"bf16": ("passed", {**DIGESTS, "x/grad": D1})})
    assert cli(a, c, *ignore).returncode == 1
    s = run_dir(tmp_path / "s", {"bf16": ("skipped", {})})
    proc = cli(a, s, *ignore)
    assert proc.returncode == 1 and "nothing was compared" in proc.stdout, proc.stdout
    two = run_dir(tmp_path / "two", {"fp32": ("passed", DIGESTS), "bf16": ("passed", DIGESTS)})
    assert cli(a, two, *ignore).returncode == 3
