"""The fast tier's RMSNorm (rl_kernel.fast.decoder.norm): the exact tier's forward bits, a backward that matches float64
and repeats bit for bit, and a weight gradient that is not the exact tier's sequential row chain."""

from __future__ import annotations

import pytest
import torch

from rl_kernel.exact.decoder.ops import rms_norm as exact_rms_norm
from rl_kernel.fast import norm


def _case(dtype: torch.dtype, rows: int = 37, h: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, h, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(h, generator=g)).to(dtype)
    dy = torch.randn(rows, h, generator=g).to(dtype)
    return x, w, dy


def _grads(fn, x, w, dy):
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fn(xl, wl, 1e-6)
    y.backward(dy)
    return y.detach(), xl.grad, wl.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_bits_are_the_exact_tiers_and_the_backward_matches_float64(dtype) -> None:
    x, w, dy = _case(dtype)
    y, dx, dw = _grads(norm.rms_norm, x, w, dy)
    bits = torch.int16 if dtype != torch.float32 else torch.int32
    assert torch.equal(y.view(bits), exact_rms_norm(x, w, 1e-6).view(bits))
    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    ref = wd * (xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + 1e-6))
    ref.backward(dy.double())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for got, want in ((dx, xd.grad), (dw, wd.grad)):
        err = float((got.double() - want).norm() / want.norm())
        assert err < tol, err


def test_the_backward_repeats_bit_for_bit_and_differs_from_the_exact_chain_only_in_rounding() -> None:
    x, w, dy = _case(torch.float32, rows=300)
    _, dx1, dw1 = _grads(norm.rms_norm, x, w, dy)
    _, dx2, dw2 = _grads(norm.rms_norm, x, w, dy)
    assert torch.equal(dx1.view(torch.int32), dx2.view(torch.int32))
    assert torch.equal(dw1.view(torch.int32), dw2.view(torch.int32))
    _, _, dw_exact = _grads(exact_rms_norm, x, w, dy)
    assert float((dw1 - dw_exact).abs().max()) < 1e-3 * float(dw_exact.abs().max())


def test_without_gradients_it_is_the_exact_operator() -> None:
    x, w, _ = _case(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(norm.rms_norm(x, w).view(torch.int16), exact_rms_norm(x, w).view(torch.int16))
