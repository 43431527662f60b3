"""The fast tier's grouped GEMM: a mixture of experts' products, every expert's rows in one launch, each row with the
bits the fast linear gives it alone (rl_kernel.fast.mm of that expert's rows).

    out[rows of g] = a[rows of g] @ b[g]      a [S, K] (tokens sorted by expert), b [E, K, N], offs [E] (group ends)

Why a row's bits depend on nothing but the row and its expert's weight: the K loop is fast.decoder.linear's (the
pointer tile, ascending in steps of the BLOCK_K that config_for pins for (N, K), one dot per step, fp32 from +0,
rounded once), and a tile's rows never meet: how many rows an expert received, where its group starts, which tile
shape covers them change no row. The form is the one fast.mm would pick for one expert's product (mm_form: b[g] the
transpose of a row-major [N, K] weight is the forward, "linear"'s configs; b[g] row-major is dX, "linear_dx"'s), so
these bits are the per-expert loop's.

How a program finds its tile: on the device, from offs, so the host never reads offs (a read is a sync that drains
the GPU's queue at every call). Each program loads the E ends, clamps them into [0, S] and takes their running max (a
decreasing end leaves an empty group: any offs are memory-safe, and the caller checks them, on the host or through a
flag the kernel sets), counts each group's row tiles (cdiv(rows, BLOCK_M)) and is the tile of the group whose
cumulative count (tl.cumsum) first exceeds its program id. The rows past the last group are one more group, stored
as zeros (a K walk of no step). Tiles never outnumber cdiv(S, BLOCK_M) + E, the grid; programs past the last return.

    out[g] = a[:, tokens of g] @ b[tokens of g]      a [M, S], b [S, N], offs [E]: the experts' dW, out [E, M, N]

The experts' dW in one launch too (grouped_dw): each expert's sum over its own tokens in the fast dW's order (the
tokens ascending in steps of linear_dw's pinned BLOCK_K, one dot per step, fp32 from +0, rounded once), A read
K-contiguous as grad_w_2d's pointer path reads it; an expert's tokens never meet another's, so its dW does not depend
on the others. A program's expert is its row tile's quotient by cdiv(M, BLOCK_M), its tokens come from offs on the
device; an expert with no token walks no K step and stores zeros.

    out[i] = a[i] @ b[i]      a [B, M, K], b [B, K, N]: aten::bmm (transformers' batched_mm experts at decode)

B groups of M rows (batched_mm), the group the program id's quotient: each element the bits of fast.mm(a[i], b[i]),
its form (mm_form; every element has the strides of the first) choosing the configs, so its BLOCK_K.
"""

from __future__ import annotations

import torch

from rl_kernel._validate import group_bounds
from rl_kernel.fast.configs import config_for
from rl_kernel.fast.decoder.linear import _jit, _pointer_tile, _store_tile, mm_form, tl, triton
from rl_kernel.triton_tier import launch, target_of

WHERE = "rl_kernel.fast.grouped_mm"


@_jit
def _max(a, b):
    return tl.maximum(a, b)


@_jit
def _ends(offs_ptr, at, E, total):
    """The group ends at slots `at` (a vector): offs clamped into [0, total], a slot before the first 0, a slot past
    the last `total` (where the rows past the groups end), then their running max (a decreasing end: an empty
    group; any offs stay in bounds)."""
    raw = tl.load(offs_ptr + at, mask=(at >= 0) & (at < E), other=0)
    ends = tl.where(at < E, tl.minimum(tl.maximum(raw, 0), total), total)
    return tl.associative_scan(tl.where(at < 0, 0, ends), 0, _max)


@_jit
def _check_offs(offs_ptr, flag_ptr, E, total, GROUPS: tl.constexpr):
    """flag = 1 unless offs are E non-decreasing ends within [0, total] (program (0, 0); read at the mode's exit)."""
    at = tl.arange(0, GROUPS)
    raw = tl.load(offs_ptr + at, mask=at < E, other=0)
    before = tl.load(offs_ptr + at - 1, mask=(at >= 1) & (at < E), other=0)
    bad = tl.sum(((raw < before) | (raw > total)).to(tl.int32), 0)
    first = (tl.program_id(0) == 0) & (tl.program_id(1) == 0)
    tl.store(flag_ptr, 1, mask=(bad > 0) & first)


@_jit(do_not_specialize=["S"])
def _grouped_gemm_kernel(
    a_ptr, b_ptr, c_ptr, offs_ptr, flag_ptr, E, S, N, K, stride_am, stride_ak, stride_bg, stride_bk, stride_bn,
    stride_cm, CHECK: tl.constexpr, EVEN_K: tl.constexpr, GROUPS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Program (i, j): row tile i of the groups found from offs (GROUPS = next_power_of_2(E + 1) slots: the experts
    and the rows past them), column tile j. C[rows of g] = A[rows of g] @ B[g] with _pointer_tile's K loop; the rows
    past the last group zeros."""
    pid = tl.program_id(0)
    if CHECK:
        _check_offs(offs_ptr, flag_ptr, E, S, GROUPS)
    slot = tl.arange(0, GROUPS)
    ends = _ends(offs_ptr, slot, E, S)
    starts = _ends(offs_ptr, slot - 1, E, S)
    tiles = (ends - starts + BLOCK_M - 1) // BLOCK_M
    after = tl.cumsum(tiles, 0)  # the tiles of the groups up to each
    if pid >= tl.sum(tiles, 0):
        return
    g = tl.sum((after <= pid).to(tl.int32), 0)  # the groups whose tiles all come before this one
    mine = slot == g
    start = tl.sum(tl.where(mine, starts, 0), 0)
    rows = tl.sum(tl.where(mine, ends - starts, 0), 0)
    offs_m = (pid - tl.sum(tl.where(mine, after - tiles, 0), 0)) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.where(g < E, K, 0)  # the rows past the last group: no K step, zeros
    a_g = a_ptr + start.to(tl.int64) * stride_am
    b_g = b_ptr + tl.minimum(g, E - 1).to(tl.int64) * stride_bg
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _pointer_tile(a_g, b_g, acc, offs_m, offs_n, rows, N, k, stride_am, stride_ak, stride_bk, stride_bn, EVEN_K,
                        BLOCK_K)  # fmt: skip
    _store_tile(acc, c_ptr + start.to(tl.int64) * stride_cm, c_ptr, offs_m, offs_n, rows, N, stride_cm, 1, False,
                False)  # fmt: skip


@_jit(do_not_specialize=["S"])
def _grouped_dw_kernel(
    a_ptr, b_ptr, c_ptr, offs_ptr, flag_ptr, E, S, M, N, stride_am, stride_ak, stride_bk, stride_bn, stride_cg,
    stride_cm, CHECK: tl.constexpr, GROUPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Program (i, j): expert g = i // cdiv(M, BLOCK_M), its row tile i % cdiv(M, BLOCK_M) of M, column tile j.
    C[g] = A[:, tokens of g] @ B[tokens of g] with _pointer_tile's K loop over the expert's tokens (masked at its end:
    the count is found at run time, not a constexpr); no token: no K step, zeros."""
    pid = tl.program_id(0)
    if CHECK:
        _check_offs(offs_ptr, flag_ptr, E, S, GROUPS)
    tiles_m = tl.cdiv(M, BLOCK_M)
    g = pid // tiles_m
    slot = tl.arange(0, GROUPS)
    ends = _ends(offs_ptr, slot, E, S)
    start = tl.sum(tl.where(slot == g - 1, ends, 0), 0)  # the running max: the group before ends where g starts
    count = tl.sum(tl.where(slot == g, ends, 0), 0) - start
    offs_m = (pid % tiles_m) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _pointer_tile(a_ptr + start.to(tl.int64) * stride_ak, b_ptr + start.to(tl.int64) * stride_bk, acc, offs_m,
                        offs_n, M, N, count, stride_am, stride_ak, stride_bk, stride_bn, False, BLOCK_K)  # fmt: skip
    _store_tile(acc, c_ptr + g.to(tl.int64) * stride_cg, c_ptr, offs_m, offs_n, M, N, stride_cm, 1, False, False)


@_jit
def _batched_gemm_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, stride_ag, stride_am, stride_ak, stride_bg, stride_bk, stride_bn, stride_cg,
    stride_cm, EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Program (i, j): element g = i // cdiv(M, BLOCK_M) of the batch, its row tile i % cdiv(M, BLOCK_M), column tile j.
    C[g] = A[g] @ B[g] with _pointer_tile's K loop."""
    tiles_m = tl.cdiv(M, BLOCK_M)
    pid = tl.program_id(0)
    g = (pid // tiles_m).to(tl.int64)
    offs_m = (pid % tiles_m) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _pointer_tile(a_ptr + g * stride_ag, b_ptr + g * stride_bg, acc, offs_m, offs_n, M, N, K, stride_am,
                        stride_ak, stride_bk, stride_bn, EVEN_K, BLOCK_K)  # fmt: skip
    _store_tile(acc, c_ptr + g * stride_cg, c_ptr, offs_m, offs_n, M, N, stride_cm, 1, False, False)


# ---- launches -------------------------------------------------------------------------------------
def _checked(offs: torch.Tensor, groups: int, total: int, what: str, validate: bool) -> torch.Tensor:
    """offs for the kernels (contiguous); validate: checked first, eagerly (one host read of offs: a sync, a
    ValueError naming WHERE). Without it any offs are memory-safe, and a flag, if given, reports bad ones."""
    if validate:
        group_bounds(offs, groups, total, what, WHERE)
    return offs.contiguous()


def _flag_bad(offs: torch.Tensor, total: int, flag: torch.Tensor | None) -> None:
    """flag |= offs are not non-decreasing ends within [0, total], in torch's operators (a call that launches no
    kernel: nothing to compute, offs still checked); no host read."""
    if flag is None or offs.numel() == 0:
        return
    before = torch.cat([offs.new_zeros(1), offs[:-1]])
    flag.bitwise_or_(((offs < before) | (offs > total)).any().to(flag.dtype))


def grouped_dw(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, validate: bool = True, flag: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """out [E, M, N]: out[g] = a[:, tokens of g] @ b[tokens of g] (a [M, S], b [S, N], offs: each expert's end token),
    one launch; an expert of no token gets zeros. The bits of grad_w_2d's pointer kernel on that expert's tokens.
    validate: _checked's; flag (int32 [1] on a's device): set to 1 by the kernel where offs are bad, no host read;
    out: stored there (every element written)."""
    m, s = a.shape
    n, e = b.shape[1], offs.shape[0]
    offs = _checked(offs, e, s, "tokens", validate)
    out = a.new_empty((e, m, n)) if out is None else out
    if e == 0 or m == 0 or n == 0 or s == 0:
        _flag_bad(offs, s, flag)
        return out.zero_()
    cfg = config_for("linear_dw", target_of(a.device))
    bm, bn = cfg["block_m"], cfg["block_n"]
    # K (the tokens) contiguous, as grad_w_2d's pointer path copies dY^T: the layout whose bits the GPU has shown
    # equal to each expert's fast.mm. (Reading autograd's h^T in place would save this pass and keep each expert's
    # first token aligned; its bits on sm_90 are not yet seen.)
    a = a.contiguous()
    launch(
        _grouped_dw_kernel, (e * triton.cdiv(m, bm), triton.cdiv(n, bn)), a, b, out, offs,
        offs if flag is None else flag, e, s, m, n, a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0),
        out.stride(1), CHECK=flag is not None, GROUPS=triton.next_power_of_2(e), BLOCK_M=bm, BLOCK_N=bn,
        BLOCK_K=cfg["block_k"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **cfg["launch"],
    )  # fmt: skip
    return out


def _form_config(a: torch.Tensor, b: torch.Tensor, m: int, n: int, k: int) -> dict:
    """The config of fast.mm(a, b) for a [m, k] @ b [k, n] of these layouts (its form's, so its BLOCK_K)."""
    form = mm_form(a, b)
    op = {"forward": "linear", "dx": "linear_dx", "dw": "linear_dw"}[form]
    return config_for(op, target_of(a.device), **({} if form == "dw" else {"m": m, "n": n, "k": k}))


def grouped_mm(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, validate: bool = True, flag: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:  # fmt: skip
    """out [S, N]: each expert's rows of a [S, K] times its b[g] [K, N] (offs: each group's end), one launch; rows past
    the last group are zeros. The bits of fast.mm(a[rows of g], b[g]) for every g. validate, flag, out: grouped_dw's."""
    s, k = a.shape
    e, _, n = b.shape
    offs = _checked(offs, e, s, "rows", validate)
    out = a.new_empty((s, n)) if out is None else out
    if e == 0 or s == 0 or n == 0 or k == 0:
        _flag_bad(offs, s, flag)
        return out.zero_()
    # fast.mm's form of an expert's product; the M bucket by an expert's mean rows (no host read of offs): the tile
    # changes no bit, BLOCK_K is the form's for (n, k).
    cfg = _form_config(a, b[0], triton.cdiv(s, e), n, k)
    bm, bn = cfg["block_m"], cfg["block_n"]
    a = a if a.stride(1) == 1 else a.contiguous()
    launch(
        _grouped_gemm_kernel, (triton.cdiv(s, bm) + e, triton.cdiv(n, bn)), a, b, out, offs,
        offs if flag is None else flag, e, s, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), b.stride(2),
        out.stride(0), CHECK=flag is not None, EVEN_K=k % cfg["block_k"] == 0, GROUPS=triton.next_power_of_2(e + 1),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=cfg["block_k"], num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
        **cfg["launch"],
    )  # fmt: skip
    return out


def batched_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """out [B, M, N]: out[i] = a[i] [M, K] @ b[i] [K, N] (aten::bmm), one launch; each element the bits of
    fast.mm(a[i], b[i]) (its form's config: the forward, dX or dW kernel's BLOCK_K), any strides."""
    bs, m, k = a.shape
    n = b.shape[2]
    out = a.new_empty((bs, m, n))
    if bs == 0 or m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    # The bucket by the output's smaller side (speed only: no tile changes a bit): W[ids] @ x.unsqueeze(-1), [M, 1]
    # per element, takes the decode tile, not one 256 columns wide.
    cfg = _form_config(a[0], b[0], min(m, n), n, k)
    bm, bn = cfg["block_m"], cfg["block_n"]
    launch(
        _batched_gemm_kernel, (bs * triton.cdiv(m, bm), triton.cdiv(n, bn)), a, b, out, m, n, k, a.stride(0),
        a.stride(1), a.stride(2), b.stride(0), b.stride(1), b.stride(2), out.stride(0), out.stride(1),
        EVEN_K=k % cfg["block_k"] == 0, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=cfg["block_k"], num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"], **cfg["launch"],
    )  # fmt: skip
    return out
