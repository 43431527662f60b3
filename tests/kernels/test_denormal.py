"""Denormal-mode invariance (docs/numerics.md section 7, "FTZ/DAZ"): every operator and gradient gives
the same bits with the CPU in flush-to-zero / denormals-are-zero mode (`torch.set_flush_denormal(True)`,
as a library built with fast-math may leave a process) as in IEEE gradual-underflow mode.

The inputs are adversarial: subnormal logits, subnormal upstream gradients, mixes of subnormals and
normals near 2^-126, values whose partial sums cross 2^-126, and products that land exactly on the
rounding window just below 2^-126. Every comparison is of integer views of the bits.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import rl_kernel
from rl_kernel import inputs
from rl_kernel import reference as ref
from rl_kernel.bitwise import bits_equal, diff, int_view

IGNORE = -100
TINY = 2.0**-126
DTYPES = inputs.DTYPES


def _dname(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


class _Mode:
    """Runs a function with the CPU in FTZ/DAZ mode or in IEEE mode, on one thread (the mode is per thread)."""

    def __init__(self, flush: bool) -> None:
        self.flush = flush

    def __enter__(self) -> None:
        self.threads = torch.get_num_threads()
        torch.set_num_threads(1)
        if not torch.set_flush_denormal(self.flush) and self.flush:
            pytest.skip("torch.set_flush_denormal is not supported on this CPU")
        probe = (torch.tensor([2.0**-130]) * 1.0).item()
        assert (probe == 0.0) == self.flush, "the denormal mode is not in effect"

    def __exit__(self, *exc) -> None:
        torch.set_flush_denormal(False)
        torch.set_num_threads(self.threads)


def both_modes(fn):
    with _Mode(True):
        ftz = fn()
    with _Mode(False):
        ieee = fn()
    return ftz, ieee


def assert_same(ftz: dict[str, torch.Tensor], ieee: dict[str, torch.Tensor]) -> None:
    for name, y in ieee.items():
        assert bits_equal(ftz[name], y), f"{name}: FTZ/DAZ vs IEEE: {diff(ftz[name], y).summary()}"


def f32(values) -> torch.Tensor:
    return torch.tensor(np.asarray(values, dtype=np.float32))


# ---- adversarial inputs ----------------------------------------------------------------------------
def crossing_grads(v: int, seed: int) -> torch.Tensor:
    """Upstream gradients whose partial sums cross 2^-126: normals in [-4, 4] * 2^-126 with mixed signs,
    exact multiples of 2^-128 (so many partial sums are exactly subnormal), and some subnormals."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randint(-16, 17, (v,), generator=g).to(torch.float32) * 2.0**-128
    sub = torch.randint(-(2**20), 2**20, (v,), generator=g).to(torch.float32) * 2.0**-149
    pick = torch.rand(v, generator=g) < 0.3
    return torch.where(pick, sub, k)


def adversarial_logits(v: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows: all subnormal; subnormals and normals near 2^-126 of both signs; one 0 among -1000 (so one
    p = 1 and every other p = 0: the gradients equal the flushed upstream values); random normal."""
    g = torch.Generator().manual_seed(v)
    sub = torch.randint(-(2**23) + 1, 2**23, (v,), generator=g).to(torch.float32) * 2.0**-149
    near = torch.randint(-16, 17, (v,), generator=g).to(torch.float32) * 2.0**-128
    mixed = torch.where(torch.arange(v) % 2 == 0, sub, near)
    peaked = torch.full((v,), -1000.0)
    peaked[v // 2] = 0.0
    normal = torch.randn(v, generator=g) * 3
    return torch.stack([sub, mixed, peaked, normal]).to(dtype)


def all_outputs(x: torch.Tensor, tok: torch.Tensor, g_elem: torch.Tensor, g_row: torch.Tensor) -> dict:
    """Every operator's output and, through autograd with the given upstream gradients, its gradient; and
    the raw backward ops called with the same upstream gradients."""
    out: dict[str, torch.Tensor] = {}
    for name, fn, g in (
        ("log_softmax", lambda z: rl_kernel.log_softmax(z), g_elem),
        ("token_logprobs", lambda z: rl_kernel.token_logprobs(z, tok, validate=False), g_row),
        ("entropy", lambda z: rl_kernel.entropy(z), g_row),
    ):
        leaf = x.detach().clone().requires_grad_(True)
        y = fn(leaf)
        (gi,) = torch.autograd.grad(y, leaf, g)
        out[name] = y.detach()
        out[f"grad {name}"] = gi
    out["row_stats"] = rl_kernel.row_stats(x)
    ops = torch.ops.rl_kernel
    lsm = ops.log_softmax(x)
    out["log_softmax_backward raw"] = ops.log_softmax_backward(g_elem, lsm, x.dtype)
    _, stats = ops.token_logprobs(x, tok, IGNORE)
    out["token_logprobs_backward raw"] = ops.token_logprobs_backward(g_row, x, tok, stats, IGNORE)
    h, stats = ops.entropy(x)
    out["entropy_backward raw"] = ops.entropy_backward(g_row, x, stats, h)
    return out


# ---- the reproduction of the reported case ---------------------------------------------------------------
def test_reported_case_partial_sum_crossing_2_126() -> None:
    """The reported case. The log_softmax gradient's sum G = sum flush(g_i) flushed its terms but not its
    partial sums: g = [2, -1.5, 1, 0, ...] * 2^-126 has the partial sum (2 - 1.5) * 2^-126, a subnormal,
    which FTZ hardware flushes. With p = 1 at element 0 (logits [0, -1000, ...]), grad_0 = g_0 - G was
    flush((2 - 1.5) * 2^-126) = 0x0 in IEEE mode and (2 - 1) * 2^-126 = 0x00800000 under FTZ/DAZ. The
    executors run in IEEE mode whatever the caller's (the CPU one sets it per call), so grad_0 = 0x0 in
    both modes, as on a GPU."""
    x = torch.full((1, 8), -1000.0)
    x[0, 0] = 0.0
    g = f32([[2.0 * TINY, -1.5 * TINY, TINY, 0, 0, 0, 0, 0]])
    out = rl_kernel.log_softmax(x)

    def grad():
        leaf = x.clone().requires_grad_(True)
        (through_autograd,) = torch.autograd.grad(rl_kernel.log_softmax(leaf), leaf, g)
        return {
            "op": torch.ops.rl_kernel.log_softmax_backward(g, out, torch.float32),
            "autograd": through_autograd,
        }

    ftz, ieee = both_modes(grad)
    assert_same(ftz, ieee)
    assert int(int_view(ieee["op"])[0, 0]) == 0x0
    assert int(int_view(ieee["autograd"])[0, 0]) == 0x0


def test_subnormal_upstream_gradients_through_autograd() -> None:
    """Rows of subnormal upstream gradients, through autograd, every op: identical bits."""
    for dtype in DTYPES:
        x = adversarial_logits(64, dtype)
        tok = torch.tensor([3, 5, 32, 7])
        g_elem = torch.randint(-(2**23) + 1, 2**23, x.shape).to(torch.float32) * 2.0**-149
        g_row = f32([2.0**-149, -(2.0**-130), 3 * 2.0**-140, -(2.0**-127)])
        assert_same(*both_modes(lambda: all_outputs(x, tok, g_elem, g_row)))  # noqa: B023


@pytest.mark.parametrize("dtype", DTYPES, ids=_dname)
@pytest.mark.parametrize("vocab", [8, 257, 2053, 32000])
def test_every_op_and_gradient_ftz_vs_ieee(vocab: int, dtype: torch.dtype) -> None:
    x = adversarial_logits(vocab, dtype)
    n = x.shape[0]
    tok = torch.tensor([1, vocab // 2, vocab // 2, 0])
    g_elem = torch.stack([crossing_grads(vocab, s) for s in range(n)])
    # Row gradients: subnormal, near 2^-126, and values whose products with p in (0, 1] land below 2^-126.
    g_row = f32([2.0**-140, -3 * 2.0**-128, 1.5 * TINY, -(2.0**-100)])
    assert_same(*both_modes(lambda: all_outputs(x, tok, g_elem, g_row)))


def test_random_rows_with_subnormal_upstream_gradients() -> None:
    """Random logits, upstream gradients: random normals with a random third replaced by subnormals."""
    gen = torch.Generator().manual_seed(11)
    for vocab in (8, 1000, 32000):
        x = torch.randn(6, vocab, generator=gen) * 2.5
        tok = torch.randint(0, vocab, (6,), generator=gen)
        g = torch.randn(6, vocab, generator=gen) * TINY * 4
        sub = torch.randint(-(2**22), 2**22, (6, vocab), generator=gen).to(torch.float32) * 2.0**-149
        g_elem = torch.where(torch.rand(6, vocab, generator=gen) < 0.33, sub, g)
        g_row = torch.randn(6, generator=gen) * TINY
        for dtype in DTYPES:
            xd = x.to(dtype)
            assert_same(*both_modes(lambda: all_outputs(xd, tok, g_elem, g_row)))  # noqa: B023


def _window_factors(w: float) -> list[float]:
    """float32 values g near 2^-126 / |w| whose exact product with w lies in [2^-126 - 2^-150, 2^-126):
    IEEE gradual underflow rounds it up to 2^-126, a flush-to-zero unit may give 0 (tininess before
    rounding, or after rounding to 24 bits: the window [2^-126 - 2^-150, 2^-126 - 2^-151))."""
    w32 = np.float32(w)
    g0 = np.float32(TINY / abs(float(w32)))
    found = []
    g = np.nextafter(g0, np.float32(0), dtype=np.float32)
    for _ in range(64):
        p = abs(float(g) * float(w32))  # exact: 24 x 24 bits
        if TINY - 2.0**-150 <= p < TINY:
            found.append(float(g))
        g = np.nextafter(g, np.float32(np.inf), dtype=np.float32)
    return found


def test_products_just_below_2_126() -> None:
    """token_logprobs' gradient is g * ([i == tok] - p_i): with g chosen so that the exact product with
    one element's factor lies just below 2^-126, the result must not depend on how the hardware
    handles tininess."""
    x = torch.tensor([[0.0, -1.0, -2.5, -0.25, -3.0, -1.5, -0.75, -4.0]])
    tok = torch.tensor([2])
    ones = torch.ops.rl_kernel.token_logprobs_backward(torch.ones(1), x, tok, rl_kernel.row_stats(x), IGNORE)
    cases = [(j, g) for j in range(8) for g in _window_factors(float(ones[0, j]))]
    assert cases, "no product in the window: widen the search"
    for j, gv in cases[:16]:
        g = f32([gv])

        def grad(g=g):
            st = rl_kernel.row_stats(x)
            return {"tok": torch.ops.rl_kernel.token_logprobs_backward(g, x, tok, st, IGNORE)}

        ftz, ieee = both_modes(grad)
        assert_same(ftz, ieee)
        # The contract's rule: the IEEE product (gradual underflow: the executor is in IEEE mode whatever
        # the caller's), then flushed below 2^-126; numpy in IEEE mode agrees.
        want = ref.flush(np.float32(gv) * np.float32(ones[0, j].item()))
        assert int(int_view(ieee["tok"])[0, j]) & 0xFFFFFFFF == int(np.asarray(want).view(np.uint32)), (j, gv)


def test_the_callers_mode_is_restored() -> None:
    """The CPU executor switches its threads to IEEE mode for a call and back: a caller in FTZ/DAZ mode is
    still in it afterwards (its own arithmetic flushes), and one in IEEE mode still is (it does not)."""
    x = torch.randn(4, 300)
    for flush in (True, False):
        with _Mode(flush):
            rl_kernel.log_softmax(x)
            tiny = (torch.tensor([2.0**-130]) * 1.0).item()
            assert (tiny == 0.0) == flush, (flush, tiny)
