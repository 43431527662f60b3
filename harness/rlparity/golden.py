"""Committed golden digests of the bitwise suite's outputs, per tier (harness/golden/<tier>.json).

The exact tier's digests are one set for every target: CPU, NVIDIA and AMD must all produce them.
They are written from the CPU build with `rlparity golden --update` and reviewed like code.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlparity.config import GOLDEN_DIR

OUTPUTS = ("logprobs", "grad", "stats")  # stats: the row intermediates [max, sum of exp, log of the sum]


def key(dtype: str, shape: tuple[int, int, int], seed: int, what: str) -> str:
    return f"{dtype}/{'x'.join(map(str, shape))}/seed{seed}/{what}"


def path_for(tier: str, root: Path = GOLDEN_DIR) -> Path:
    return root / f"{tier}.json"


def load(tier: str, root: Path = GOLDEN_DIR) -> dict[str, str]:
    p = path_for(tier, root)
    return json.loads(p.read_text()) if p.exists() else {}


def update(tier: str, entries: dict[str, str], root: Path = GOLDEN_DIR) -> Path:
    p = path_for(tier, root)
    merged = {**load(tier, root), **entries}
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(dict(sorted(merged.items())), indent=1) + "\n")
    return p


def compute(shapes: list[tuple[int, int, int]], dtypes: list[str], seed: int = 0) -> dict[str, str]:
    """Digests of the training path's log-probs, gradient and row statistics on the CPU build."""
    import rl_kernel
    from rl_kernel.bitwise import digest
    from rlparity.variants import logprob_fn
    from rlparity.workloads import make_episode, training_logprobs

    out = {}
    for dtype in dtypes:
        for shape in shapes:
            ep = make_episode(*shape, dtype, seed)
            lp, grad = training_logprobs(ep, logprob_fn("none"), "cpu")
            out[key(dtype, shape, seed, "logprobs")] = digest(lp)
            out[key(dtype, shape, seed, "grad")] = digest(grad)
            out[key(dtype, shape, seed, "stats")] = digest(rl_kernel.row_stats(ep.logits.reshape(-1, shape[2])))
    return out
