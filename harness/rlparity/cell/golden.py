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
from rlparity.cell import model
from rlparity.cell.controls import logprob_fn
from rlparity.cell.workloads import build_episode, training_logprobs
from rlparity.cells import DEFAULT_WORKLOAD, WORKLOADS
from rlparity.golden import key


def compute(
    shapes: list[tuple[int, int, int]], dtypes: list[str], seed: int = 0, workload: str = DEFAULT_WORKLOAD
) -> dict[str, str]:
    """Digests of the training path's log-probs, gradient and row statistics on the CPU build."""
    out = {}
    for dtype in dtypes:
        for shape in shapes:
            if workload == model.WORKLOAD:
                out |= model_digests(shape, dtype, seed)
                continue
            ep = build_episode(workload, *shape, dtype, seed)
            lp, grad = training_logprobs(ep, logprob_fn("none"), "cpu")
            out[key(dtype, shape, seed, "logprobs", workload)] = digest(lp)
            out[key(dtype, shape, seed, "grad", workload)] = digest(grad)
            stats = rl_kernel.row_stats(ep.logits.reshape(-1, shape[2]))
            out[key(dtype, shape, seed, "stats", workload)] = digest(stats)
    return out


def model_digests(shape: tuple[int, int, int], dtype: str, seed: int) -> dict[str, str]:
    """The model workload's digests for every family (the suite's test_model_golden_digests checks them)."""
    out = {}
    for family in model.FAMILIES:
        for what, d in model.golden_outputs(*model.rl_step(family, shape, dtype, seed, "cpu")).items():
            out[key(dtype, shape, seed, f"{family}/{what}", model.WORKLOAD)] = d
    return out


def _shape(text: str) -> tuple[int, int, int]:
    b, t, v = (int(x) for x in text.split("x"))
    return b, t, v


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m rlparity.cell.golden")
    p.add_argument("--shapes", nargs="+", type=_shape, required=True, help="BxTxV")
    p.add_argument("--dtypes", nargs="+", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workload", default=DEFAULT_WORKLOAD, choices=sorted(WORKLOADS))
    args = p.parse_args(argv)
    print(json.dumps(compute(args.shapes, args.dtypes, args.seed, args.workload)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
