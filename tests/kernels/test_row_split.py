"""Cutting a row into several blocks (a launch choice) never changes a bit: forced cuts 1..k vs whole rows.

The GPU executor cuts rows on its own when rows are few (decode); the CPU executor only when forced.
torch.ops.rl_kernel._set_row_split(L) forces parts of 2^L chunks (-1: the executor's choice, 63: never).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import rl_kernel
from rl_kernel import inputs
from rl_kernel.bitwise import bits_equal, diff

NEVER = 63


@contextlib.contextmanager
def row_split(level: int):
    prev = torch.ops.rl_kernel._set_row_split(level)
    try:
        yield
    finally:
        torch.ops.rl_kernel._set_row_split(prev)


def outputs(x: torch.Tensor, tok: torch.Tensor) -> dict[str, torch.Tensor]:
    return {
        "row_stats": rl_kernel.row_stats(x),
        "token_logprobs": rl_kernel.token_logprobs(x, tok),
        "entropy": rl_kernel.entropy(x),
    }


@pytest.mark.parametrize("vocab", [7, 100, 2049, 4099, 32003, 151936])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=lambda d: str(d)[6:])
def test_forced_cuts_give_the_whole_row_bits(device: str, vocab: int, dtype: torch.dtype) -> None:
    rows = 3 if vocab > 40000 else 5
    x = inputs.logits(rows, vocab, dtype, seed=vocab).to(device)
    if vocab >= 8:
        x = torch.cat([x, inputs.edge_rows(vocab, dtype).to(device)])
    tok = inputs.tokens(x.shape[0], vocab, seed=vocab).to(device)
    tok[::3] = -100
    with row_split(NEVER):
        want = outputs(x, tok)
    levels = range(0, max(1, (-(-vocab // 8) - 1).bit_length()) + 1)
    for level in levels:
        with row_split(level):
            got = outputs(x, tok)
        for name, w in want.items():
            assert bits_equal(got[name], w), f"{name}, parts of 2^{level} chunks: {diff(got[name], w).summary()}"
    with row_split(-1):  # the executor's own choice (the GPU cuts few rows)
        for name, g in outputs(x[:1], tok[:1]).items():
            assert bits_equal(g, want[name][:1]), f"{name}, one row, automatic cut"


def test_a_bad_level_is_refused() -> None:
    with pytest.raises(RuntimeError, match="row split level"):
        torch.ops.rl_kernel._set_row_split(64)


def test_negative_control_a_cut_with_the_wrong_join_is_caught() -> None:
    """Parts joined left to right (not by the tree) give other bits: the comparison above can fail."""
    x = inputs.logits(16, 32000, torch.float32, seed=3)
    part = torch.ops.rl_kernel.node_stats(x, 0, 32000, [8] * 16, list(range(16)))  # 16 parts of 256 chunks
    wrong = torch.ops.rl_kernel.join_stats(part, [0] * 16, [2 * k for k in range(16)])  # no siblings: a fold
    right = rl_kernel.row_stats(x)
    assert bits_equal(torch.ops.rl_kernel.join_stats(part, [8] * 16, list(range(16))), right)
    assert (wrong[:, 1].view(torch.int32) != right[:, 1].view(torch.int32)).sum() >= 4
