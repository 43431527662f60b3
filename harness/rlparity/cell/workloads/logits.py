"""What the logits workloads (plain, edges) share: their suite, rlparity/cell/suite/test_bitwise.py, over an
episode of logits their own builder makes (rlparity.cell.episodes), and their golden digests of it. A logits
workload's descriptor is `logits_workload(name, episode builder, description)`."""

from __future__ import annotations

from typing import Any

import rl_kernel
from rl_kernel.bitwise import digest
from rlparity.cell.controls import logprob_fn
from rlparity.cell.episodes import training_logprobs
from rlparity.cell.workloads import SUITE_DIR, EpisodeFn, GoldenFn, Workload

SUITE = (SUITE_DIR / "test_bitwise.py",)
NEEDS = ("token_logprobs", "row_stats")


def logits_workload(name: str, episode: EpisodeFn, description: str) -> Workload:
    """A workload that runs the bitwise suite over the episodes `episode` builds, committing golden digests."""
    return Workload(name, SUITE, golden_for(episode), needs=NEEDS, description=description, episode=episode)


def golden_for(episode: EpisodeFn) -> GoldenFn:
    """The training path's log-probs, gradient and row statistics on the CPU build, for one shape."""

    def golden(shape: tuple[int, int, int], dtype: str, seed: int, params: dict[str, Any], tier: str) -> dict[str, str]:
        ep = episode(*shape, dtype, seed)
        lp, grad = training_logprobs(ep, logprob_fn("none", tier), "cpu")
        stats = rl_kernel.row_stats(ep.logits.reshape(-1, shape[2]))
        return {"logprobs": digest(lp), "grad": digest(grad), "stats": digest(stats)}

    return golden
