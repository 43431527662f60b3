"""`rlparity compare A B`: a bitwise verdict on two saved tensors (torch.save / .npy) or two result dirs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rl_kernel.bitwise import Diff, diff
from rlparity import results
from rlparity.config import ConfigError


@dataclass(frozen=True)
class CellDelta:
    cell: str
    status_a: str
    status_b: str
    differing: tuple[str, ...]  # digest names whose bits differ

    @property
    def equal(self) -> bool:
        return not self.differing and self.status_a == self.status_b


def load_tensor(path: Path) -> torch.Tensor:
    if not path.is_file():
        raise ConfigError("not a file", path)
    try:
        if path.suffix == ".npy":
            return torch.from_numpy(np.load(path, allow_pickle=False))
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise ConfigError(f"cannot load a tensor: {exc}", path) from exc
    if not isinstance(obj, torch.Tensor):
        raise ConfigError(f"holds a {type(obj).__name__}, not a tensor", path)
    return obj


def compare_tensors(a: Path, b: Path) -> Diff:
    ta, tb = load_tensor(a), load_tensor(b)
    try:
        return diff(ta, tb)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{a} and {b} cannot be compared: {exc}") from exc


def compare_dirs(a: Path, b: Path) -> list[CellDelta]:
    """Cells present in both result dirs, by id: same status and the same digest for every output."""
    ra = {r.cell.id: r for r in _read(a)}
    rb = {r.cell.id: r for r in _read(b)}
    out = []
    for cid in sorted(set(ra) | set(rb)):
        x, y = ra.get(cid), rb.get(cid)
        if x is None or y is None:
            out.append(CellDelta(cid, x.status if x else "absent", y.status if y else "absent", ()))
            continue
        names = sorted(set(x.digests) | set(y.digests))
        out.append(CellDelta(cid, x.status, y.status, tuple(n for n in names if x.digests.get(n) != y.digests.get(n))))
    return out


def _read(d: Path) -> list[results.CellResult]:
    if not (d / "cells").is_dir():
        raise ConfigError("not a results directory (no cells/ inside)", d)
    try:
        return results.read_all(d)
    except ValueError as exc:
        raise ConfigError(str(exc), d) from exc
