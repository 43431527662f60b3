"""The runner's pure parts: the device pool (no two running cells share a GPU) and what --resume takes from disk."""

from __future__ import annotations

import threading

from rlparity import results
from rlparity.runner import DevicePool, resumable

from harness.factories import make_cell, make_result


def test_a_busy_device_waits_for_its_release() -> None:
    pool = DevicePool()
    assert pool.acquire([[0, 1]]) == [0, 1]
    assert pool.acquire([[1], [2]]) == [2]  # the first free option
    got: list[list[int]] = []
    waiter = threading.Thread(target=lambda: got.append(pool.acquire([[0], [1]])))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not got, "a cell took a device another cell holds"
    pool.release([0, 1])
    waiter.join(5)
    assert got == [[0]]


def test_resume_takes_only_this_cells_finished_result(tmp_path) -> None:
    cell, other = make_cell(), make_cell(profile="threads")
    assert resumable(tmp_path, cell) is None  # nothing on disk
    results.write(make_result(cell, "error"), results.cell_dir(tmp_path, cell))
    assert resumable(tmp_path, cell) is None  # an errored cell runs again
    results.write(make_result(cell, "passed"), results.cell_dir(tmp_path, cell))
    assert resumable(tmp_path, cell).status == "passed"
    # a result of another cell in this cell's directory (a renamed axis value, a hand-copied dir) is not this cell's
    results.write(make_result(other, "passed"), results.cell_dir(tmp_path, cell))
    assert resumable(tmp_path, cell) is None
