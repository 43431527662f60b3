"""The fast tier's RMSNorm (rl_kernel.fast.decoder.norm): the exact tier's forward bits; a Triton backward (run here in
Triton's interpreter) whose dx rows depend on their own row only, whose dw repeats bit for bit, both near float64 and
near the torch transcription of the same formula; clear errors for what the tier does not take."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from triton_interpreter import failed, interpret, shim

from rl_kernel.exact.decoder.ops import rms_norm as exact_rms_norm
from rl_kernel.fast.decoder import norm

EPS = 1e-6


def _case(dtype: torch.dtype, rows: int = 37, h: int = 64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, h, generator=g).to(dtype)
    w = (1 + 0.1 * torch.randn(h, generator=g)).to(dtype)
    dy = torch.randn(rows, h, generator=g).to(dtype)
    return x, w, dy


def _grads(fn, x, w, dy):
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = fn(xl, wl, EPS)
    y.backward(dy)
    return y.detach(), xl.grad, wl.grad


def test_without_gradients_it_is_the_exact_operator() -> None:
    x, w, _ = _case(torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(norm.rms_norm(x, w).view(torch.int16), exact_rms_norm(x, w).view(torch.int16))


def test_a_gradient_on_the_cpu_names_the_exact_tier(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    x, w, _ = _case(torch.bfloat16)
    with pytest.raises(ValueError, match=r"no CPU kernels.*tier='exact'"):
        norm.rms_norm(x.requires_grad_(), w)
    with pytest.raises(TypeError, match="bfloat16/float16 only"):
        norm.rms_norm(x.float().requires_grad_(), w.float())


@pytest.mark.slow
def test_the_backward_in_the_interpreter() -> None:
    assert not failed(interpret(__file__, "backward"))


# ---- what the subprocess runs -------------------------------------------------------------------------------
def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want.double()).norm() / want.double().norm())


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.equal(a.contiguous().view(torch.int16), b.contiguous().view(torch.int16))


def _check_backward(device: str = "cpu") -> dict[str, bool]:
    """The checks, on the CPU under the interpreter or (`backward-gpu`) on this machine's GPU."""
    res = {}
    shapes = ((37, 64), (5, 2048), (40, 96)) + (((8192, 2048), (131072, 128)) if device != "cpu" else ())
    for dtype in (torch.bfloat16, torch.float16):
        for rows, h in shapes:  # 96: a row narrower than its power-of-two block; then the 1.7B model's norms
            name = f"{str(dtype)[6:]} {rows}x{h}"
            x, w, dy = (t.to(device) for t in _case(dtype, rows, h))
            y, dx, dw = _grads(norm.rms_norm, x, w, dy)
            res[f"{name}: forward == exact tier (bits)"] = _same(y, exact_rms_norm(x, w, EPS))
            xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
            (wd * (xd * torch.rsqrt(xd.square().mean(-1, keepdim=True) + EPS))).backward(dy.double())
            res[f"{name}: dx, dw vs float64"] = _rel(dx, xd.grad) < 2e-2 and _rel(dw, wd.grad) < 2e-2
            rdx, rdw = norm.rms_norm_grads_reference(dy, x, w, EPS)
            res[f"{name}: dx, dw vs the torch formula"] = _rel(dx, rdx) < 1e-2 and _rel(dw, rdw) < 1e-2
            _, dx2, dw2 = _grads(norm.rms_norm, x, w, dy)
            res[f"{name}: run to run (bits)"] = _same(dx, dx2) and _same(dw, dw2)
            cut = rows // 2 + 1  # a row alone, or in another block of rows, has the same dx
            _, part, _ = _grads(norm.rms_norm, x[cut:], w, dy[cut:])
            res[f"{name}: dx rows alone == in the batch (bits)"] = _same(part, dx[cut:])
    x, w, dy = (t.to(device) for t in _case(torch.bfloat16, 40, 64))
    _, dx3, _ = _grads(norm.rms_norm, x.view(5, 8, 64), w, dy.view(5, 8, 64))
    _, dx, _ = _grads(norm.rms_norm, x, w, dy)
    res["leading dimensions: the same bits"] = _same(dx3.view(40, 64), dx)
    return res


if __name__ == "__main__":
    import json

    if sys.argv[1] == "backward-gpu":  # on a GPU machine: python tests/kernels/test_fast_norm.py backward-gpu
        print(json.dumps(_check_backward("cuda")))
        sys.exit(0)
    assert os.environ.get("TRITON_INTERPRET") == "1", "run through the tests (TRITON_INTERPRET=1)"
    shim()
    print(json.dumps({"backward": _check_backward}[sys.argv[1]]()))
