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
as zeros (a K walk of no step). Row tiles never outnumber cdiv(S, BLOCK_M) + E, the grid's rows; programs past the
last return.

    out[g] = a[:, tokens of g] @ b[tokens of g]      a [M, S], b [S, N], offs [E]: the experts' dW, out [E, M, N]

The experts' dW in one launch too (grouped_dw): each expert's sum over its own tokens in the fast dW's order (the
tokens ascending in steps of linear_dw's pinned BLOCK_K, one dot per step, fp32 from +0, rounded once), A read
K-contiguous as grad_w_2d's pointer path reads it; an expert's tokens never meet another's, so its dW does not depend
on the others. A program's expert is its id's quotient by the expert's tile count, its tokens come from offs on the
device; an expert with no token walks no K step and stores zeros.

Both grids are 1-D and ordered for L2: a row tile's column tiles (the dW: an expert's tiles) run together, so each
operand tile comes from HBM about once. The order fixes no bit: a tile's K walk is its own.

    out[i] = a[i] @ b[i]      a [B, M, K], b [B, K, N]: aten::bmm (transformers' batched_mm experts at decode)

B groups of M rows (batched_mm), the group the program id's quotient: each element the bits of fast.mm(a[i], b[i]),
its form (mm_form; every element has the strides of the first) choosing the configs, so its BLOCK_K.
"""

from __future__ import annotations

import torch

from rl_kernel._validate import group_bounds
from rl_kernel.fast.configs import config_for
from rl_kernel.fast.decoder.linear import _described, _jit, _pointer_tile, _store_tile, mm_form, tl, triton
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


@_jit
def _group_tile(offs_ptr, pid, E, S, GROUPS: tl.constexpr, BLOCK_M: tl.constexpr):
    """Row tile `pid` of the groups found from offs (GROUPS = next_power_of_2(E + 1) slots: the experts and the rows
    past them): (its group g, the group's first row, its row count, the tile's first row within the group, whether
    the tile exists: programs past the last tile have none)."""
    slot = tl.arange(0, GROUPS)
    ends = _ends(offs_ptr, slot, E, S)
    starts = _ends(offs_ptr, slot - 1, E, S)
    tiles = (ends - starts + BLOCK_M - 1) // BLOCK_M
    after = tl.cumsum(tiles, 0)  # the tiles of the groups up to each
    g = tl.sum((after <= pid).to(tl.int32), 0)  # the groups whose tiles all come before this one
    mine = slot == g
    start = tl.sum(tl.where(mine, starts, 0), 0)
    rows = tl.sum(tl.where(mine, ends - starts, 0), 0)
    first = (pid - tl.sum(tl.where(mine, after - tiles, 0), 0)) * BLOCK_M
    return g, start, rows, first, pid < tl.sum(tiles, 0)


@_jit
def _row_col(N, BLOCK_N: tl.constexpr):
    """(row tile, column tile) of this program in a 1-D grid, the column tiles of one row tile consecutive: they run
    together and share that row tile's A from L2 (a 2-D grid walks every row tile of one column first, and A, 256 MB
    at OLMoE's 65536 rows, came from HBM once per column tile). The order of the tiles changes no bit."""
    tiles_n = tl.cdiv(N, BLOCK_N)
    return tl.program_id(0) // tiles_n, tl.program_id(0) % tiles_n


@_jit
def _expert_row_col(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(expert, row tile, column tile) of this program in the dW's 1-D grid, an expert's tiles consecutive (its
    tokens' A and B, a few MB, read from HBM once and shared from L2), columns fastest. No bit depends on it."""
    tiles_n = tl.cdiv(N, BLOCK_N)
    per_expert = tl.cdiv(M, BLOCK_M) * tiles_n
    mine = tl.program_id(0) % per_expert
    return tl.program_id(0) // per_expert, mine // tiles_n, mine % tiles_n


@_jit(do_not_specialize=["S"])
def _grouped_gemm_kernel(
    a_ptr, b_ptr, c_ptr, offs_ptr, flag_ptr, E, S, N, K, stride_am, stride_ak, stride_bg, stride_bk, stride_bn,
    stride_cm, CHECK: tl.constexpr, EVEN_K: tl.constexpr, GROUPS: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Program (i, j) (_row_col): row tile i of the groups found from offs (_group_tile), column tile j. C[rows of g] =
    A[rows of g] @ B[g] with _pointer_tile's K loop; the rows past the last group zeros."""
    if CHECK:
        _check_offs(offs_ptr, flag_ptr, E, S, GROUPS)
    i, j = _row_col(N, BLOCK_N)
    g, start, rows, first, live = _group_tile(offs_ptr, i, E, S, GROUPS, BLOCK_M)
    if not live:
        return
    offs_m = first + tl.arange(0, BLOCK_M)
    offs_n = j * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.where(g < E, K, 0)  # the rows past the last group: no K step, zeros
    a_g = a_ptr + start.to(tl.int64) * stride_am
    b_g = b_ptr + tl.minimum(g, E - 1).to(tl.int64) * stride_bg
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _pointer_tile(a_g, b_g, acc, offs_m, offs_n, rows, N, k, stride_am, stride_ak, stride_bk, stride_bn, EVEN_K,
                        BLOCK_K)  # fmt: skip
    _store_tile(acc, c_ptr + start.to(tl.int64) * stride_cm, c_ptr, offs_m, offs_n, rows, N, stride_cm, 1, False,
                False)  # fmt: skip


@_jit
def _described_a(a_desc, k, off_m, A_T: tl.constexpr):
    """A's tile [BLOCK_M, BLOCK_K] at row off_m, column k, from a descriptor of A or (A_T) of A^T."""
    return a_desc.load([k, off_m]).T if A_T else a_desc.load([off_m, k])


@_jit
def _described_b(b_desc, k, off_n, B_T: tl.constexpr):
    """B's tile [BLOCK_K, BLOCK_N] at row k, column off_n, from a descriptor of B or (B_T) of B^T."""
    return b_desc.load([off_n, k]).T if B_T else b_desc.load([k, off_n])


@_jit
def _described_tile(a_desc, b_desc, acc, off_m, off_n, a_k, b_k, K, A_T: tl.constexpr, B_T: tl.constexpr,
                    BLOCK_K: tl.constexpr):  # fmt: skip
    """acc + the tile of A[:, a_k + k] @ B[b_k + k, :] over k in [0, K), operands by TMA: _pointer_tile's K loop (K
    ascending in steps of BLOCK_K, one dot per step). Past K the descriptors may hold another expert's elements (its
    weight rows, its tokens): the last partial step keeps only k < K, zeros elsewhere, as the masked loads do."""
    full = K // BLOCK_K * BLOCK_K
    for k0 in range(0, full, BLOCK_K):
        a = _described_a(a_desc, a_k + k0, off_m, A_T)
        b = _described_b(b_desc, b_k + k0, off_n, B_T)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    if full < K:
        inside = full + tl.arange(0, BLOCK_K) < K
        a = tl.where(inside[None, :], _described_a(a_desc, a_k + full, off_m, A_T), 0.0)
        b = tl.where(inside[:, None], _described_b(b_desc, b_k + full, off_n, B_T), 0.0)
        acc = tl.dot(a, b, acc, input_precision="ieee")
    return acc


@_jit(do_not_specialize=["S"])
def _grouped_gemm_tma_kernel(
    a_desc, b_desc, c_ptr, offs_ptr, flag_ptr, E, S, N, K, stride_cm, CHECK: tl.constexpr, B_T: tl.constexpr,
    GROUPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """_grouped_gemm_kernel's tiles and arithmetic, its operands by TMA (sm_90): a_desc holds A [S, K]; b_desc the
    experts' B stacked, [E * K, N], or (B_T) their B^T stacked, [E * N, K] (a weight's own rows). A tile's rows past
    its group and columns past N read a neighbour's elements: never stored."""
    if CHECK:
        _check_offs(offs_ptr, flag_ptr, E, S, GROUPS)
    i, j = _row_col(N, BLOCK_N)
    g, start, rows, first, live = _group_tile(offs_ptr, i, E, S, GROUPS, BLOCK_M)
    if not live:
        return
    offs_m = first + tl.arange(0, BLOCK_M)
    off_n = j * BLOCK_N
    offs_n = off_n + tl.arange(0, BLOCK_N)
    k = tl.where(g < E, K, 0)  # the rows past the last group: no K step, zeros
    e = tl.minimum(g, E - 1)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if B_T:
        acc = _described_tile(a_desc, b_desc, acc, start + first, e * N + off_n, 0, 0, k, False, True, BLOCK_K)
    else:
        acc = _described_tile(a_desc, b_desc, acc, start + first, off_n, 0, e * K, k, False, False, BLOCK_K)
    _store_tile(acc, c_ptr + start.to(tl.int64) * stride_cm, c_ptr, offs_m, offs_n, rows, N, stride_cm, 1, False,
                False)  # fmt: skip


@_jit
def _expert_tokens(offs_ptr, g, E, S, GROUPS: tl.constexpr):
    """(first token, token count) of expert g, from offs on the device."""
    slot = tl.arange(0, GROUPS)
    ends = _ends(offs_ptr, slot, E, S)
    start = tl.sum(tl.where(slot == g - 1, ends, 0), 0)  # the running max: the group before ends where g starts
    return start, tl.sum(tl.where(slot == g, ends, 0), 0) - start


@_jit(do_not_specialize=["S"])
def _grouped_dw_kernel(
    a_ptr, b_ptr, c_ptr, offs_ptr, flag_ptr, E, S, M, N, stride_am, stride_ak, stride_bk, stride_bn, stride_cg,
    stride_cm, CHECK: tl.constexpr, GROUPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    """Program (g, i, j) (_expert_row_col): expert g, its row tile i of M, column tile j. C[g] = A[:, tokens of g] @
    B[tokens of g] with _pointer_tile's K loop over the expert's tokens (masked at its end: the count is found at run
    time, not a constexpr); no token: no K step, zeros."""
    if CHECK:
        _check_offs(offs_ptr, flag_ptr, E, S, GROUPS)
    g, i, j = _expert_row_col(M, N, BLOCK_M, BLOCK_N)
    start, count = _expert_tokens(offs_ptr, g, E, S, GROUPS)
    offs_m = i * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = j * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _pointer_tile(a_ptr + start.to(tl.int64) * stride_ak, b_ptr + start.to(tl.int64) * stride_bk, acc, offs_m,
                        offs_n, M, N, count, stride_am, stride_ak, stride_bk, stride_bn, False, BLOCK_K)  # fmt: skip
    _store_tile(acc, c_ptr + g.to(tl.int64) * stride_cg, c_ptr, offs_m, offs_n, M, N, stride_cm, 1, False, False)


@_jit(do_not_specialize=["S"])
def _grouped_dw_tma_kernel(
    a_desc, b_desc, c_ptr, offs_ptr, flag_ptr, E, S, M, N, stride_cg, stride_cm, CHECK: tl.constexpr,
    GROUPS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    """_grouped_dw_kernel's tiles and arithmetic, its operands by TMA (sm_90): a_desc holds A^T [S, M] (the tokens'
    rows autograd transposes, read in place), b_desc B [S, N]. The K walk over the expert's tokens from its first;
    the next expert's tokens in the last partial step are zeroed (_described_tile)."""
    if CHECK:
        _check_offs(offs_ptr, flag_ptr, E, S, GROUPS)
    g, i, j = _expert_row_col(M, N, BLOCK_M, BLOCK_N)
    start, count = _expert_tokens(offs_ptr, g, E, S, GROUPS)
    off_m = i * BLOCK_M
    off_n = j * BLOCK_N
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc = _described_tile(a_desc, b_desc, acc, off_m, off_n, start, start, count, True, False, BLOCK_K)
    _store_tile(acc, c_ptr + g.to(tl.int64) * stride_cg, c_ptr, off_m + tl.arange(0, BLOCK_M),
                off_n + tl.arange(0, BLOCK_N), M, N, stride_cm, 1, False, False)  # fmt: skip


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
    out: torch.Tensor | None = None, tiles: dict | None = None,
) -> torch.Tensor:  # fmt: skip
    """out [E, M, N]: out[g] = a[:, tokens of g] @ b[tokens of g] (a [M, S], b [S, N], offs: each expert's end token),
    one launch; an expert of no token gets zeros. The bits of grad_w_2d's pointer kernel on that expert's tokens.
    validate: _checked's; flag (int32 [1] on a's device): set to 1 by the kernel where offs are bad, no host read;
    out: stored there (every element written); tiles: grouped_mm's."""
    m, s = a.shape
    n, e = b.shape[1], offs.shape[0]
    offs = _checked(offs, e, s, "tokens", validate)
    out = a.new_empty((e, m, n)) if out is None else out
    if e == 0 or m == 0 or n == 0 or s == 0:
        _flag_bad(offs, s, flag)
        return out.zero_()
    cfg = _with_tiles(config_for("linear_dw", target_of(a.device)), tiles)
    bm, bn, bk = cfg["block_m"], cfg["block_n"], cfg["block_k"]
    grid = (e * triton.cdiv(m, bm) * triton.cdiv(n, bn),)  # _expert_row_col's 1-D order
    check = {"CHECK": flag is not None, "GROUPS": triton.next_power_of_2(e)}
    tiles = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": cfg["num_warps"],
             "num_stages": cfg["num_stages"], **cfg["launch"]}  # fmt: skip
    descs = _tma_pair(a.device, (a.t(), [bk, bm]), (b, [bk, bn]))  # A^T: the tokens' rows autograd hands, in place
    if descs is not None:
        launch(_grouped_dw_tma_kernel, grid, *descs, out, offs, offs if flag is None else flag, e, s, m, n,
               out.stride(0), out.stride(1), **check, **tiles)  # fmt: skip
        return out
    # The pointer kernel reads A K-contiguous (the tokens), as grad_w_2d's pointer path copies dY^T.
    a = a.contiguous()
    launch(
        _grouped_dw_kernel, grid, a, b, out, offs, offs if flag is None else flag, e, s, m, n, a.stride(0),
        a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1), **check, **tiles,
    )  # fmt: skip
    return out


def _tma_pair(device: torch.device, a: tuple, b: tuple | None) -> tuple | None:
    """TMA descriptors of (tensor, block) a and b where the target reads by TMA (its dW config's tma: sm_90) and
    both tensors are TMA-readable; else None (the pointer kernel: the same bits)."""
    if b is None or not config_for("linear_dw", target_of(device)).get("tma"):
        return None
    da, db = _described(*a), _described(*b)
    return None if da is None or db is None else (da, db)


def _form_config(a: torch.Tensor, b: torch.Tensor, m: int, n: int, k: int) -> dict:
    """The config of fast.mm(a, b) for a [m, k] @ b [k, n] of these layouts (its form's, so its BLOCK_K)."""
    form = mm_form(a, b)
    op = {"forward": "linear", "dx": "linear_dx", "dw": "linear_dw"}[form]
    return config_for(op, target_of(a.device), **({} if form == "dw" else {"m": m, "n": n, "k": k}))


SPEED_KNOBS = frozenset({"block_m", "block_n", "num_warps", "num_stages"})  # what a tile sweep may change


def _with_tiles(cfg: dict, tiles: dict | None) -> dict:
    """cfg with a sweep's speed-only knobs (SPEED_KNOBS); BLOCK_K, which fixes the K order and so the bits, never."""
    if tiles and set(tiles) - SPEED_KNOBS:
        raise ValueError(f"{WHERE}: tiles may set {sorted(SPEED_KNOBS)} only (BLOCK_K pins the bits), got "
                         f"{sorted(set(tiles) - SPEED_KNOBS)}")  # fmt: skip
    return {**cfg, **(tiles or {})}


def grouped_mm(
    a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, validate: bool = True, flag: torch.Tensor | None = None,
    out: torch.Tensor | None = None, tiles: dict | None = None,
) -> torch.Tensor:  # fmt: skip
    """out [S, N]: each expert's rows of a [S, K] times its b[g] [K, N] (offs: each group's end), one launch; rows past
    the last group are zeros. The bits of fast.mm(a[rows of g], b[g]) for every g. validate, flag, out: grouped_dw's;
    tiles: a sweep's tile in place of the configured one (speed only: _with_tiles)."""
    s, k = a.shape
    e, _, n = b.shape
    offs = _checked(offs, e, s, "rows", validate)
    out = a.new_empty((s, n)) if out is None else out
    if e == 0 or s == 0 or n == 0 or k == 0:
        _flag_bad(offs, s, flag)
        return out.zero_()
    # fast.mm's form of an expert's product; the M bucket by an expert's mean rows (no host read of offs): the tile
    # changes no bit, BLOCK_K is the form's for (n, k).
    cfg = _with_tiles(_form_config(a, b[0], triton.cdiv(s, e), n, k), tiles)
    bm, bn, bk = cfg["block_m"], cfg["block_n"], cfg["block_k"]
    a = a if a.stride(1) == 1 else a.contiguous()
    grid = ((triton.cdiv(s, bm) + e) * triton.cdiv(n, bn),)  # _row_col's 1-D order
    check = {"CHECK": flag is not None, "GROUPS": triton.next_power_of_2(e + 1)}
    tiles = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": cfg["num_warps"],
             "num_stages": cfg["num_stages"], **cfg["launch"]}  # fmt: skip
    b_t = b.stride(1) == 1  # b[g] a weight's transpose: the experts' [N, K] rows stacked
    stacked = b.transpose(1, 2) if b_t else b
    block = [bn, bk] if b_t else [bk, bn]
    stacked = (stacked.reshape(-1, stacked.shape[2]), block) if stacked.is_contiguous() else None
    descs = _tma_pair(a.device, (a, [bm, bk]), stacked)
    if descs is not None:
        launch(_grouped_gemm_tma_kernel, grid, *descs, out, offs, offs if flag is None else flag, e, s, n, k,
               out.stride(0), B_T=b_t, **check, **tiles)  # fmt: skip
        return out
    launch(
        _grouped_gemm_kernel, grid, a, b, out, offs, offs if flag is None else flag, e, s, n, k, a.stride(0),
        a.stride(1), b.stride(0), b.stride(1), b.stride(2), out.stride(0), EVEN_K=k % bk == 0, **check, **tiles,
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
