"""The runner's parts: the device pool (no two running cells share a GPU), what --resume takes from disk, and what
an interrupt stops (what runs, what registers after it, what waits for a device)."""

from __future__ import annotations

import signal
import threading
import time

import pytest

from rlparity import results
from rlparity.backends.base import Running
from rlparity.inventory import Device, Inventory
from rlparity.runner import DevicePool, resumable, run_cells

from harness.factories import make_cell, make_result
from harness.scripted import RecordingBackend


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


def test_a_cell_registered_after_cancel_is_stopped_at_once() -> None:
    stopped: list[str] = []
    running = Running(stopped.append)
    assert running.add("a") and not stopped
    running.discard("a")
    assert running.add("b")
    running.cancel()
    assert stopped == ["b"]  # what runs is stopped, what finished is not
    # an interrupt that lands while a worker is starting its cell: the late cell must not run to its timeout
    assert not running.add("c")
    assert stopped == ["b", "c"]


class _CountingPool(DevicePool):
    """The runner's pool, telling when a second cell asks for a device."""

    second_asks = threading.Event()

    def acquire(self, options: list[list[int]]) -> list[int]:
        if getattr(self, "_asked", False):
            self.second_asks.set()
        self._asked = True
        return super().acquire(options)


class _InterruptingBackend(RecordingBackend):
    """The first cell, once the second waits for its device, interrupts the run (SIGINT to the main thread) and
    runs until the runner cancels it."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled = threading.Event()

    def run_cell(self, cell, devices, out, control="none", extra_env=None) -> results.CellResult:
        if not self.calls:
            assert _CountingPool.second_asks.wait(30), "the second worker never asked for a device"
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
            self.cancelled.wait(120)  # a delayed interrupt still shows what starts after it
        return super().run_cell(cell, devices, out, control, extra_env)

    def cancel(self) -> None:
        self.cancelled.set()


def test_an_interrupt_starts_no_cell_that_waits_for_a_device(tmp_path, monkeypatch) -> None:
    """Two jobs, one GPU: the second worker holds its cell while the first runs; after the interrupt it must not
    start it when the device comes free (no result: --resume runs it)."""
    monkeypatch.setattr("rlparity.runner.DevicePool", _CountingPool)
    _CountingPool.second_asks.clear()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # xdist workers may ignore SIGINT
    try:
        inv = Inventory((Device(0, "rocm", "AMD Instinct MI300X", "gfx942", 64),), (), True)
        first, second = make_cell("gfx942"), make_cell("gfx942", profile="threads")
        backend = _InterruptingBackend()
        with pytest.raises(KeyboardInterrupt):
            run_cells([first, second], backend, tmp_path, inv, jobs=2)
        deadline = time.monotonic() + 30
        while not (results.cell_dir(tmp_path, first) / results.RESULT_FILE).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # the device is free: an unchecked worker starts its cell now
    finally:
        signal.signal(signal.SIGINT, previous)
    assert backend.calls == [first.id], "a cell started after the run was interrupted"
    assert resumable(tmp_path, first) is not None and resumable(tmp_path, second) is None
