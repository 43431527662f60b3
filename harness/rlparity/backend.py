"""Backends run one cell in a clean process (local) or container (docker, see docker_backend.py).

All process side effects live here: the env a cell starts with, device pinning, the per-cell timeout,
killing a hung cell's whole process group, and turning a crash or a silent exit into an ERROR result
that carries the tail of the cell's output.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Protocol

from rlparity import results
from rlparity.fingerprint import ENV_PREFIXES
from rlparity.inventory import Inventory
from rlparity.matrix import Cell

TAIL_CHARS = 4000
VISIBILITY = {"cuda": "CUDA_VISIBLE_DEVICES", "rocm": "HIP_VISIBLE_DEVICES"}
# Set by the runner (CI) to hand this job its GPUs: kept, and cell device indices map through them.
KEEP = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "CUDA_HOME", "ROCM_PATH", "HIP_PATH")


class Backend(Protocol):
    name: str

    def probe(self) -> Inventory: ...

    def run_cell(
        self, cell: Cell, devices: list[int], out: Path, variant: str = "none", extra_env: dict[str, str] | None = None
    ) -> results.CellResult: ...


def clean_env(base: dict[str, str]) -> dict[str, str]:
    """The caller's env without the variables that change numerics (device visibility is kept)."""
    return {k: v for k, v in base.items() if not k.startswith(ENV_PREFIXES) or k in KEEP}


def cell_env(
    cell: Cell, devices: list[int], base: dict[str, str], variant: str = "none", extra: dict[str, str] | None = None
) -> dict[str, str]:
    """The env a cell's process starts with: the caller's, minus every numerics-relevant variable (so
    `baseline` means nothing set), plus the profile's variables, the device pinning and `extra` (the
    negative controls' RL_KERNEL_LIBRARY)."""
    env = clean_env(base)
    env.update(cell.env)
    env.update(extra or {})
    if cell.platform in VISIBILITY:
        var = VISIBILITY[cell.platform]
        env[var] = visible_devices(base.get(var), devices)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # the probe and every cell enumerate GPUs the same way
    env["RLPARITY_VARIANT"] = variant
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
    if rc < 0 or (rc not in (0, 1, 2)):
        reason = describe_exit(rc) + (" after writing its results" if has_result else "")
        return results.errored(cell, reason, log_tail, started, wall_s)
    if not has_result:
        reason = f"{describe_exit(rc)} without writing {results.RESULT_FILE}"
        return results.errored(cell, reason, log_tail, started, wall_s)
    try:
        res = results.read(out)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return results.errored(cell, f"unreadable {results.RESULT_FILE}: {exc}", log_tail, started, wall_s)
    expected = {"passed": 0, "skipped": 0, "failed": 1, "error": 2}[res.status]
    if rc != expected:
        return results.errored(cell, f"{describe_exit(rc)} but its result says {res.status}", log_tail, started, wall_s)
    if res.status == "error" and not res.output_tail:
        res.output_tail = log_tail
    return res


class LocalBackend:
    """One fresh `python -m rlparity.cellrun` subprocess per cell."""

    name = "local"

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        self._running: set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    def cancel(self) -> None:
        """Kill every running cell's process group (the run was interrupted)."""
        with self._lock:
            running = list(self._running)
        for proc in running:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)

    def probe(self) -> Inventory:
        env = clean_env(dict(os.environ))
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
        proc = subprocess.run(
            [self.python, "-m", "rlparity.inventory"], capture_output=True, text=True, env=env, timeout=300
        )
        if proc.returncode != 0:
            return Inventory(error=f"inventory probe exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
        return Inventory.from_dict(json.loads(proc.stdout))

    def command(self, cell_file: Path, out: Path) -> list[str]:
        return [self.python, "-m", "rlparity.cellrun", str(cell_file), str(out)]

    def run_cell(
        self, cell: Cell, devices: list[int], out: Path, variant: str = "none", extra_env: dict[str, str] | None = None
    ) -> results.CellResult:
        cell_file = prepare_cell_dir(cell, out)
        env = cell_env(cell, devices, dict(os.environ), variant, extra_env)
        started, t0 = results.now(), time.monotonic()
        with (out / results.LOG_FILE).open("wb") as log:
            proc = subprocess.Popen(
                self.command(cell_file, out), stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
            with self._lock:
                self._running.add(proc)
            try:
                rc: int | None = proc.wait(timeout=cell.timeout_s)
            except subprocess.TimeoutExpired:
                _kill_group(proc)
                rc = None
            finally:
                with self._lock:
                    self._running.discard(proc)
            # however the cell ended, nothing it started may outlive it (e.g. split ranks holding a GPU)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        return judge(cell, out, rc, round(time.monotonic() - t0, 3), started, cell.timeout_s)


def _kill_group(proc: subprocess.Popen) -> None:
    """A hung cell may have children (the split placement's ranks): kill the whole session."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
