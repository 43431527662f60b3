"""The fast tier's negative control "split-k" (tier.py's controls; chosen by RL_KERNEL_CONTROL=split-k): the linear's
K range cut in two halves, each half's product rounded and the two added. A split-K is another reduction order; the
gate must catch it (the same kernels, so it runs wherever the tier does)."""

from __future__ import annotations

import torch

from rl_kernel.fast import NAME
from rl_kernel.fast.decoder import linear as linear_kernels
from rl_kernel.triton_tier import check_tensors, require_triton


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    check_tensors(NAME, "linear", x=x, weight=weight, bias=bias)
    require_triton(NAME)
    half = weight.shape[1] // 2
    low = linear_kernels.linear(x[..., :half], weight[:, :half], None)
    high = linear_kernels.linear(x[..., half:], weight[:, half:], bias)
    return (low.float() + high.float()).to(x.dtype)


def mm(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The mode's products (rl_kernel.fast.mm) through the split linear, so the control reaches rl_kernel.mode too."""
    return linear(a, b.t(), bias)
