"""What the fast tier's attention kernels share, forward and backward: the packed rows of a block (with a window,
positions a key tile apart, and the classes of its rows that walk one grid of key tiles), the pinned tile of a head
dim and the query-head group (fast.decoder.attention states why a row's bits depend on its own inputs alone)."""

from __future__ import annotations

import torch

from rl_kernel._triton import jit as _jit  # Triton where installed: rl_kernel.fast reports it missing on a call
from rl_kernel._triton import tl, triton
from rl_kernel.fast.configs import config_for
from rl_kernel.triton_tier import target_of

LOG2E = 1.4426950408889634


@_jit
def _rows(pid_m, hkv, Tq, G: tl.constexpr, BLOCK_M: tl.constexpr, ROWS_T: tl.constexpr):
    """Packed rows of a block: row r is query position pid_m * ROWS_T + r // G of head hkv*G + r % G (ROWS_T query
    positions, at most BLOCK_M // G)."""
    r = tl.arange(0, BLOCK_M)
    t = pid_m * ROWS_T + r // G
    h = hkv * G + r % G
    valid = (r < ROWS_T * G) & (t < Tq)
    return t, h, valid


@_jit
def _spaced_rows(
    pid_m, hkv, Tq, lanes, packed, G: tl.constexpr, BLOCK_M: tl.constexpr, ROWS_T: tl.constexpr, BLOCK_N: tl.constexpr
):
    """Packed rows of a block with a sliding window: ROWS_T query positions BLOCK_N apart (lane + i * BLOCK_N within a
    chunk of ROWS_T * BLOCK_N positions, `lanes` = min(BLOCK_N, Tq) blocks per chunk) times the group's heads. Rows
    whose windows cut keys then have their first keys alike within a key tile, and walk one grid of tiles. packed (the
    same for every block of a chunk): the chunk's positions in runs of ROWS_T instead (lane * ROWS_T + i), for a chunk
    where no window cuts: every row's first key is k_start, one grid, and neighbours walk nearly the same keys. Either
    way the chunk's blocks hold each of its positions once; which block holds a row changes none of its bits."""
    r = tl.arange(0, BLOCK_M)
    i = r // G
    lane = pid_m % lanes
    t = (pid_m // lanes) * (ROWS_T * BLOCK_N) + tl.where(packed, lane * ROWS_T + i, lane + i * BLOCK_N)
    h = hkv * G + r % G
    valid = (r < ROWS_T * G) & (t < Tq)
    return t, h, valid


def spaced_blocks(tq: int, rows_t: int, block_n: int) -> tuple[int, int]:
    """(blocks, lanes) of _spaced_rows over tq query positions."""
    lanes = min(block_n, tq)
    return triton.cdiv(tq, rows_t * block_n) * lanes, lanes


@_jit
def _query_block(
    qpos_ptr, kstart_ptr, Tq, Hkv, sp_b, lanes, window, G: tl.constexpr, BLOCK_M: tl.constexpr, ROWS_T: tl.constexpr,
    BLOCK_N: tl.constexpr, WINDOWED: tl.constexpr,
):  # fmt: skip
    """This program's block (program (i, j): query block i of sequence b = j // Hkv, KV head j % Hkv): b, the KV head,
    its packed rows' positions t (int64) and query heads h, which rows are valid, the sequence's k_start, each row's
    q_pos and whether it sees any key (on: q_pos >= k_start). With a window, a chunk whose last row's window does not
    cut (q_pos - k_start < window) takes its positions in runs (_spaced_rows' packed): a choice of speed alone."""
    b = (tl.program_id(1) // Hkv).to(tl.int64)
    hkv = tl.program_id(1) % Hkv
    ks = tl.load(kstart_ptr + b)
    if WINDOWED:
        last = tl.minimum((tl.program_id(0) // lanes + 1) * (ROWS_T * BLOCK_N), Tq) - 1
        packed = tl.load(qpos_ptr + b * sp_b + last) - ks < window
        t, h, valid = _spaced_rows(tl.program_id(0), hkv, Tq, lanes, packed, G, BLOCK_M, ROWS_T, BLOCK_N)
    else:
        t, h, valid = _rows(tl.program_id(0), hkv, Tq, G, BLOCK_M, ROWS_T)
    t64 = t.to(tl.int64)
    qp = tl.load(qpos_ptr + b * sp_b + t64, mask=valid, other=-1)
    return b, hkv, t64, h, valid, ks, qp, valid & (qp >= ks)


@_jit
def _window_class(todo, first, qp, BLOCK_N: tl.constexpr):
    """The next class of a windowed block's rows: those of `todo` whose first key (max(k_start, q - window + 1)) lies
    where the least such one's does within a key tile, so that each of them walks its own tiles (counted from its
    first key) on the class's grid. (mine, the class's first key, its rows' latest first key, least and greatest
    last key.) A row outside the class sees none of the class's keys: its tiles there are fully masked no-ops."""
    cls = first % BLOCK_N
    mine = todo & (cls == tl.min(tl.where(todo, cls, BLOCK_N), 0))
    base = tl.min(tl.where(mine, first, 2**62), 0)
    latest = tl.max(tl.where(mine, first, -1), 0)
    lo = tl.min(tl.where(mine, qp, 2**62), 0)
    hi = tl.max(tl.where(mine, qp, -1), 0)
    return mine, base, latest, lo, hi


def _cfg(q: torch.Tensor, cfg: dict | None) -> dict:
    return cfg or config_for("attention", target_of(q.device), head_dim=q.shape[-1])


def _check_group(hq: int, hkv: int, block_m: int) -> int:
    if hkv == 0 or hq % hkv:
        raise ValueError(f"rl_kernel.fast.attention: Hq = {hq} must be a multiple of Hkv = {hkv}")
    g = hq // hkv
    if g > block_m:
        raise ValueError(f"rl_kernel.fast.attention: a group of {g} query heads exceeds BLOCK_M = {block_m}")
    return g
