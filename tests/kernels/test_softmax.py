"""Behaviour of rl_kernel's public API (the `exact` tier).

Every equality claim here is bitwise (integer views, `rl_kernel.bitwise.bits_equal`); accuracy
against float64 is checked with explicit numeric bounds, which are not equality claims.
Tests that take `device` run on the CPU and, where there is one, on the GPU (conftest.py).
"""

from __future__ import annotations

import pytest
import torch
from bit_checks import assert_bits, dname
from softmax_cases import (
    CONSTANT,
    ENT_ATOL,
    ENT_RTOL,
    IGNORE,
    LSM_MAX_ABS,
    NORMAL,
    OPS,
    SIGNED_ZEROS,
    SUBNORMALS,
    case,
    grads,
    rows_for,
    run,
    vd_params,
    views,
    weights,
)

import rl_kernel
from rl_kernel import inputs
from rl_kernel.bitwise import int_view

# ---------------------------------------------------------------- batch invariance
# GPU only: the CPU build runs every row through one per-row function (softmax_cpu.cpp's for_rows), so a
# row's bits cannot depend on the batch there and this test could not fail on it. What is real on the CPU
# (the glue's reshapes of 1-D and [B, T, V] inputs) is test_input_shapes_cpu below.


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("vocab", "dtype"), vd_params())
def test_batch_invariance(op: str, vocab: int, dtype: torch.dtype) -> None:
    device = "cuda"
    x, t = case(vocab, dtype, device)
    n = x.shape[0]
    full = run(op, x, t)
    for i in range(n):
        # A copy: a fresh (16-byte aligned) row, where inside the batch it may not be aligned.
        assert_bits(run(op, x[i : i + 1].clone(), t[i : i + 1])[0], full[i], f"row {i} alone")
        assert_bits(run(op, x[i], t[i]), full[i], f"row {i} as a 1-D tensor")
    k = n // 2 + 1
    assert_bits(run(op, x[:k], t[:k]), full[:k], f"first {k} rows")
    assert_bits(run(op, x.flip(0), t.flip(0)).flip(0), full, "reversed batch")
    xo, to = case(vocab, dtype, device, rows=5, seed=1)
    assert_bits(
        run(op, torch.cat([xo[:2], x, xo[2:]]), torch.cat([to[:2], t, to[2:]]))[2 : 2 + n], full, "larger batch"
    )
    x3, t3 = x.view(2, n // 2, vocab), t.view(2, n // 2)
    assert_bits(run(op, x3, t3).reshape(full.shape), full, "[B, T, V] batch")


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("vocab", "dtype"), vd_params((1, 7, 257)))
def test_input_shapes_cpu(op: str, vocab: int, dtype: torch.dtype) -> None:
    """The glue's handling of 1-D and [B, T, V] inputs (rows_of, lead_shape) on the CPU build."""
    x, t = case(vocab, dtype)
    n = x.shape[0]
    full = run(op, x, t)
    for i in (0, n - 1):
        assert_bits(run(op, x[i], t[i]), full[i], f"row {i} as a 1-D tensor")
    x3, t3 = x.view(2, n // 2, vocab), t.view(2, n // 2)
    assert_bits(run(op, x3, t3).reshape(full.shape), full, "[B, T, V] batch")


# ---------------------------------------------------------------- non-contiguous inputs


@pytest.mark.parametrize(("vocab", "dtype"), vd_params())
def test_non_contiguous(vocab: int, dtype: torch.dtype, device: str) -> None:
    x, t = case(vocab, dtype, device)
    for layout, (xv, tv) in views(x, t).items():
        assert vocab == 1 or not xv.is_contiguous(), layout  # size-1 dims make every layout contiguous
        xc, tc = xv.contiguous(), tv.contiguous()
        for op in OPS:
            assert_bits(run(op, xv, tv), run(op, xc, tc), f"{op} forward, {layout}")
            w = weights(tuple(run(op, xc, tc).shape), 3, device)
            gv_in = xv.detach().requires_grad_()  # still a non-contiguous view
            gc_in = xc.detach().requires_grad_()
            (gv,) = torch.autograd.grad((run(op, gv_in, tv) * w).sum(), gv_in)
            (gc,) = torch.autograd.grad((run(op, gc_in, tc) * w).sum(), gc_in)
            assert_bits(gv, gc, f"{op} gradient, {layout}")


@pytest.mark.gpu
@pytest.mark.parametrize(("vocab", "dtype"), vd_params((7, 8, 255, 257, 32000)))
def test_misaligned_rows_gpu(vocab: int, dtype: torch.dtype) -> None:
    """GPU only (the CPU has one load path): rows starting 1, 2 and 3 elements off a 16-byte boundary (the
    scalar loads) give the bits of the same rows aligned (16-byte vector loads), forward and gradient."""
    x, t = case(vocab, dtype, "cuda")
    for shift in (1, 2, 3):
        buf = torch.zeros(x.shape[0], vocab + 8, dtype=dtype, device="cuda")
        buf[:, shift : shift + vocab] = x
        xm = buf[:, shift : shift + vocab]
        assert xm.data_ptr() % 16 != 0
        for op in OPS:
            assert_bits(run(op, xm, t), run(op, x, t), f"{op} forward, shift {shift}")
            w = weights(tuple(run(op, x, t).shape), 5, "cuda")
            gm_in, ga_in = xm.detach().requires_grad_(), x.detach().requires_grad_()
            (gm,) = torch.autograd.grad((run(op, gm_in, t) * w).sum(), gm_in)
            (ga,) = torch.autograd.grad((run(op, ga_in, t) * w).sum(), ga_in)
            assert_bits(gm, ga, f"{op} gradient, shift {shift}")


# ---------------------------------------------------------------- token_logprobs == gather


def _gathered(lsm: torch.Tensor, t: torch.Tensor, ignore_index: int) -> torch.Tensor:
    picked = lsm.gather(-1, t.clamp_min(0)[..., None])[..., 0]
    return torch.where(t == ignore_index, torch.zeros_like(picked), picked)


@pytest.mark.parametrize(("vocab", "dtype"), vd_params())
def test_token_logprobs_is_gathered_log_softmax(vocab: int, dtype: torch.dtype, device: str) -> None:
    x, t = case(vocab, dtype, device)
    if vocab >= 8:  # edge rows too: the NaN, -inf and zero outputs must match as well
        x = torch.cat([x, inputs.edge_rows(vocab, dtype).to(device)])
        te = torch.tensor([1, 2, 3, 0, 5, 6, 7, 0, vocab - 1, 4], device=device)
        t = torch.cat([t, te])
    lsm = rl_kernel.log_softmax(x)
    got = rl_kernel.token_logprobs(x, t)
    assert_bits(got, _gathered(lsm, t, IGNORE), "2-D")
    ignored = t == IGNORE
    assert bool(ignored.any())
    assert bool((int_view(got)[ignored] == 0).all()), "ignore_index positions must be +0.0"

    n = x.shape[0] // 2 * 2
    x3, t3 = x[:n].reshape(2, n // 2, vocab), t[:n].reshape(2, n // 2)
    got3 = rl_kernel.token_logprobs(x3, t3)
    assert_bits(got3, _gathered(rl_kernel.log_softmax(x3), t3, IGNORE), "3-D")
    assert_bits(got3.reshape(-1), got[:n], "3-D vs 2-D")

    # Another ignore_index value.
    t_alt = torch.where(ignored, torch.full_like(t, -1), t)
    got_alt = rl_kernel.token_logprobs(x, t_alt, ignore_index=-1)
    assert_bits(got_alt, got, "ignore_index=-1")


# ---------------------------------------------------------------- log_softmax over another dim


@pytest.mark.parametrize("dtype", inputs.DTYPES, ids=dname)
@pytest.mark.parametrize("dim", [0, 1, 2, -1, -2, -3])
def test_log_softmax_dim(dtype: torch.dtype, dim: int, device: str) -> None:
    x = inputs.logits(6 * 5, 257, dtype, seed=11).view(6, 5, 257).to(device)
    got = rl_kernel.log_softmax(x, dim=dim)
    want = rl_kernel.log_softmax(x.movedim(dim, -1).contiguous()).movedim(-1, dim)
    assert_bits(got, want, f"dim={dim} forward")
    w = weights(tuple(x.shape), 5, device)
    a = x.clone().requires_grad_()
    b = x.clone().requires_grad_()
    (ga,) = torch.autograd.grad((rl_kernel.log_softmax(a, dim=dim) * w).sum(), a)
    moved = b.movedim(dim, -1).contiguous()
    (gb,) = torch.autograd.grad((rl_kernel.log_softmax(moved).movedim(-1, dim) * w).sum(), b)
    assert_bits(ga, gb, f"dim={dim} gradient")


# ---------------------------------------------------------------- accuracy against float64


def _accuracy_input(vocab: int, dtype: torch.dtype) -> torch.Tensor:
    x = inputs.logits(rows_for(vocab), vocab, dtype, seed=100 + vocab)
    if vocab >= 8:  # finite edge rows: signed zeros, subnormals, constant
        x = torch.cat([x, inputs.edge_rows(vocab, dtype)[[NORMAL, SIGNED_ZEROS, SUBNORMALS, CONSTANT]]])
    return x


@pytest.mark.parametrize(("vocab", "dtype"), vd_params())
def test_forward_accuracy_vs_float64(vocab: int, dtype: torch.dtype) -> None:
    x = _accuracy_input(vocab, dtype)
    ref = torch.log_softmax(x.double(), dim=-1)
    lsm = rl_kernel.log_softmax(x)
    err = (lsm.double() - ref).abs().max().item()
    assert err <= LSM_MAX_ABS, f"log_softmax max abs error {err:.3e} > {LSM_MAX_ABS:.1e}"

    h_ref = -(ref.exp() * ref).sum(-1)
    h = rl_kernel.entropy(x).double()
    excess = ((h - h_ref).abs() - (ENT_RTOL * h_ref.abs() + ENT_ATOL)).max().item()
    worst = (h - h_ref).abs().max().item()
    assert excess <= 0, f"entropy error {worst:.3e} exceeds {ENT_RTOL:.0e} * H + {ENT_ATOL:.1e}"


# Backward, against float64 autograd (torch.log_softmax / gather / -sum(p log p) in float64) on the
# same inputs, for loss = sum(op(x) * w). The kernels compute the gradient in fp32 and round it once
# to the input dtype, so the bound per element is ulp_dtype(|ref|) (that rounding, generously) plus
# GRAD_SCALE[op] * scale, scale = |w| of the row (token_logprobs, entropy) or 1 + ||w_row||_2 for
# log_softmax, whose gradient w - p * sum(w) carries the rounding error of the fp32 sum of w.
# Measured (all VOCABS x DTYPES, 3 seeds), max of (err - ulp) / scale: token_logprobs 1.8e-7,
# entropy 6.1e-7, log_softmax 5.4e-7. Plain max abs errors: fp32 inputs 1.8e-7 (token_logprobs),
# 7.4e-7 (entropy), 2.7e-4 (log_softmax, V=151936, ||w|| = 390); bf16/fp16 inputs are dominated by
# the final rounding (bf16: 3.9e-3, 3.9e-3, 1.75 on gradients of magnitude ~100).
GRAD_SCALE = {"token_logprobs": 4e-7, "entropy": 1.2e-6, "log_softmax": 1.1e-6}
_MANTISSA = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}
_MIN_ULP = {torch.float32: 2.0**-149, torch.bfloat16: 2.0**-133, torch.float16: 2.0**-24}


def ulp(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of `dtype` values at |x| (float64 in, float64 out)."""
    _, e = torch.frexp(x.abs())
    return torch.ldexp(torch.ones_like(x), e - 1 - _MANTISSA[dtype]).clamp_min(_MIN_ULP[dtype])


def _reference_grad(op: str, x: torch.Tensor, t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xr = x.double().requires_grad_()
    lr = torch.log_softmax(xr, dim=-1)
    if op == "log_softmax":
        y = lr
    elif op == "token_logprobs":
        y = lr.gather(-1, t.clamp_min(0)[:, None])[:, 0] * (t != IGNORE)
    else:
        y = -(lr.exp() * lr).sum(-1)
    (g,) = torch.autograd.grad((y * w.double()).sum(), xr)
    return g


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize(("vocab", "dtype"), vd_params())
def test_backward_accuracy_vs_float64(op: str, vocab: int, dtype: torch.dtype) -> None:
    x, t = case(vocab, dtype, rows=rows_for(vocab) // 2 * 2, seed=200)
    t[::3] = IGNORE
    leaf = x.clone().requires_grad_()
    y = run(op, leaf, t)
    w = weights(tuple(y.shape), 9)
    (g,) = torch.autograd.grad((y * w).sum(), leaf)
    assert g.dtype == dtype
    ref = _reference_grad(op, x, t, w)
    wd = w.double()
    scale = (1 + wd.norm(dim=-1))[:, None] if op == "log_softmax" else wd.abs()[:, None]
    bound = GRAD_SCALE[op] * scale + ulp(ref, dtype)
    err = (g.double() - ref).abs()
    bad = err > bound
    assert not bool(bad.any()), (
        f"{int(bad.sum())} gradient elements off; worst excess {(err - bound).max().item():.3e}, "
        f"max abs error {err.max().item():.3e}"
    )
    if op == "token_logprobs":
        assert bool((int_view(g)[t == IGNORE] == 0).all()), "ignore_index rows must have an all +0.0 gradient"


@pytest.mark.parametrize(("vocab", "dtype"), vd_params((7, 256, 257, 32000, 151936)))
def test_repeated_backward_identical(vocab: int, dtype: torch.dtype, device: str) -> None:
    x, t = case(vocab, dtype, device)
    first, second = grads(x, t), grads(x, t)
    for op in OPS:
        assert first[op].dtype == dtype, op
        assert first[op].shape == x.shape, op
        assert_bits(second[op], first[op], f"{op} gradient, second run")


# ---------------------------------------------------------------- the no-grad path
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dname)
def test_no_grad_calls_give_the_autograd_paths_bits(dtype: torch.dtype, device: str) -> None:
    """token_logprobs and entropy call their kernel directly where no gradient can flow (a decode step's host
    time): the same bits as the autograd path, and no graph."""
    x, t = case(4099, dtype, device)
    t[1] = IGNORE
    for name, fn in (("token_logprobs", lambda v: rl_kernel.token_logprobs(v, t)), ("entropy", rl_kernel.entropy)):
        with_grad = fn(x.detach().requires_grad_(True))
        assert with_grad.grad_fn is not None, name
        with torch.no_grad():
            no_grad = fn(x.detach().requires_grad_(True))
        for path, out in (("inputs without grad", fn(x.detach())), ("torch.no_grad", no_grad)):
            assert out.grad_fn is None, (name, path)
            assert_bits(out, with_grad.detach(), f"{name}, {path}")
