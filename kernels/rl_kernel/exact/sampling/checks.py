"""The sampling family's checks: SPECS (rl_kernel.exact.sampling.ops's gumbel_argmax as the tests, selfcheck and
golden digests see it), on the softmax family's cases."""

from __future__ import annotations

import torch

from rl_kernel.exact.sampling.ops import gumbel_argmax
from rl_kernel.exact.softmax import checks as softmax
from rl_kernel.spec import OpSpec

FAMILY = "sampling"
SPEC_SEED, SPEC_STEP = 20261201, 7  # the seed and step of the checked and golden draws


def _row_keys(x: torch.Tensor) -> torch.Tensor:
    """Keys that are not the row numbers (a sequence id is any int64): 7919 * row + 3."""
    return torch.arange(x.shape[0], device=x.device) * 7919 + 3


SPECS = (
    OpSpec(
        "gumbel_argmax",
        FAMILY,
        lambda x, c: gumbel_argmax(x, SPEC_SEED, SPEC_STEP, _row_keys(x)),
        None,
        softmax.golden_case,
        softmax.check_case,
        softmax.GOLDEN_VOCABS,
    ),
)
