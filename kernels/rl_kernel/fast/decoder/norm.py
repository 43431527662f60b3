"""The fast tier's RMSNorm: the exact tier's forward (so a row's bits are the same in every batch, and the same
as the exact tier's), with a backward whose weight gradient is a parallel reduction over the rows.

Why: the exact tier sums dw[j] over the rows in row order, one GPU thread per column (the contract's one fma
chain). A Qwen3 decoder's q_norm / k_norm have 128 columns over batch x tokens x heads rows (131072 for 8 x 1024
tokens and 16 heads): 128 threads walking 131072 rows each, 56 times a step. On the H200 the fast tier's training
step at the Qwen3-1.7B shape took 7.0x the stock time with it (docs/benchmarks.md). Here dw is torch's column sum
of fp32 products (a fixed reduction for a given shape and device, no atomics: the same bits run to run on one
architecture, which is the fast tier's promise for weight gradients); dx is computed alongside from the same
fp32 terms (a row's dx depends only on that row).
"""

from __future__ import annotations

import torch

from rl_kernel.exact.decoder.ops import rms_norm as exact_rms_norm


class _FastRmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        with torch.no_grad():
            y = exact_rms_norm(x, weight, eps)
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, weight = ctx.saved_tensors
        return *rms_norm_grads(dy, x, weight, ctx.eps), None


def rms_norm_grads(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, ...]:
    """(dx, dw) of y = weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype), in fp32, rounded once to the dtypes."""
    h = x.shape[-1]
    xf, g = x.float(), dy.float() * weight.float()
    rstd = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    xhat = (xf * rstd).to(x.dtype).float()
    dw = (dy.float() * xhat).reshape(-1, h).sum(0)
    dot = (g * xf).sum(-1, keepdim=True)
    dx = rstd * g - xf * (rstd.pow(3) * dot / h)
    return dx.to(x.dtype), dw.to(weight.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Hugging Face's RMSNorm: the exact tier's forward bits, the fast tier's backward (see the module)."""
    if not (x.requires_grad or weight.requires_grad) or not torch.is_grad_enabled():
        return exact_rms_norm(x, weight, eps)
    return _FastRmsNorm.apply(x, weight, float(eps))
