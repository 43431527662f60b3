"""The local backend: one fresh `python -m rlparity.cell.cellrun` process (group) per cell on this host.

Its side effects: the per-cell timeout, killing a hung cell's whole process group, and the probe and the
controls' env, each from a subprocess on the cell side (the host never imports rlparity.cell).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from rlparity import results
from rlparity.backends.base import Backend, Running, cell_command, cell_env, clean_env, judge, prepare_cell_dir
from rlparity.cells import HOST_BUILT_CONTROLS, Cell
from rlparity.inventory import Inventory


class LocalBackend(Backend):
    """One fresh `python -m rlparity.cell.cellrun` subprocess per cell."""

    name = "local"

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        self._running: Running[subprocess.Popen] = Running(_kill_group)

    def cancel(self) -> None:
        """Kill every running cell's process group (the run was interrupted), and any cell started after."""
        self._running.cancel()

    def probe(self) -> Inventory:
        env = clean_env(dict(os.environ))
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        proc = subprocess.run(
            [self.python, "-m", "rlparity.cell.inventory"], capture_output=True, text=True, env=env, timeout=300
        )
        if proc.returncode != 0:
            return Inventory(error=f"inventory probe exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
        return Inventory.from_dict(json.loads(proc.stdout))

    def control_env(self, control: str, gpu: bool = False) -> dict[str, str]:
        """Built here, on the host, where the cells run (fma-build: the library, cached); the other controls need
        none (a process that imports torch for nothing, each)."""
        if control not in HOST_BUILT_CONTROLS:
            return {}
        argv = [self.python, "-m", "rlparity.cell.controls", "env", control, *(["--gpu"] if gpu else [])]
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"control {control!r}: {proc.stderr.strip()[-3000:]}")
        return json.loads(proc.stdout)

    def command(self, cell_file: Path, out: Path) -> list[str]:
        return cell_command(self.python, str(cell_file), str(out))

    def run_cell(
        self, cell: Cell, devices: list[int], out: Path, control: str = "none", extra_env: dict[str, str] | None = None
    ) -> results.CellResult:
        cell_file = prepare_cell_dir(cell, out)
        env = cell_env(cell, devices, dict(os.environ), control, extra_env)
        started, t0 = results.now(), time.monotonic()
        with (out / results.LOG_FILE).open("wb") as log:
            proc = subprocess.Popen(
                self.command(cell_file, out), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            self._running.add(proc)
            try:
                rc: int | None = proc.wait(timeout=cell.timeout_s)
            except subprocess.TimeoutExpired:  # hung: killed and reaped below
                rc = None
            finally:
                self._running.discard(proc)
            # however the cell ended, nothing it started may outlive it (e.g. split ranks holding a GPU)
            _kill_group(proc)
            proc.wait()
        return judge(cell, out, rc, round(time.monotonic() - t0, 3), started, cell.timeout_s)


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the cell's whole session (a cell may have children: the split placement's ranks)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
