"""The fast tier's grouped GEMM: a mixture of experts' products, every expert's rows in one launch, each row with the
bits the fast linear gives it alone (rl_kernel.fast.mm of that expert's rows).

    out[rows of g] = a[rows of g] @ b[g]      a [S, K] (tokens sorted by expert), b [E, K, N], offs [E] (group ends)

Why a row's bits depend on nothing but the row and its expert's weight: the K loop is fast.decoder.linear's (the
pointer tile, ascending in steps of the BLOCK_K that config_for pins for (N, K), one dot per step, fp32 from +0,
rounded once), and a tile's rows never meet: how many rows an expert received, where its group starts, which tile
shape covers them change no row. The form is the one fast.mm would pick for one expert's product (mm_form: b[g] the
transpose of a row-major [N, K] weight is the forward, "linear"'s configs; b[g] row-major is dX, "linear_dx"'s), so
these bits are the per-expert loop's.

    out[g] = a[:, tokens of g] @ b[tokens of g]      a [M, S], b [S, N], offs [E]: the experts' dW, out [E, M, N]

The experts' dW in one launch too (grouped_dw): each expert's sum over its own tokens in the fast dW's order (the
tokens ascending in steps of linear_dw's pinned BLOCK_K, one dot per step, fp32 from +0, rounded once), A read
K-contiguous as grad_w_2d's pointer path reads it; an expert's tokens never meet another's, so its dW does not depend
on the others. An expert with no token gets zeros.
"""

from __future__ import annotations

import torch

from rl_kernel._validate import group_bounds
from rl_kernel.fast.configs import config_for
from rl_kernel.fast.decoder.linear import _jit, _pointer_tile, _store_tile, mm_form, tl, triton
from rl_kernel.triton_tier import launch, target_of

WHERE = "rl_kernel.fast.grouped_mm"


@_jit
def _tile(table_ptr, tiles, BLOCK_M: tl.constexpr):
    """Program i's column of the host's table (int64 [4, tiles], _table): its expert, the expert's first row (or
    token), their count, and the tile's rows."""
    pid = tl.program_id(0)
    first = tl.load(table_ptr + 3 * tiles + pid)
    return (tl.load(table_ptr + pid), tl.load(table_ptr + tiles + pid), tl.load(table_ptr + 2 * tiles + pid),
            first + tl.arange(0, BLOCK_M))  # fmt: skip


@_jit(do_not_specialize=["tiles"])
def _grouped_gemm_kernel(
    a_ptr, b_ptr, c_ptr, table_ptr, tiles, N, K, stride_am, stride_ak, stride_bg, stride_bk, stride_bn, stride_cm,
    EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Program (i, j): row tile i of the host's table (int64 [4, tiles]: its expert g, g's first row in A and C, g's
    row count, the tile's first row within the group), column tile j. C[rows of g] = A[rows of g] @ B[g] with
    _pointer_tile's K loop."""
    g, start, rows, offs_m = _tile(table_ptr, tiles, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _pointer_tile(a_ptr + start * stride_am, b_ptr + g * stride_bg, acc, offs_m, offs_n, rows, N, K, stride_am,
                        stride_ak, stride_bk, stride_bn, EVEN_K, BLOCK_K)  # fmt: skip
    _store_tile(acc, c_ptr + start * stride_cm, c_ptr, offs_m, offs_n, rows, N, stride_cm, 1, False, False)


@_jit(do_not_specialize=["tiles"])
def _grouped_dw_kernel(
    a_ptr, b_ptr, c_ptr, table_ptr, tiles, M, N, stride_am, stride_ak, stride_bk, stride_bn, stride_cg, stride_cm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Program (i, j): row tile i of the host's table (int64 [4, tiles]: its expert g, g's first token, g's token
    count, the tile's first row of M), column tile j. C[g] = A[:, tokens of g] @ B[tokens of g] with _pointer_tile's
    K loop over the expert's tokens (masked at its end: the count is the launch's, not a constexpr)."""
    g, start, count, offs_m = _tile(table_ptr, tiles, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _pointer_tile(a_ptr + start * stride_ak, b_ptr + start * stride_bk, acc, offs_m, offs_n, M, N, count,
                        stride_am, stride_ak, stride_bk, stride_bn, False, BLOCK_K)  # fmt: skip
    _store_tile(acc, c_ptr + g * stride_cg, c_ptr, offs_m, offs_n, M, N, stride_cm, 1, False, False)


def _groups(offs: torch.Tensor, groups: int, total: int, what: str) -> list[tuple[int, int, int]]:
    """(expert, first row or token, count) of every expert that got any (one host read of offs)."""
    return [(g, lo, hi - lo) for g, (lo, hi) in enumerate(group_bounds(offs, groups, total, what, WHERE)) if hi > lo]


def _table(spans: list[tuple[int, int, int]], rows_of, block_m: int, device: torch.device) -> torch.Tensor:
    """The kernels' tile table (int64 [4, tiles], one copy to the device): a column per BLOCK_M rows of each span's
    output, rows_of(count) of them (an expert's rows in the forward, M in the dW)."""
    tiles = [(g, lo, count, r) for g, lo, count in spans for r in range(0, rows_of(count), block_m)]
    return torch.tensor(tiles, dtype=torch.int64).t().contiguous().to(device)


def grouped_dw(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """out [E, M, N]: out[g] = a[:, tokens of g] @ b[tokens of g] (a [M, S], b [S, N], offs: each expert's end token),
    one launch; an expert of no token gets zeros. The bits of grad_w_2d's pointer kernel on that expert's tokens."""
    m, s = a.shape
    n, e = b.shape[1], offs.shape[0]
    out = a.new_zeros((e, m, n))
    spans = _groups(offs, e, s, "tokens")
    if not spans or m == 0 or n == 0:
        return out
    cfg = config_for("linear_dw", target_of(a.device))
    bm, bn = cfg["block_m"], cfg["block_n"]
    table = _table(spans, lambda _: m, bm, a.device)
    a = a.contiguous()  # K (the tokens) contiguous, as grad_w_2d's pointer path copies dY^T
    tiles = table.shape[1]
    launch(
        _grouped_dw_kernel, (tiles, triton.cdiv(n, bn)), a, b, out, table, tiles, m, n, a.stride(0),
        a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1), BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_K=cfg["block_k"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **cfg["launch"],
    )  # fmt: skip
    return out


def grouped_mm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """out [S, N]: each expert's rows of a [S, K] times its b[g] [K, N] (offs: each group's end), one launch; rows past
    the last group are zeros. The bits of fast.mm(a[rows of g], b[g]) for every g."""
    s, k = a.shape
    e, _, n = b.shape
    out = a.new_zeros((s, n))
    spans = _groups(offs, e, s, "rows")
    if not spans or n == 0 or k == 0:
        return out
    form = "linear" if mm_form(a, b[0]) == "forward" else "linear_dx"
    cfg = config_for(form, target_of(a.device), m=max(rows for *_, rows in spans), n=n, k=k)
    bm, bn = cfg["block_m"], cfg["block_n"]
    table = _table(spans, lambda rows: rows, bm, a.device)
    a = a if a.stride(1) == 1 else a.contiguous()
    tiles = table.shape[1]
    launch(
        _grouped_gemm_kernel, (tiles, triton.cdiv(n, bn)), a, b, out, table, tiles, n, k, a.stride(0),
        a.stride(1), b.stride(0), b.stride(1), b.stride(2), out.stride(0), EVEN_K=k % cfg["block_k"] == 0,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=cfg["block_k"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        **cfg["launch"],
    )  # fmt: skip
    return out
