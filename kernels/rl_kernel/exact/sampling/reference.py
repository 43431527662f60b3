"""docs/numerics.md section 12 (the sampling family) in numpy: the Gumbel-max draw, independent of
csrc/sampling/sampling.cuh. uint64 arithmetic wraps modulo 2^64 as the C++ does."""

from __future__ import annotations

import numpy as np

from rl_kernel.exact.common.contract import NEG_INF, _quiet, log_pos

U64 = np.uint64
GOLDEN64 = U64(0x9E3779B97F4A7C15)
MIX1, MIX2 = U64(0xBF58476D1CE4E5B9), U64(0x94D049BB133111EB)


def mix64(z) -> np.ndarray:
    """splitmix64's finaliser."""
    z = np.asarray(z, dtype=U64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> U64(30))) * MIX1
        z = (z ^ (z >> U64(27))) * MIX2
    return z ^ (z >> U64(31))


def row_base(seed: int, key: int, step: int) -> np.uint64:
    wrap = lambda v: U64(int(v) % 2**64)  # noqa: E731  (int64 -> its two's-complement uint64)
    with np.errstate(over="ignore"):
        z = mix64(wrap(seed) + GOLDEN64)
    return mix64(mix64(z ^ wrap(key)) ^ wrap(step))


@_quiet
def gumbel_noise(base: np.uint64, i: np.ndarray) -> np.ndarray:
    """-log(-log(u)), u = (2 * (hash >> 41) + 1) * 2^-24, with the contract's log."""
    with np.errstate(over="ignore"):
        h = mix64(U64(base) ^ (np.asarray(i, dtype=U64) * GOLDEN64))
    u = ((h >> U64(41)) * U64(2) + U64(1)).astype(np.float32) * np.float32(2.0**-24)
    return -log_pos(-log_pos(u))


@_quiet
def gumbel_argmax(row: np.ndarray, seed: int, key: int, step: int) -> int:
    """The draw of one float32 row: the lowest index of the largest row + noise (NaN counts as -inf)."""
    i = np.arange(row.shape[0])
    z = (row.astype(np.float32) + gumbel_noise(row_base(seed, key, step), i)).astype(np.float32)
    z = np.where(np.isnan(z), NEG_INF, z)
    return int(np.flatnonzero(z == z.max())[0])
