"""Runs a list of cells on a backend: applicability, --resume, one device set per running cell, N jobs.

Each cell's result is written the moment it finishes (results.write), so an interrupted run loses
nothing and --resume picks up where it stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

from rlparity import results
from rlparity.applicability import devices_for, skip_reason
from rlparity.backends.base import Backend
from rlparity.cells import Cell
from rlparity.inventory import Inventory

FINISHED = ("passed", "failed", "skipped")  # --resume reruns errored cells
POLL_S = 0.2  # how often the main thread wakes while cells run (to take an interrupt)


class DevicePool:
    """Hands out device sets so that no two running cells share a GPU."""

    def __init__(self) -> None:
        self._busy: set[int] = set()
        self._cond = threading.Condition()

    def acquire(self, options: list[list[int]]) -> list[int]:
        with self._cond:
            while True:
                for devs in options:
                    if not self._busy & set(devs):
                        self._busy |= set(devs)
                        return devs
                self._cond.wait()

    def release(self, devs: list[int]) -> None:
        with self._cond:
            self._busy -= set(devs)
            self._cond.notify_all()


def resumable(out: Path, cell: Cell) -> results.CellResult | None:
    """A finished result of this very cell, if one is on disk."""
    d = results.cell_dir(out, cell)
    if not (d / results.RESULT_FILE).exists():
        return None
    try:
        res = results.read(d)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return res if res.status in FINISHED and res.cell.id == cell.id else None


def run_cells(
    cells: list[Cell],
    backend: Backend,
    out: Path,
    inventory: Inventory,
    jobs: int = 1,
    resume: bool = False,
    control: str = "none",
    extra_env: dict[str, str] | None = None,
    on_start: Callable[[Cell], None] | None = None,
    on_result: Callable[[results.CellResult], None] | None = None,
) -> list[results.CellResult]:
    pool = DevicePool()
    done: dict[str, results.CellResult] = {}
    lock = threading.Lock()
    stopping = threading.Event()  # set on an interrupt: a worker between cells starts no other

    def finish(res: results.CellResult) -> None:
        results.write(res, results.cell_dir(out, res.cell))
        with lock:
            done[res.cell.id] = res
        if on_result:
            on_result(res)

    def run_one(cell: Cell) -> None:
        devs = pool.acquire(devices_for(cell, inventory))
        if stopping.is_set():  # not started: no result, and --resume runs it
            pool.release(devs)
            return
        try:
            if on_start:
                on_start(cell)
            res = backend.run_cell(cell, devs, results.cell_dir(out, cell), control, extra_env)
        except Exception as exc:  # a backend failure loses this cell only, never the others' results
            res = results.errored(cell, f"backend {backend.name} failed: {type(exc).__name__}: {exc}")
        finally:
            pool.release(devs)
        finish(res)

    to_run = []
    for cell in cells:
        previous = resumable(out, cell) if resume else None
        if previous is not None:
            with lock:
                done[cell.id] = previous
            if on_result:
                on_result(previous)
            continue
        reason = skip_reason(cell, inventory)
        if reason:
            finish(results.skipped(cell, reason))
        else:
            to_run.append(cell)
    ex = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        futures = [ex.submit(run_one, cell) for cell in to_run]
        pending = set(futures)
        while pending:  # timed: a SIGINT that lands as the wait starts blocking is raised within POLL_S, not at the end
            pending = wait(pending, timeout=POLL_S).not_done
        for future in futures:
            future.result()  # a worker's own failure (writing a result) propagates
    except BaseException:  # KeyboardInterrupt: start nothing more, stop what runs, keep what finished
        stopping.set()
        ex.shutdown(wait=False, cancel_futures=True)
        backend.cancel()  # a no-op where nothing runs (base.Backend)
        raise
    ex.shutdown()
    return [done[c.id] for c in cells]
