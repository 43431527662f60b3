"""mode_ops.index_add_'s GPU kernel: a row's slices added one at a time in source order, in one launch and no host
read.

Why: mode_ops.index_add_ (the reference) makes one pass per occurrence of the most named row, and counts the passes
and each pass's slices on the host: under rl_kernel.mode a mixture of experts' combine (index_add of tokens x top-k
slices into the tokens' rows) is about ten host syncs per layer, each draining the GPU's queue, in every training
step and every decode step. Here the slices are sorted by destination row, stably (torch.sort on the device), and
the program of a row's first sorted slice walks that row's slices in their source order: acc = out[row], then
acc = acc + slice, rounded to out's dtype after every add (what torch's add of two tensors of that dtype rounds), one
writer per row and no atomics. Rows named by no slice keep their values.

The bits are mode_ops.index_add_'s: the same adds in the same order, each one IEEE add of the two values widened to
fp32 (exact for bf16 and fp16; fp32 itself) rounded once. tests/kernels/test_mode_segments.py holds it against the
reference in Triton's interpreter and on a GPU.
"""

from __future__ import annotations

import torch

from rl_kernel._triton import jit as _jit  # where Triton is missing, index_add_ keeps its passes (mode_ops)
from rl_kernel._triton import tl, triton
from rl_kernel.triton_tier import interpreting, launch

BLOCK = 256  # columns of a row per program
TYPES = (torch.float32, torch.bfloat16, torch.float16)


@_jit(do_not_specialize=["n", "rows", "width"])
def _segment_add_kernel(out_ptr, src_ptr, sorted_ptr, slices_ptr, flag_ptr, n, rows, width, BLOCK_C: tl.constexpr):
    """Program (p, c): if sorted entry p is its row's first, that row's columns block c: out[row] + each of the
    row's slices (sorted_ptr: the destination rows sorted, stably; slices_ptr: each sorted entry's source slice), one
    rounded add at a time. A row outside [0, rows) adds nothing and sets flag."""
    p = tl.program_id(0)
    row = tl.load(sorted_ptr + p)
    before = tl.load(sorted_ptr + tl.maximum(p - 1, 0))
    if (p == 0) | (before != row):
        if (row < 0) | (row >= rows):
            tl.store(flag_ptr, 1, mask=tl.program_id(1) == 0)
        else:
            cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
            inside = cols < width
            dst = out_ptr + row.to(tl.int64) * width + cols
            acc = tl.load(dst, mask=inside, other=0.0)
            j = p
            more = p < n
            while more:
                s = tl.load(slices_ptr + j).to(tl.int64)
                add = tl.load(src_ptr + s * width + cols, mask=inside, other=0.0)
                acc = (acc.to(tl.float32) + add.to(tl.float32)).to(out_ptr.dtype.element_ty)
                j += 1
                more = (j < n) & (tl.load(sorted_ptr + tl.minimum(j, n - 1)) == row)
            tl.store(dst, acc, mask=inside)


def available(out: torch.Tensor, dim: int) -> bool:
    """Whether the kernel takes an index_add_ into out: over dim 0 of a contiguous GPU tensor (or a CPU one under
    the interpreter) of a type it adds exactly."""
    return (triton is not None and dim == 0 and out.dtype in TYPES and out.is_contiguous()
            and (out.is_cuda or interpreting()))  # fmt: skip


def index_add_(out: torch.Tensor, index: torch.Tensor, src: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
    """out[index[j]] += src[j] for j in source order, one rounded add at a time (src: out's dtype, [len(index),
    *out.shape[1:]]); in place, no host read. An index outside out's rows adds nothing and sets flag (int32 [1])."""
    n = index.numel()
    width = out[0].numel() if out.shape[0] else 0
    if n == 0:
        return out
    order = torch.sort(index.reshape(-1), stable=True)
    src = src.reshape(n, width).contiguous()
    launch(_segment_add_kernel, (n, max(triton.cdiv(width, BLOCK), 1)), out, src, order.values, order.indices, flag,
           n, out.shape[0], width, BLOCK_C=BLOCK, num_warps=4)  # fmt: skip
    return out
