"""The fast tier's SwiGLU: silu(gate) * up and its backward, one Triton pass each over contiguous elements.

Why: the exact tier's kernels (the contract's exp and reciprocal, a thread per element, 2-byte loads) took 2.1x
stock's SwiGLU time in the training step at the Qwen3-1.7B shape on the H200 (bench profile_step,
docs/benchmarks.md). Here each element is computed from its own gate and up only, in fp32 with Triton's exp on the
target, and rounded once to the dtype: its bits depend on nothing else (not the batch, not the other elements), the
same in rollout and training, per target like every fast-tier kernel. The formulas are the exact tier's
(exact/decoder/swiglu.cuh): s = 1 / (1 + exp(-g)), y = (g * s) * u, dg = (dy * u) * (s + (g * s) * (1 - s)),
du = dy * (g * s). silu_mul_reference is the same in torch (fp32): what the tests hold the kernels to.
"""

from __future__ import annotations

import torch

from rl_kernel.fast.decoder.linear import launch_options
from rl_kernel.triton_tier import check_tensors, require_triton

try:
    import triton
    import triton.language as tl

    _jit = triton.jit
except ImportError:  # rl_kernel.fast reports the missing Triton when a kernel is called
    triton = tl = None

    def _jit(fn=None, **_kw):
        return fn if fn is not None else (lambda f: f)


BLOCK = 2048  # elements per program (8 per thread at 8 warps: 16-byte loads of bf16)
WARPS = 8


@_jit(do_not_specialize=["n"])
def _silu_mul_kernel(g_ptr, u_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    g = tl.load(g_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-g))
    tl.store(y_ptr + offs, ((g * s) * u).to(y_ptr.dtype.element_ty), mask=inside)


@_jit(do_not_specialize=["n"])
def _silu_mul_backward_kernel(dy_ptr, g_ptr, u_ptr, dg_ptr, du_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offs < n
    dy = tl.load(dy_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    g = tl.load(g_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=inside, other=0.0).to(tl.float32)
    s = 1.0 / (1.0 + tl.exp(-g))
    gs = g * s
    tl.store(dg_ptr + offs, ((dy * u) * (s + gs * (1.0 - s))).to(dg_ptr.dtype.element_ty), mask=inside)
    tl.store(du_ptr + offs, (dy * gs).to(du_ptr.dtype.element_ty), mask=inside)


def _grid(n: int) -> tuple[int]:
    return (triton.cdiv(n, BLOCK),)


def forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    g, u = gate.contiguous(), up.contiguous()
    y = torch.empty_like(g)
    if g.numel():
        _silu_mul_kernel[_grid(g.numel())](g, u, y, g.numel(), BLOCK=BLOCK, num_warps=WARPS,
                                           **launch_options(g.device))  # fmt: skip
    return y


def backward(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d, g, u = dy.contiguous(), gate.contiguous(), up.contiguous()
    dg, du = torch.empty_like(g), torch.empty_like(u)
    if g.numel():
        _silu_mul_backward_kernel[_grid(g.numel())](d, g, u, dg, du, g.numel(), BLOCK=BLOCK, num_warps=WARPS,
                                                    **launch_options(g.device))  # fmt: skip
    return dg, du


class _SiluMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(gate, up)
        return forward(gate, up)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        return backward(grad, gate, up)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """SwiGLU's silu(gate) * up in the fast tier (bf16/fp16 on a GPU), rl_kernel.silu_mul's signature."""
    check_tensors("fast", "silu_mul", gate=gate, up=up)
    if gate.shape != up.shape:
        raise ValueError(f"rl_kernel.fast.silu_mul: gate {tuple(gate.shape)} and up {tuple(up.shape)} differ")
    require_triton("fast")
    return _SiluMul.apply(gate, up)


def silu_mul_reference(dy: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The kernels' formulas in torch fp32: (y, dgate, dup), each rounded once to the dtype."""
    g, u, d = gate.float(), up.float(), dy.float()
    s = 1.0 / (1.0 + torch.exp(-g))
    gs = g * s
    return tuple(t.to(gate.dtype) for t in (gs * u, (d * u) * (s + gs * (1.0 - s)), d * gs))
