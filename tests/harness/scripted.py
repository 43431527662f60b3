"""Cells that misbehave on purpose, and the helpers the process-level tests share (tests/harness)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from junitparser import JUnitXml

from rlparity import results
from rlparity.backends.base import Backend
from rlparity.backends.local import LocalBackend
from rlparity.cells import Cell
from rlparity.inventory import Inventory

CPU_FILTER = "target=cpu profile=baseline placement=single dtype=fp32 shapes=quick"
CPU_CELL_ID = "local/cpu/baseline/single/fp32/quick/exact"
CHILD_MARK = "rlparity-test-child"
# Generous bounds: the machine has 2 cores and pytest-xdist runs two of these files' tests at once.
CLI_TIMEOUT_S = 300

# A cell process that misbehaves in a chosen way: `python -c CELL_SCRIPT CELL_JSON OUT_DIR MODE`.
CELL_SCRIPT = r"""
import json, os, resource, signal, subprocess, sys, time
from pathlib import Path

cell_file, out, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a planted crash must not drop a core file anywhere
print(f"rlparity-test cell {mode}: hello from pid {os.getpid()}", flush=True)


def spawn_child():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)  # " + MARK])
    (out / "child.pid").write_text(str(child.pid))


def write_result(status):
    from rlparity import results
    from rlparity.cells import Cell

    cell = Cell.from_dict(json.loads(cell_file.read_text()))
    cmp = {"name": "planted", "equal": status != "failed", "informational": False, "count": 1, "total": 1,
           "max_abs": 1.0, "max_ulp": 1, "first_index": [0]}
    results.write(results.CellResult(cell, status, f"planted {status}", comparisons=[cmp]), out)


if mode == "segfault":
    os.kill(os.getpid(), signal.SIGSEGV)
elif mode == "segfault-with-child":
    spawn_child()
    os.kill(os.getpid(), signal.SIGSEGV)
elif mode == "hang":
    time.sleep(60)
elif mode == "hang-with-child":
    spawn_child()
    time.sleep(60)
elif mode == "exit0-no-result":
    sys.exit(0)
elif mode == "slow-exit0-no-result":
    time.sleep(1.5)
    sys.exit(0)
elif mode == "exit3":
    for i in range(600):
        print(f"progress line {i:04d}")
    print("rlparity-test: last words on stderr", file=sys.stderr, flush=True)
    sys.exit(3)
elif mode == "passed-but-exit1":
    write_result("passed")
    sys.exit(1)
elif mode == "slow-passed-but-exit1":
    time.sleep(1.5)
    write_result("passed")
    sys.exit(1)
elif mode == "failed-no-junit":
    write_result("failed")
    sys.exit(1)
elif mode == "garbage-result":
    (out / "result.json").write_text("{not json")
    sys.exit(0)
elif mode == "dump-env":
    (out / "env.json").write_text(json.dumps(dict(os.environ)))
    sys.exit(0)
else:
    sys.exit(f"unknown mode {mode}")
""".replace("MARK", repr(CHILD_MARK))


class ScriptedBackend(LocalBackend):
    """The local backend (its env, timeout, process-group kill and judging), but a chosen cell runs CELL_SCRIPT
    in one of its modes instead of `python -m rlparity.cell.cellrun`. Cells not in `modes` run for real."""

    def __init__(self, modes: dict[str, str] | None = None, default: str | None = None) -> None:
        super().__init__()
        self.modes = modes or {}
        self.default = default

    def command(self, cell_file: Path, out: Path) -> list[str]:
        cell_id = json.loads(cell_file.read_text())["id"]
        mode = self.modes.get(cell_id, self.default)
        if mode is None:
            return super().command(cell_file, out)
        return [self.python, "-c", CELL_SCRIPT, str(cell_file), str(out), mode]


class RecordingBackend(Backend):
    """Runs nothing: records which cells it was asked to run and passes them."""

    name = "recording"

    def __init__(self) -> None:
        self.calls: list[str] = []

    def probe(self) -> Inventory:
        return Inventory()

    def run_cell(self, cell, devices, out, control="none", extra_env=None) -> results.CellResult:
        self.calls.append(cell.id)
        return results.CellResult(cell, "passed", "recorded", started=results.now(), finished=results.now())


# ---- helpers ------------------------------------------------------------------------------------------
def mode_cell(cell: Cell, name: str, **changes) -> Cell:
    """A distinct cell (its own id and result dir) for a misbehaving mode."""
    return dataclasses.replace(cell, profile=name, **changes)


def printed(mode: str) -> str:
    """A line the cell printed that must be in its output tail (exit3's greeting scrolls out of the tail)."""
    return "rlparity-test: last words on stderr" if mode == "exit3" else f"rlparity-test cell {mode}: hello"


def pid_alive(pid: int) -> bool:
    """Alive and not a zombie (PID 1 here may not reap orphans, so a killed orphan can linger as Z)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    state = next((ln.split()[1] for ln in status.splitlines() if ln.startswith("State:")), "?")
    return state not in ("Z", "X")


def wait_dead(pid: int, within_s: float = 3.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return not pid_alive(pid)


def is_ours(pid: int, mark: str) -> bool:
    try:
        return mark in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def kill_if_ours(pid: int, mark: str, group: bool = False) -> None:
    """Clean-up after a failing test: only a process this test started (its command line carries `mark`)."""
    if pid_alive(pid) and is_ours(pid, mark):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group:
                os.killpg(pid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)


def rlparity(
    *args: str, cwd: Path, timeout: float = CLI_TIMEOUT_S, pythonpath: str | None = None, env: dict | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m rlparity.cli ARGS`; pythonpath: a copy of the packages to run instead (first on the path)."""
    environ = {**os.environ, **(env or {})}
    if pythonpath:
        environ["PYTHONPATH"] = pythonpath + os.pathsep + environ.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "rlparity.cli", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env=environ,
    )  # fmt: skip


def squash(text: str) -> str:
    """Without whitespace: rich wraps long lines of piped output at 150 columns."""
    return "".join(text.split())


def show(proc: subprocess.CompletedProcess[str]) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"


def write_matrix(path: Path, timeout_s: float = 240, **axes: list[str]) -> Path:
    values = {
        "image": ["rocm64-torch26"],
        "target": ["cpu"],
        "profile": ["baseline"],
        "placement": ["single"],
        "dtype": ["fp32"],
        "shapes": ["smoke"],
        "tier": ["exact"],
        **axes,
    }
    lines = ["[matrix]", f"timeout_s = {timeout_s}", "", "[axes]"]
    lines += [f"{k} = {json.dumps(v)}" for k, v in values.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def suites_by_name(junit: Path) -> dict:
    xml = JUnitXml.fromfile(str(junit))
    return {s.name: s for s in xml}


class OutcomeBackend(RecordingBackend):
    """Runs nothing, in-process: each cell's status comes from `outcome(cell)` (default: passed). For GPU cells
    planned from a synthetic inventory on a host that has no GPU (the compose command-line tests)."""

    name = "local"  # the matrix expands as for the local backend (the compose `test` service runs it)

    def __init__(self, outcome=None) -> None:
        super().__init__()
        self.outcome = outcome or (lambda cell: "passed")

    def run_cell(self, cell, devices, out, control="none", extra_env=None) -> results.CellResult:
        self.calls.append(cell.id)
        status = self.outcome(cell)
        return results.CellResult(cell, status, f"scripted {status}", started=results.now(), finished=results.now())
