"""Helpers the kernels' tests share: dtype names for test ids, bitwise assertions, bits as numpy integers."""

from __future__ import annotations

import numpy as np
import torch

from rl_kernel.bitwise import bits_equal, diff

_UINT = {torch.float32: (torch.int32, np.uint32), torch.bfloat16: (torch.int16, np.uint16)}
_UINT[torch.float16] = _UINT[torch.bfloat16]


def dname(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def assert_bits(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    """got and want have one shape, one dtype and the same bits (integer views)."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert bits_equal(got, want), f"{what}: {diff(got, want).summary()}"


def cpu_bits(t: torch.Tensor) -> np.ndarray:
    """A torch tensor's bits as unsigned integers (uint32 for fp32, uint16 for bf16/fp16)."""
    ti, nu = _UINT[t.dtype]
    return t.detach().cpu().contiguous().view(ti).numpy().view(nu)


def assert_same(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Two numpy bit arrays (the CPU build's and the transcription's) are equal; names the first difference."""
    assert got.dtype == want.dtype, f"{what}: {got.dtype} != {want.dtype}"
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    bad = np.flatnonzero(got != want)
    if bad.size:
        i = int(bad[0])
        w = 8 if got.dtype == np.uint32 else 4
        raise AssertionError(
            f"{what}: {bad.size} of {got.size} differ; first at {np.unravel_index(i, got.shape)}: "
            f"cpu 0x{int(got.flat[i]):0{w}x}, spec 0x{int(want.flat[i]):0{w}x}"
        )
