"""What every backend shares: the Backend protocol, the env a cell starts with, the cell's command line,
the cell's result dir, and judge() (a cell's result from what it left behind; the exit-status map and the
control variable are cells.py's, which the cell side reads too).

A backend adds only where the cell runs (local.py: a process group; docker.py: a container).
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Generic, Protocol, TypeVar

from rlparity import results
from rlparity.cells import CONTROL_VAR, EXIT_CODES, Cell
from rlparity.fingerprint import ENV_PREFIXES
from rlparity.inventory import Inventory

T = TypeVar("T")
TAIL_CHARS = 4000
VISIBILITY = {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "HIP_VISIBLE_DEVICES"}
# Set by the runner (CI) to hand this job its GPUs: kept, and cell device indices map through them.
KEEP = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_HOME", "ROCM_PATH", "HIP_PATH")


class Backend(Protocol):
    name: str

    def prepare(self, cells: list[Cell], strict: bool) -> None:
        """Before any cell (docker: images built and, with strict, pinned); a no-op where nothing is needed."""

    def probe(self) -> Inventory: ...

    def control_env(self, control: str, gpu: bool = False) -> dict[str, str]:
        """The extra env a negative control's cells need (fma-build: its library)."""
        ...

    def run_cell(
        self, cell: Cell, devices: list[int], out: Path, control: str = "none", extra_env: dict[str, str] | None = None
    ) -> results.CellResult: ...

    def cancel(self) -> None:
        """Kill every running cell (the run was interrupted); a no-op where nothing runs."""


class Running(Generic[T]):
    """The cells running now (processes, containers) and whether the run was cancelled. A cell registered after
    cancel() is stopped at once: an interrupt that lands while a worker is starting a cell must not leave that
    cell running until its timeout."""

    def __init__(self, stop: Callable[[T], None]) -> None:
        self._stop = stop
        self._items: set[T] = set()
        self._cancelled = False
        self._lock = threading.Lock()

    def add(self, item: T) -> bool:
        """Register a started cell; False (and the cell stopped) when the run was cancelled already."""
        with self._lock:
            if not self._cancelled:
                self._items.add(item)
                return True
        self._stop(item)
        return False

    def discard(self, item: T) -> None:
        with self._lock:
            self._items.discard(item)

    def cancel(self) -> None:
        """Stop every running cell, and every cell registered from now on."""
        with self._lock:
            self._cancelled = True
            items = list(self._items)
        for item in items:
            self._stop(item)


def cell_command(python: str, cell_file: str, out: str) -> list[str]:
    """The one command line a cell runs, on the host or in a container."""
    return [python, "-m", "rlparity.cell.cellrun", cell_file, out]


def clean_env(base: Mapping[str, str]) -> dict[str, str]:
    """The caller's env without the variables that change numerics (device visibility is kept)."""
    return {k: v for k, v in base.items() if not k.startswith(ENV_PREFIXES) or k in KEEP}


def cell_env(
    cell: Cell, devices: list[int], base: Mapping[str, str], control: str = "none", extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The env a cell's process starts with, for every backend: `base` (the local backend: the caller's
    env; docker: only the inherited visibility variables) minus every numerics-relevant variable (so
    `baseline` means nothing set), plus the profile's variables, the device pinning and `extra` (the
    negative controls' RL_KERNEL_LIBRARY)."""
    env = clean_env(base)
    env.update(cell.env)
    env.update(extra or {})
    if cell.platform in VISIBILITY:
        var = VISIBILITY[cell.platform]
        env[var] = visible_devices(base.get(var), devices)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the probe and every cell enumerate GPUs the same way
    env[CONTROL_VAR] = control
    env["PYTHONUNBUFFERED"] = "1"
    return env


def visible_devices(inherited: str | None, indices: list[int]) -> str:
    """Indices relative to what this job may see, mapped through an inherited visibility list."""
    if inherited:
        allowed = [d.strip() for d in inherited.split(",") if d.strip()]
        bad = [i for i in indices if i >= len(allowed)]
        if bad:
            raise ValueError(f"device index {bad[0]} is outside the inherited visible devices {inherited!r}")
        return ",".join(allowed[i] for i in indices)
    return ",".join(str(i) for i in indices)


def prepare_cell_dir(cell: Cell, out: Path) -> Path:
    """A cell's result dir before it runs: no stale result or junit from an earlier run (judge() must
    never trust those), and cell.json, the cell as run. Returns cell.json's path."""
    out.mkdir(parents=True, exist_ok=True)
    for stale in (results.RESULT_FILE, results.JUNIT_FILE):
        (out / stale).unlink(missing_ok=True)
    cell_file = out / results.CELL_FILE
    cell_file.write_text(json.dumps(cell.to_dict(), indent=1) + "\n")
    return cell_file


def tail(path: Path, chars: int = TAIL_CHARS) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - chars))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def describe_exit(rc: int) -> str:
    if rc < 0:
        try:
            return f"crashed: killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"crashed: killed by signal {-rc}"
    return f"exited with code {rc}"


def judge(cell: Cell, out: Path, rc: int | None, wall_s: float, started: str, timeout_s: float) -> results.CellResult:
    """The cell's result from what it left behind: its result.json, or an ERROR naming what happened."""
    log_tail = tail(out / results.LOG_FILE)
    if rc is None:
        return results.errored(cell, f"timed out after {timeout_s:g} s (killed)", log_tail, started, wall_s)
    has_result = (out / results.RESULT_FILE).exists()
    if rc < 0 or rc not in EXIT_CODES.values():
        reason = describe_exit(rc) + (" after writing its results" if has_result else "")
        return results.errored(cell, reason, log_tail, started, wall_s)
    if not has_result:
        reason = f"{describe_exit(rc)} without writing {results.RESULT_FILE}"
        return results.errored(cell, reason, log_tail, started, wall_s)
    try:
        res = results.read(out)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return results.errored(cell, f"unreadable {results.RESULT_FILE}: {exc}", log_tail, started, wall_s)
    if rc != EXIT_CODES[res.status]:
        return results.errored(cell, f"{describe_exit(rc)} but its result says {res.status}", log_tail, started, wall_s)
    if res.status == "error" and not res.output_tail:
        res.output_tail = log_tail
    return res
