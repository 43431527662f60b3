"""mode_ops.tree_sum's GPU kernel: the same tree (numerics.md section 2's plain sum) in a few Triton launches.

Why: mode_ops.tree_sum is one torch add per level of the tree, so a sum over 131 072 rows (a Qwen3 q_norm weight's
gradient over the tokens and heads) is 17 launches and the pad before them; under rl_kernel.mode a 28-layer model's
RMSNorms ask for ~340 such sums a training step, and the host's launches, not the GPU, set the step's time (bench
profile_step). Here one program reduces a group of G consecutive elements of the reduced axis by the same pairs in
registers, so a pass is log2(G) levels of the tree and a sum is ceil(levels / log2(G)) launches.

The bits are mode_ops.tree_sum's by construction: the row padded with +0 to W = 8 x a power of two of chunks, each
level the sum of neighbouring pairs (left + right); a node past the row is +0 here as there (a masked load), and
every add is one IEEE fp32 add (no fusion: there is nothing to fuse). mode_ops.tree_sum is the reference beside it
(tests/kernels/test_mode_tree.py, in Triton's interpreter and on a GPU).
"""

from __future__ import annotations

import torch

from rl_kernel._triton import jit as _jit  # where Triton is missing, tree_sum falls back to torch's adds (mode_ops)
from rl_kernel._triton import tl, triton
from rl_kernel.exact.common.tree import padded_width
from rl_kernel.triton_tier import interpreting, launch

GROUP_LEVELS = 6  # levels of the tree per pass: a program reduces G = 64 elements of the axis
BLOCK = 64  # independent sums (rows of the last-dim case, columns of the first-dim case) per program
TYPES = (torch.float32, torch.bfloat16, torch.float16)  # read as fp32 (exactly), summed in fp32


@_jit(do_not_specialize=["n", "count", "blocks"])
def _tree_pass_kernel(x_ptr, out_ptr, n, count, blocks, s_n, s_c, o_n, o_c, LEVELS: tl.constexpr,
                      BLOCK_C: tl.constexpr):  # fmt: skip
    """Group g of the reduced axis (elements [g * 2^LEVELS, (g + 1) * 2^LEVELS), +0 past n) for BLOCK_C of the
    `count` independent sums: their tree node LEVELS levels up, into out[g * o_n + c * o_c] (fp32). One grid axis,
    program = g * blocks + the block of sums (a second axis would cap the groups or the blocks at 65 535)."""
    G: tl.constexpr = 1 << LEVELS
    pid = tl.program_id(0).to(tl.int64)
    g = pid // blocks
    c = (pid % blocks) * BLOCK_C + tl.arange(0, BLOCK_C)
    i = g * G + tl.arange(0, G)
    at = i[:, None] * s_n + c[None, :] * s_c
    t = tl.load(x_ptr + at, mask=(i[:, None] < n) & (c[None, :] < count), other=0.0).to(tl.float32)
    for level in tl.static_range(LEVELS):  # unrolled: each level halves the tile, pairs (2j, 2j + 1) of the axis
        left, right = tl.split(tl.permute(tl.reshape(t, (G >> (level + 1), 2, BLOCK_C)), (0, 2, 1)))
        t = left + right
    tl.store(out_ptr + g * o_n + c * o_c, tl.reshape(t, (BLOCK_C,)), mask=c < count)


def available(x: torch.Tensor) -> bool:
    """Whether tree_sum can take x: a GPU tensor (or a CPU one under the interpreter) of a type it reads exactly."""
    return triton is not None and x.dtype in TYPES and (x.is_cuda or interpreting())


def tree_sum(x: torch.Tensor, first: bool) -> torch.Tensor:
    """fp32 sums of x's last dim (first=False) or first dim (first=True, rows of x.shape[1:]) in mode_ops.tree_sum's
    order: the same bits. x is read in its own dtype (bf16 and fp16 widen exactly)."""
    n = x.shape[0] if first else x.shape[-1]
    kept = x.shape[1:] if first else x.shape[:-1]
    x2 = (x.reshape(n, -1) if first else x.reshape(-1, n)).contiguous()
    count = x2.shape[1] if first else x2.shape[0]
    width = padded_width(n)  # mode_ops.tree_adds's: the same tree
    if count == 0:
        return x.new_zeros(kept, dtype=torch.float32)
    while width > 1:
        levels = min(GROUP_LEVELS, width.bit_length() - 1)
        groups = -(-n // (1 << levels))
        out = torch.empty((groups, count) if first else (count, groups), dtype=torch.float32, device=x.device)
        s_n, s_c = (x2.stride(0), x2.stride(1)) if first else (x2.stride(1), x2.stride(0))
        o_n, o_c = (out.stride(0), out.stride(1)) if first else (out.stride(1), out.stride(0))
        blocks = triton.cdiv(count, BLOCK)
        launch(_tree_pass_kernel, (groups * blocks,), x2, out, n, count, blocks, s_n, s_c, o_n, o_c, LEVELS=levels,
               BLOCK_C=BLOCK, num_warps=4)  # fmt: skip
        x2, n, width = out, groups, width >> levels
    return x2.reshape(kept)
