"""Launch splitting (csrc/common/launch.h): a batch is run in GPU launches of at most a maximum row count,
so that no launch exceeds HIP's limit of blocks x threads < 2^32 (2^24 rows of 256 threads). Rows are
independent, so the split changes no bit; the GPU test forces tiny caps and compares integer views."""

from __future__ import annotations

import pytest
import torch

import rl_kernel
from rl_kernel import inputs
from rl_kernel.bitwise import bits_equal, diff

ops = torch.ops.rl_kernel
IGNORE = -100
DEFAULT_MAX = 1 << 20
LIMIT_MAX = (1 << 24) - 1


def plan(rows: int, cap: int) -> list[tuple[int, int]]:
    flat = list(ops._launch_plan(rows, cap))
    return list(zip(flat[::2], flat[1::2], strict=True))


# Every (rows, cap) pair whose plan is short enough to list (at most 100,000 launches).
PLANS = [
    (rows, cap)
    for cap in (1, 3, 7, 1000, DEFAULT_MAX, LIMIT_MAX)
    for rows in (0, 1, 2, 3, 7, 8, 999, 1000, 1001, 3000, (1 << 24) + 5, (1 << 31) + 3)
    if rows // cap <= 100_000
]


@pytest.mark.parametrize(("rows", "cap"), PLANS)
def test_launch_plan_covers_every_row_once(rows: int, cap: int) -> None:
    """The header's chunking arithmetic, compiled into the CPU build: consecutive launches, each of 1..cap
    rows, covering [0, rows) exactly once."""
    p = plan(rows, cap)
    assert len(p) == -(-rows // cap)
    nxt = 0
    for first, n in p:
        assert first == nxt and 1 <= n <= cap
        nxt = first + n
    assert nxt == rows


def test_huge_batch_is_split_below_the_hip_grid_limit() -> None:
    rows = (1 << 24) + 1  # one more than HIP allows in one launch of 256-thread blocks
    p = plan(rows, DEFAULT_MAX)
    assert all(n * 256 < 2**32 for _, n in p) and sum(n for _, n in p) == rows


def test_set_max_rows_per_launch_is_registered_and_bounded() -> None:
    """A private op of every backend (a no-op for the CPU executor): returns the previous cap; <= 0 restores
    the default; a cap at or above 2^24 rows is refused."""
    prev = ops._set_max_rows_per_launch(3)
    try:
        assert ops._set_max_rows_per_launch(7) == 3
        assert ops._set_max_rows_per_launch(0) == 7
        assert ops._set_max_rows_per_launch(5) == DEFAULT_MAX
        with pytest.raises(RuntimeError, match="rows per launch"):
            ops._set_max_rows_per_launch(1 << 24)
        # The CPU executor has no launches: same bits under any cap.
        x = inputs.logits(9, 300, torch.float32, seed=2)
        a = rl_kernel.log_softmax(x)
        ops._set_max_rows_per_launch(1)
        assert bits_equal(rl_kernel.log_softmax(x), a)
    finally:
        ops._set_max_rows_per_launch(prev)


def _everything(x: torch.Tensor, t: torch.Tensor) -> dict[str, torch.Tensor]:
    out = {}
    for name, fn in (
        ("log_softmax", lambda z: rl_kernel.log_softmax(z)),
        ("token_logprobs", lambda z: rl_kernel.token_logprobs(z, t, validate=False)),
        ("entropy", lambda z: rl_kernel.entropy(z)),
    ):
        leaf = x.detach().clone().requires_grad_(True)
        y = fn(leaf)
        w = torch.randn(y.shape, generator=torch.Generator().manual_seed(3)).to(x.device)
        (g,) = torch.autograd.grad((y * w).sum(), leaf)
        out[name], out[f"grad {name}"] = y.detach(), g
    out["row_stats"] = rl_kernel.row_stats(x)
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", inputs.DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("cap", [1, 3, 7, 1000])
def test_small_launch_caps_give_the_same_bits(cap: int, dtype: torch.dtype) -> None:
    """Every op and gradient with the batch split into launches of cap rows equals the default (one launch)."""
    x = torch.cat([inputs.logits(2003, 257, dtype, seed=5), inputs.edge_rows(257, dtype)]).cuda()
    t = inputs.tokens(x.shape[0], 257, seed=5)
    t[::4] = IGNORE
    t = t.cuda()
    want = _everything(x, t)
    prev = ops._set_max_rows_per_launch(cap)
    try:
        got = _everything(x, t)
        torch.cuda.synchronize()
    finally:
        ops._set_max_rows_per_launch(prev)
    for name, y in want.items():
        assert bits_equal(got[name], y), f"{name}, cap {cap}: {diff(got[name], y).summary()}"
