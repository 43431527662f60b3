"""The exact tier's GEMMs for the fused LM head (rl_kernel.head): its linear kernel, in the unfused head's
configuration."""

from __future__ import annotations

import torch

from rl_kernel._library import ops
from rl_kernel.tiers import HeadGemms


def _t(x: torch.Tensor) -> torch.Tensor:
    return x.t().contiguous()


def _dx(d: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    # fp32 operands: the chain over this chunk's columns in fp32 with no rounding to the model's dtype
    # (bf16 -> fp32 is exact, so each fma is the one the bf16 kernel does).
    return ops.linear(d.float(), _t(w).float(), None)


def gemms() -> HeadGemms:
    return HeadGemms(
        logits=lambda h, w, b, _rows: ops.linear(h, w, b),
        dx=_dx,
        dw=lambda d, h: ops.linear(_t(d), _t(h), None),
        db=lambda d: ops.linear(_t(d), d.new_ones((1, d.shape[0])), None).view(-1),
    )
