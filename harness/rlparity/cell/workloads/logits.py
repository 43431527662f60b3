"""What the two logits workloads (plain, edges) share: their golden digests over an episode of logits
(rlparity.cell.episodes) and their suite, rlparity/cell/suite/test_bitwise.py."""

from __future__ import annotations

from typing import Any

import rl_kernel
from rl_kernel.bitwise import digest
from rlparity.cell.controls import logprob_fn
from rlparity.cell.episodes import build_episode, training_logprobs
from rlparity.cell.workloads import SUITE_DIR, GoldenFn

SUITE = (SUITE_DIR / "test_bitwise.py",)
NEEDS = ("token_logprobs", "row_stats")


def golden_for(workload: str) -> GoldenFn:
    """The training path's log-probs, gradient and row statistics on the CPU build, for one shape."""

    def golden(shape: tuple[int, int, int], dtype: str, seed: int, params: dict[str, Any], tier: str) -> dict[str, str]:
        ep = build_episode(workload, *shape, dtype, seed)
        lp, grad = training_logprobs(ep, logprob_fn("none", tier), "cpu")
        stats = rl_kernel.row_stats(ep.logits.reshape(-1, shape[2]))
        return {"logprobs": digest(lp), "grad": digest(grad), "stats": digest(stats)}

    return golden
