"""The fast tier's GEMMs for the fused LM head (rl_kernel.head): its Triton linear kernels, each in the configuration
the unfused head's linear takes, so a chunk sums in the unfused order."""

from __future__ import annotations

import torch

from rl_kernel.fast import NAME
from rl_kernel.fast.configs import config_for
from rl_kernel.fast.decoder import linear as fl
from rl_kernel.tiers import HeadGemms
from rl_kernel.triton_tier import check_tensors, require_triton, target_of


def _logits(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, rows: int) -> torch.Tensor:
    # BLOCK_K is pinned per (N, K): the whole head's N, so a chunk sums in the unfused head's order.
    cfg = config_for("linear", target_of(h.device), m=h.shape[0], n=rows, k=h.shape[1])
    return fl.forward_2d(h, w, b, cfg)


def _check(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    check_tensors(NAME, "lm_head_logprobs", hidden=hidden, weight=weight, bias=bias)
    require_triton(NAME)


# Logits per call of the head's walk: two 2048-column chunks at 8192 tokens (64 MB in bf16 per buffer; a call
# holds about four), one chunk from 16384 tokens on. Fewer calls, fewer launches: the bits are the same (the head
# adds each chunk's dX partial to dHidden in order).
CALL_ELEMENTS = 1 << 25


def gemms() -> HeadGemms:
    return HeadGemms(
        logits=_logits,
        dx=lambda d, w: fl.grad_x_2d(d, w, out_dtype=torch.float32),
        dx_add=fl.add_grad_x_2d,
        dw=lambda d, h: fl.grad_w_2d(d, h),
        dw_into=lambda d, h, out: fl.grad_w_2d(d, h, out=out),
        db=fl.grad_b_2d,
        dw_chain=fl.grad_w_chain,
        dw_rows=fl.dw_rows,
        check=_check,
        call_elements=CALL_ELEMENTS,
    )
