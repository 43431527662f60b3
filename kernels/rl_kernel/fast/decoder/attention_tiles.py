"""What the fast tier's attention kernels share, forward and backward: the packed rows of a block, the first key a
block counts its key tiles from, the pinned tile of a head dim and the query-head group (fast.decoder.attention
states why a row's bits depend on its own inputs alone)."""

from __future__ import annotations

import torch

from rl_kernel._triton import jit as _jit  # Triton where installed: rl_kernel.fast reports it missing on a call
from rl_kernel._triton import tl
from rl_kernel.fast.configs import config_for
from rl_kernel.triton_tier import target_of

LOG2E = 1.4426950408889634


@_jit
def _rows(pid_m, hkv, Tq, G: tl.constexpr, BLOCK_M: tl.constexpr, ROWS_T: tl.constexpr):
    """Packed rows of a block: row r is query position pid_m * ROWS_T + r // G of head hkv*G + r % G (ROWS_T query
    positions, at most BLOCK_M // G; one with a sliding window, whose rows then share their first key)."""
    r = tl.arange(0, BLOCK_M)
    t = pid_m * ROWS_T + r // G
    h = hkv * G + r % G
    valid = (r < ROWS_T * G) & (t < Tq)
    return t, h, valid


@_jit
def _first_key(ks, qp, on, window, WINDOWED: tl.constexpr):
    """The block's first key, from which its tiles are counted: the sequence's (k_start), or with a window the one
    first key its rows share (one query position per block: max(k_start, q - window + 1))."""
    if WINDOWED:
        return tl.max(tl.where(on, tl.maximum(qp - window + 1, ks), ks), 0)
    return ks


def _cfg(q: torch.Tensor, cfg: dict | None) -> dict:
    return cfg or config_for("attention", target_of(q.device), head_dim=q.shape[-1])


def _check_group(hq: int, hkv: int, block_m: int) -> int:
    if hkv == 0 or hq % hkv:
        raise ValueError(f"rl_kernel.fast.attention: Hq = {hq} must be a multiple of Hkv = {hkv}")
    g = hq // hkv
    if g > block_m:
        raise ValueError(f"rl_kernel.fast.attention: a group of {g} query heads exceeds BLOCK_M = {block_m}")
    return g
