"""The golden digests' compute side: each workload's own golden function (rlparity.cell.workloads), on this
machine's CPU build (or a device, for a per-target tier).

`python -m rlparity.cell.golden --workload NAME --shapes BxTxV ... --dtypes fp32 ... --seed N [--params JSON]`
prints {key: digest} as JSON; `rlparity golden` (the host, which owns the committed table in rlparity/golden.py)
runs it as a subprocess.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rlparity.cell import workloads
from rlparity.cells import DEFAULT_WORKLOAD
from rlparity.golden import key


def compute(
    shapes: list[tuple[int, int, int]],
    dtypes: list[str],
    seed: int = 0,
    workload: str = DEFAULT_WORKLOAD,
    params: dict[str, Any] | None = None,
    tier: str = "exact",
) -> dict[str, str]:
    """Every digest the workload commits in the tier, for each shape and dtype, keyed by rlparity.golden.key."""
    w = workloads.get(workload)
    if w.golden is None:
        return {}
    resolved = w.resolve(params or {})
    out = {}
    for dtype in dtypes:
        for shape in shapes:
            for what, d in w.golden(shape, dtype, seed, resolved, tier).items():
                out[key(dtype, shape, seed, what, workload)] = d
    return out


def _shape(text: str) -> tuple[int, int, int]:
    b, t, v = (int(x) for x in text.split("x"))
    return b, t, v


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlparity.cell.golden")
    p.add_argument("--shapes", nargs="+", type=_shape, required=True, help="BxTxV")
    p.add_argument("--dtypes", nargs="+", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workload", default=DEFAULT_WORKLOAD)
    p.add_argument("--params", type=json.loads, default={}, help="the workload's parameters (JSON)")
    p.add_argument("--tier", default="exact", help="an all-devices tier (its digests are computed on the CPU)")
    args = p.parse_args(argv)
    print(json.dumps(compute(args.shapes, args.dtypes, args.seed, args.workload, args.params, args.tier)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
