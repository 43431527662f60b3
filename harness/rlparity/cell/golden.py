"""The golden digests' compute side: the training path's outputs on this machine's CPU build.

`python -m rlparity.cell.golden --shapes BxTxV ... --dtypes fp32 ... --seed N` prints {key: digest} as JSON;
`rlparity golden` (the host, which owns the committed table in rlparity/golden.py) runs it as a subprocess.
"""

from __future__ import annotations

import argparse
import json
import sys

import rl_kernel
from rl_kernel.bitwise import digest
from rlparity.cell.controls import logprob_fn
from rlparity.cell.workloads import BUILDERS, build_episode, training_logprobs
from rlparity.cells import DEFAULT_WORKLOAD
from rlparity.golden import key


def compute(
    shapes: list[tuple[int, int, int]], dtypes: list[str], seed: int = 0, workload: str = DEFAULT_WORKLOAD
) -> dict[str, str]:
    """Digests of the training path's log-probs, gradient and row statistics on the CPU build."""
    out = {}
    for dtype in dtypes:
        for shape in shapes:
            ep = build_episode(workload, *shape, dtype, seed)
            lp, grad = training_logprobs(ep, logprob_fn("none"), "cpu")
            out[key(dtype, shape, seed, "logprobs", workload)] = digest(lp)
            out[key(dtype, shape, seed, "grad", workload)] = digest(grad)
            stats = rl_kernel.row_stats(ep.logits.reshape(-1, shape[2]))
            out[key(dtype, shape, seed, "stats", workload)] = digest(stats)
    return out


def _shape(text: str) -> tuple[int, int, int]:
    b, t, v = (int(x) for x in text.split("x"))
    return b, t, v


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlparity.cell.golden")
    p.add_argument("--shapes", nargs="+", type=_shape, required=True, help="BxTxV")
    p.add_argument("--dtypes", nargs="+", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workload", default=DEFAULT_WORKLOAD, choices=sorted(BUILDERS))
    args = p.parse_args(argv)
    print(json.dumps(compute(args.shapes, args.dtypes, args.seed, args.workload)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
