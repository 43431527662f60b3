"""The fast tier's RMSNorm: the exact tier's forward (so a row's bits are the same in every batch, and the same as
the exact tier's), with a backward in one Triton pass whose weight gradient is a parallel reduction over the rows.

Why: the exact tier sums dw[j] over the rows in row order, one GPU thread per column (the contract's one fma
chain): 7.0x the stock training step at the Qwen3-1.7B shape. The torch backward that replaced it (fp32 temporaries,
a dozen passes over the activations) still cost 2.2x stock's RMSNorm time on the H200 (bench profile_step,
docs/benchmarks.md). Here one program takes a block of rows of the same length: each row's dx from its own row only
(rstd, g = dy * w and g . x reduced over the row by one fixed tree: a row's dx does not depend on the batch), and
the block's dw partial sum over its rows in ascending order; the partials are then summed over the blocks by
linear's fixed-order column sum. No atomics: the same bits run to run on one architecture, which is the fast
tier's promise for weight gradients.

rms_norm_grads_reference is the same formula in torch (fp32): what the tests hold the kernel to.
"""

from __future__ import annotations

import torch

from rl_kernel._triton import jit as _jit  # Triton where installed: rl_kernel.fast reports it missing on a call
from rl_kernel._triton import tl, triton
from rl_kernel.exact.decoder.ops import rms_norm as exact_rms_norm
from rl_kernel.fast.decoder.linear import colsum, launch_options
from rl_kernel.triton_tier import check_tensors, launch, require_triton

ROWS_PER_BLOCK = 16  # rows per program: dw's partials are blocks of this many rows (a fixed split for each M)


@_jit(do_not_specialize=["M"])
def _rms_norm_backward_kernel(
    x_ptr, w_ptr, dy_ptr, dx_ptr, dwp_ptr, M, H, eps, ROWS: tl.constexpr, BLOCK_H: tl.constexpr
):
    """Rows [pid * ROWS, pid * ROWS + ROWS) of contiguous [M, H] x and dy: dx of each, and the block's dw partial
    sum(dy * xhat) over its rows in ascending order into dwp[pid, :] (fp32)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_H)
    inside = cols < H
    w = tl.load(w_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for r in range(ROWS):
        row = pid * ROWS + r
        live = inside & (row < M)
        at = row.to(tl.int64) * H + cols
        xr = tl.load(x_ptr + at, mask=live, other=0.0)
        x = xr.to(tl.float32)
        dy = tl.load(dy_ptr + at, mask=live, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / H + eps)
        xhat = (x * rstd).to(xr.dtype).to(tl.float32)  # the forward rounds x * rstd before the weight multiply
        g = dy * w
        dot = tl.sum(g * x, axis=0)
        dx = rstd * g - x * (rstd * rstd * rstd * dot / H)
        tl.store(dx_ptr + at, dx.to(dx_ptr.dtype.element_ty), mask=live)
        dw += dy * xhat
    tl.store(dwp_ptr + pid.to(tl.int64) * H + cols, dw, mask=inside)


def rms_norm_grads(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, ...]:
    """(dx, dw) of y = weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype): one pass for dx and the blocks' dw
    partials, then their fixed-order column sum."""
    h = x.shape[-1]
    x2, dy2 = x.reshape(-1, h).contiguous(), dy.reshape(-1, h).contiguous()
    m = x2.shape[0]
    dx = torch.empty_like(x2)
    blocks = triton.cdiv(m, ROWS_PER_BLOCK)
    partials = torch.empty((blocks, h), dtype=torch.float32, device=x.device)
    if m:
        block_h = triton.next_power_of_2(h)
        launch(
            _rms_norm_backward_kernel, (blocks,), x2, weight.contiguous(), dy2, dx, partials, m, h, float(eps),
            ROWS=ROWS_PER_BLOCK, BLOCK_H=block_h, num_warps=4 if block_h <= 1024 else 8, **launch_options(x.device),
        )  # fmt: skip
    return dx.view(x.shape), colsum(partials, weight.dtype)


def rms_norm_grads_reference(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, ...]:
    """The kernel's formula in torch (fp32 temporaries): rstd, xhat rounded as the forward rounds it, g = dy * w,
    dx = rstd * g - x * rstd^3 * (g . x) / H, dw = sum over the rows of dy * xhat."""
    h = x.shape[-1]
    xf, g = x.float(), dy.float() * weight.float()
    rstd = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    xhat = (xf * rstd).to(x.dtype).float()
    dw = (dy.float() * xhat).reshape(-1, h).sum(0)
    dot = (g * xf).sum(-1, keepdim=True)
    dx = rstd * g - xf * (rstd.pow(3) * dot / h)
    return dx.to(x.dtype), dw.to(weight.dtype)


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
        return *_rms_norm_grads_op(dy, x, weight, ctx.eps), None


# The backward as an op of its own: torch.compile traces the autograd.Function's backward too, and a Triton launch
# through the tier's kept launch (its configs, its cache) is no graph; the op is one opaque node (fullgraph=True).
@torch.library.custom_op(
    "rl_kernel_fast::rms_norm_backward", mutates_args=(),
    schema="(Tensor dy, Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)",
)  # fmt: skip
def _rms_norm_grads_op(dy, x, weight, eps):
    return rms_norm_grads(dy, x, weight, eps)


@_rms_norm_grads_op.register_fake
def _(dy, x, weight, eps):
    return torch.empty_like(x), torch.empty_like(weight)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Hugging Face's RMSNorm: the exact tier's forward bits, the fast tier's backward (see the module)."""
    if not (x.requires_grad or weight.requires_grad) or not torch.is_grad_enabled():
        return exact_rms_norm(x, weight, eps)
    check_tensors("fast", "rms_norm", x=x, weight=weight)
    require_triton("fast")
    return _FastRmsNorm.apply(x, weight, float(eps))
