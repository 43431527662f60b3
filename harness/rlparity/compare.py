"""`rlparity compare A B`: a bitwise verdict on two saved tensors (torch.save / .npy) or two result dirs.

Result dirs are compared here; tensors in `python -m rlparity.cell.tensors` (a subprocess: the host never
imports torch or rl_kernel).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlparity import results
from rlparity.config import ConfigError
from rlparity.gate import CONFIG


@dataclass(frozen=True)
class CellDelta:
    cell: str
    status_a: str
    status_b: str
    differing: tuple[str, ...]  # digest names whose bits differ

    @property
    def equal(self) -> bool:
        return not self.differing and self.status_a == self.status_b


@dataclass(frozen=True)
class TensorVerdict:
    """rl_kernel.bitwise.Diff as the cell-side comparison reported it."""

    equal: bool
    summary: str
    diff: dict[str, Any]


def compare_tensors(a: Path, b: Path) -> TensorVerdict:
    proc = subprocess.run(
        [sys.executable, "-m", "rlparity.cell.tensors", str(a), str(b)], capture_output=True, text=True
    )
    if proc.returncode == CONFIG:  # a file that cannot be compared: the cell side's message
        raise ConfigError(proc.stderr.strip())
    if proc.returncode != 0:
        raise RuntimeError(f"comparing {a} and {b} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout)
    return TensorVerdict(out["equal"], out["summary"], out["diff"])


def compare_dirs(a: Path, b: Path) -> list[CellDelta]:
    """Cells present in both result dirs, by id: same status and the same digest for every output."""
    ra = {r.cell.id: r for r in results.open_dir(a)}
    rb = {r.cell.id: r for r in results.open_dir(b)}
    out = []
    for cid in sorted(set(ra) | set(rb)):
        x, y = ra.get(cid), rb.get(cid)
        if x is None or y is None:
            out.append(CellDelta(cid, x.status if x else "absent", y.status if y else "absent", ()))
            continue
        names = sorted(set(x.digests) | set(y.digests))
        out.append(CellDelta(cid, x.status, y.status, tuple(n for n in names if x.digests.get(n) != y.digests.get(n))))
    return out
