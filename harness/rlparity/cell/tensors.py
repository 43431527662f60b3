"""`rlparity compare A B` on two saved tensors (torch.save / .npy): the bitwise verdict.

Run by the host as `python -m rlparity.cell.tensors A B` (the host never imports torch or rl_kernel):
prints {"equal", "summary", "diff"} as JSON; exit 3 with the message on stderr when a file cannot be
compared (bad configuration).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from rl_kernel.bitwise import Diff, diff
from rlparity.config import ConfigError

BAD_INPUT = 3  # = gate.CONFIG


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


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print("usage: python -m rlparity.cell.tensors A B", file=sys.stderr)
        return BAD_INPUT
    try:
        d = compare_tensors(Path(argv[0]), Path(argv[1]))
    except ConfigError as exc:
        print(str(exc), file=sys.stderr)
        return BAD_INPUT
    print(json.dumps({"equal": d.equal, "summary": d.summary(), "diff": d.to_dict()}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
