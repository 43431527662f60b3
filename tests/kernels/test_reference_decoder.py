"""The CPU build of the decoder family equals its numpy transcription (rl_kernel/reference/decoder.py,
docs/numerics.md section 11) bit for bit.

Every equality compares integer views, never allclose. The accuracy of the transcription's scalar functions
against float64 is checked with explicit, measured bounds (these are not equality claims). Negative controls
show that a slightly wrong transcription (the linear chain in reverse k order, attention tiles counted from
key 0, attention's dk and dv over the query rows in descending order, its dS as p*dp - p*Dr) differs from
the CPU build on these inputs, so the comparisons can fail.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from bit_checks import assert_same, cpu_bits, dname

import rl_kernel
from rl_kernel import inputs
from rl_kernel.exact.common import contract as C
from rl_kernel.exact.decoder import reference as R
from rl_kernel.exact.decoder.ops import attention_with_stats

DTYPES = inputs.DTYPES
HEAD_DIMS = (2, 16, 34)
NAN, INF = float("nan"), float("inf")


def f32_bits(a) -> np.ndarray:
    """A float32 reference result's bits (uint32)."""
    return C.bits_of(np.ascontiguousarray(a)).copy()


def widen(t: torch.Tensor) -> np.ndarray:
    """A torch tensor's values, widened exactly to float32 (section 1)."""
    return C.row_to_f32(t)


def rand(shape: tuple[int, ...], dtype: torch.dtype, seed: int, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of the binary32 ulp of want (float64)."""
    ulp = np.spacing(np.abs(want.astype(np.float32))).astype(np.float64)
    return np.abs(got.astype(np.float64) - want) / ulp


# ---------------------------------------------------------------- linear (11.2)


def linear_inputs(k: int, dtype: torch.dtype, seed: int = 0):
    """x [3, 11, k] (a zero row, an inf), weight [19, k], bias [19], upstream gradient [3, 11, 19]."""
    x = rand((3, 11, k), dtype, seed)
    x[0, 2] = 0.0
    x[1, 4, k // 2] = INF
    w, b = rand((19, k), dtype, seed + 1, 0.2), rand((19,), dtype, seed + 2)
    return x, w, b, rand((3, 11, 19), dtype, seed + 3)


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize(("k", "bias"), [(7, True), (257, True), (34, False)])
def test_linear_equals_reference(k: int, bias: bool, dtype: torch.dtype) -> None:
    x, w, b, dy = linear_inputs(k, dtype, seed=k)
    leaves = [t.clone().requires_grad_() for t in ((x, w, b) if bias else (x, w))]
    y = rl_kernel.linear(*leaves) if bias else rl_kernel.linear(*leaves, None)
    grads = torch.autograd.grad(y, leaves, grad_outputs=dy)
    xf, wf, dyf = widen(x), widen(w), widen(dy)
    assert_same(cpu_bits(y), R.linear(xf, wf, widen(b) if bias else None, dtype), "y")
    dx, dw, db = R.linear_backward(xf, wf, dyf, dtype, bias=bias)
    assert_same(cpu_bits(grads[0]), dx, "dx")
    assert_same(cpu_bits(grads[1]), dw, "dW")
    if bias:
        assert_same(cpu_bits(grads[2]), db, "db")


# ---------------------------------------------------------------- rms_norm (11.2)


def check_rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float, dy: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """The forward (y, rstd) and backward (dx, dw) of the CPU build equal the reference; returns (y bits, rstd)."""
    dtype = x.dtype
    xl, wl = x.clone().requires_grad_(), w.clone().requires_grad_()
    y = rl_kernel.rms_norm(xl, wl, eps)
    dx, dw = torch.autograd.grad(y, (xl, wl), grad_outputs=dy)
    _, rstd = torch.ops.rl_kernel.rms_norm(x, w, eps)
    y_ref, r_ref = R.rms_norm(widen(x), widen(w), eps, dtype)
    assert_same(cpu_bits(y), y_ref, "y")
    assert_same(cpu_bits(rstd), f32_bits(r_ref), "rstd")
    dx_ref, dw_ref = R.rms_norm_backward(widen(dy), widen(x), widen(w), r_ref, dtype)
    assert_same(cpu_bits(dx), dx_ref, "dx")
    assert_same(cpu_bits(dw), dw_ref, "dw")
    return cpu_bits(y), r_ref


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("h", [1, 7, 13, 257, 1031])
def test_rms_norm_equals_reference(h: int, dtype: torch.dtype) -> None:
    x = rand((2, 9, h), dtype, h, 3.0)
    x[0, 0] = 0.0  # rsqrt(eps)
    check_rms_norm(x, rand((h,), dtype, h + 1), 1e-6, rand(tuple(x.shape), dtype, h + 2))


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_rms_norm_special_rows_equal_reference(dtype: torch.dtype) -> None:
    """eps = 0: a zero row (rsqrt_pos(+0) = +inf, y = NaN), a row whose mean of squares is subnormal
    (rsqrt's scaled path; fp16 cannot reach it), one whose sum of squares overflows (rsqrt_pos(+inf) = +0;
    not in fp16), rows with an inf and a NaN, and an ordinary row."""
    h = 13
    narrow = dtype == torch.float16
    tiny, huge = (6e-8, 6e4) if narrow else (1e-20, 1e20)
    x = rand((6, h), torch.float32, 7).to(dtype)
    x[0] = 0.0
    x[1] = torch.linspace(-tiny, tiny, h).to(dtype)
    x[2] = huge
    x[3, 5] = INF
    x[4, 2] = NAN
    y, r = check_rms_norm(x, rand((h,), dtype, 8), 0.0, rand((6, h), dtype, 9))
    assert f32_bits(r[0]) == 0x7F800000, "rsqrt_pos(+0) = +inf"
    assert (y[0] == C.store_bits(C.CANONICAL_NAN, dtype)).all(), "0 * inf = NaN, stored canonical"
    assert f32_bits(r[3]) == 0 and f32_bits(r[4]) == C.CANONICAL_NAN_BITS
    if not narrow:
        assert f32_bits(r[2]) == 0, "rsqrt_pos(+inf) = +0"


def test_rsqrt_pos_through_rms_norm() -> None:
    """With H = 1 and eps = 0, rms_norm's rstd is rsqrt_pos(x * x): the CPU's rsqrt_pos on values from
    subnormal to 1e38, +0, +inf and NaN equals the transcription's."""
    x = np.concatenate([np.geomspace(1e-23, 1e19, 4001), -np.geomspace(3e-22, 3e18, 7), [0.0, INF, NAN, 1e20]])
    xt = torch.tensor(x, dtype=torch.float32)[:, None]
    _, rstd = torch.ops.rl_kernel.rms_norm(xt, torch.ones(1), 0.0)
    xf = widen(xt)[:, 0]
    with np.errstate(over="ignore"):
        sq = xf * xf
    want = R.rsqrt_pos(sq)
    assert_same(cpu_bits(rstd), f32_bits(want), "rstd == rsqrt_pos(x*x)")
    assert_same(cpu_bits(rstd), f32_bits(R.rms_norm(widen(xt), np.ones(1, np.float32), 0.0, torch.float32)[1]), "rstd")
    assert int(((sq > 0) & (sq < C.MIN_NORMAL)).sum()) > 100, "the subnormal path is exercised"


# ---------------------------------------------------------------- rope_table, rotary (11.2)


@pytest.mark.parametrize("dh", HEAD_DIMS)
@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_rope_inv_freq_equals_reference(dh: int, base: float) -> None:
    assert_same(cpu_bits(rl_kernel.rope_inv_freq(dh, base)), f32_bits(R.rope_inv_freq(dh, base)), "inv_freq")


@pytest.mark.parametrize("dh", HEAD_DIMS)
def test_rope_table_equals_reference(dh: int) -> None:
    """Small and large positions; |angle| >= 2^22 (positions 2^22, 2^23, -5e6 at inv_freq 1) gives NaN."""
    pos = torch.cat([torch.arange(40), torch.tensor([1000, 32767, 131071, 500000])]).view(4, 11)
    big = torch.tensor([[2**22 - 1, 2**22, 2**23, -5_000_000, 2**24 + 1, -(2**22) + 1]])
    inv = rl_kernel.rope_inv_freq(dh, 500000.0)
    for p in (pos, big):
        c, s = rl_kernel.rope_table(p, inv)
        rc, rs = R.rope_table(p.numpy(), widen(inv))
        assert_same(cpu_bits(c), f32_bits(rc), "cos")
        assert_same(cpu_bits(s), f32_bits(rs), "sin")
    nan_cols = cpu_bits(c)[0, 1:4, 0]
    assert (nan_cols == C.CANONICAL_NAN_BITS).all(), "|angle| >= 2^22 gives the canonical NaN"
    assert np.isfinite(rc[0, [0, 5], 0]).all()


def test_sin_cos_through_rope_table() -> None:
    """Position 1 makes the angle inv_freq itself: the CPU's sin_cos on |x| < 100, near multiples of pi/2,
    subnormals, signed zeros, around 2^22, inf and NaN equals the transcription's."""
    rng = np.random.default_rng(3)
    k = np.arange(-63, 64)
    near = (k * np.pi / 2).astype(np.float32)
    special = [0.0, -0.0, 1e-40, -1e-40, 1e-30, 1e6, -1e6, 2.0**22 - 0.5, -(2.0**22) + 0.5, 2.0**22, -(2.0**22)]
    special += [INF, -INF, NAN]
    x = np.concatenate(
        [
            rng.uniform(-100, 100, 4096),
            near,
            np.nextafter(near, np.float32(INF)),
            np.nextafter(near, np.float32(-INF)),
            special,
        ]
    ).astype(np.float32)
    c, s = rl_kernel.rope_table(torch.ones(1, dtype=torch.long), torch.from_numpy(x))
    rs, rc = R.sin_cos(x)
    assert_same(cpu_bits(s)[0], f32_bits(rs), "sin")
    assert_same(cpu_bits(c)[0], f32_bits(rc), "cos")
    # sin(-0) is +0 by 11.1's formula: sr = fma_rn(sp * z, r, r) with sp * z = -0 and r = -0.
    assert f32_bits(rs[x.size - len(special) + 1]) == 0 and rc[x.size - len(special) + 1] == 1
    assert (f32_bits(rs[-5:]) == C.CANONICAL_NAN_BITS).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("dh", HEAD_DIMS)
def test_rotary_equals_reference(dh: int, dtype: torch.dtype) -> None:
    """Forward and backward (rotary with -sin); positions 0 .. 10 and 997 times those; an inf and a NaN."""
    x = rand((2, 3, 11, dh), dtype, dh)
    x[0, 0, 0, 0] = INF  # position 0: (inf * 1 - x2 * 0, x2 * 1 + inf * 0) = (inf, NaN)
    x[1, 2, 5, dh - 1] = NAN
    pos = torch.arange(11).repeat(2, 1) * torch.tensor([[1], [997]])
    inv = rl_kernel.rope_inv_freq(dh, 10000.0)
    cos, sin = rl_kernel.rope_table(pos, inv)
    rc, rs = R.rope_table(pos.numpy(), widen(inv))
    assert_same(cpu_bits(cos), f32_bits(rc), "cos")
    assert_same(cpu_bits(sin), f32_bits(rs), "sin")
    xl = x.clone().requires_grad_()
    y = rl_kernel.rotary(xl, cos, sin)
    dy = rand(tuple(x.shape), dtype, dh + 1)
    (dx,) = torch.autograd.grad(y, xl, grad_outputs=dy)
    assert_same(cpu_bits(y), R.rotary(widen(x), rc, rs, dtype), "rotary")
    assert_same(cpu_bits(dx), R.rotary_backward(widen(dy), rc, rs, dtype), "rotary backward")


# ---------------------------------------------------------------- silu_mul (11.2)


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("size", [7, 257])
def test_silu_mul_equals_reference(size: int, dtype: torch.dtype) -> None:
    """Forward and backward on random gates and +-0, +-90, +-inf, NaN, +-86 (exp_flushed's edge), subnormals."""
    g = rand((5, size), dtype, size, 4.0)
    g[0, :7] = torch.tensor([0.0, -0.0, 90.0, -90.0, INF, -INF, NAN]).to(dtype)
    sub = 1e-7 if dtype == torch.float16 else 1e-40
    g[1, :7] = torch.tensor([86.0, -86.0, -86.5, -85.9, sub, -sub, 2.0**-14]).to(dtype)
    u = rand((5, size), dtype, size + 1)
    u[2, 0] = INF
    gl, ul = g.clone().requires_grad_(), u.clone().requires_grad_()
    y = rl_kernel.silu_mul(gl, ul)
    dy = rand((5, size), dtype, size + 2)
    dg, du = torch.autograd.grad(y, (gl, ul), grad_outputs=dy)
    assert_same(cpu_bits(y), R.silu_mul(widen(g), widen(u), dtype), "silu_mul")
    dg_ref, du_ref = R.silu_mul_backward(widen(dy), widen(g), widen(u), dtype)
    assert_same(cpu_bits(dg), dg_ref, "d gate")
    assert_same(cpu_bits(du), du_ref, "d up")


def test_sigmoid_and_rcp_pos_through_silu() -> None:
    """silu_mul(g, 1) in fp32 is g * sigmoid(g), with rcp_pos on 1 + e in [1, 2]: a dense grid of gates."""
    g = np.linspace(-100, 100, 40001, dtype=np.float32)
    out = rl_kernel.silu_mul(torch.from_numpy(g), torch.ones(g.size))
    assert_same(cpu_bits(out), R.silu_mul(g, np.ones(g.size, np.float32), torch.float32), "silu")


# ---------------------------------------------------------------- attention (11.2)


def attention_inputs(dh: int, dtype: torch.dtype, seed: int = 0):
    """4 sequences, 4 query heads over 2 KV heads, 70 keys (tiles of 32 from k_start), prefill; left padding
    0, 3, 33, 69 (sequence 3's rows 0 .. 68 see no key); a NaN in k (sequence 1, KV head 0, key 40) and an
    inf in q (sequence 2, head 3, row 50)."""
    b, hq, hkv, t = 4, 4, 2, 70
    q = rand((b, hq, t, dh), dtype, seed, 2.0)
    k, v = rand((b, hkv, t, dh), dtype, seed + 1), rand((b, hkv, t, dh), dtype, seed + 2)
    k[1, 0, 40, dh - 1] = NAN
    q[2, 3, 50, 0] = INF
    q_pos = torch.arange(t).repeat(b, 1)
    k_start = torch.tensor([0, 3, 33, 69])
    return q, k, v, q_pos, k_start


def reference_attention(q, k, v, q_pos, k_start, scale: float | None = None, **variant):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return R.attention(widen(q), widen(k), widen(v), q_pos.numpy(), k_start.numpy(), scale, q.dtype, **variant)


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("dh", HEAD_DIMS)
def test_attention_equals_reference(dh: int, dtype: torch.dtype) -> None:
    q, k, v, q_pos, k_start = attention_inputs(dh, dtype, seed=dh)
    out, stats = attention_with_stats(q, k, v, q_pos, k_start)
    assert_same(cpu_bits(rl_kernel.attention(q, k, v, q_pos, k_start)), cpu_bits(out), "attention == with_stats")
    o_ref, st_ref = reference_attention(q, k, v, q_pos, k_start)
    assert_same(cpu_bits(out), o_ref, "output")
    assert_same(cpu_bits(stats), f32_bits(st_ref), "stats (m, l)")
    # The contract's edge cases, on the CPU's bits: padding rows, the NaN key, the inf query.
    o, st = cpu_bits(out), cpu_bits(stats)
    assert (o[3, :, :69] == 0).all(), "a row that sees no key is +0"
    assert (st[3, :, :69, 0] == f32_bits(-C.FLT_MAX)).all() and (st[3, :, :69, 1] == 0).all()
    nan = C.CANONICAL_NAN_BITS if dtype == torch.float32 else C.store_bits(C.CANONICAL_NAN, dtype)
    assert (o[1, :2, 40:] == nan).all() and (o[1, :2, :40] != nan).all(), "the NaN key poisons the rows that see it"
    assert (o[2, 3, 50] == nan).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_attention_decode_rows_equal_reference(dtype: torch.dtype) -> None:
    """Tq = 3 rows over a 70-key cache, no GQA, an explicit scale; a row whose q_pos is below k_start."""
    dh = 16
    q = rand((3, 2, 3, dh), dtype, 40, 2.0)
    k, v = rand((3, 2, 70, dh), dtype, 41), rand((3, 2, 70, dh), dtype, 42)
    q_pos = torch.tensor([[10, 45, 69], [31, 32, 64], [4, 40, 69]])
    k_start = torch.tensor([0, 1, 5])
    out, stats = attention_with_stats(q, k, v, q_pos, k_start, 0.3)
    o_ref, st_ref = reference_attention(q, k, v, q_pos, k_start, 0.3)
    assert_same(cpu_bits(out), o_ref, "output")
    assert_same(cpu_bits(stats), f32_bits(st_ref), "stats (m, l)")
    assert (cpu_bits(out)[2, :, 0] == 0).all()


def attention_grads(q, k, v, q_pos, k_start, do, scale: float | None = None):
    """The CPU build's (dq, dk, dv) through autograd, checked equal to the operator called directly on
    attention_with_stats' (out, stats)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    grads = torch.autograd.grad(rl_kernel.attention(*leaves, q_pos, k_start, scale), leaves, grad_outputs=do)
    out, stats = attention_with_stats(q, k, v, q_pos, k_start, scale)
    direct = torch.ops.rl_kernel.attention_backward(do, q, k, v, out, stats, q_pos, k_start, scale)
    for name, a, b in zip(("dq", "dk", "dv"), grads, direct, strict=True):
        assert_same(cpu_bits(a), cpu_bits(b), f"{name}: autograd == attention_backward")
    return tuple(cpu_bits(g) for g in grads)


def reference_attention_backward(q, k, v, q_pos, k_start, do, scale: float | None = None, **variant):
    """The transcription's (dq, dk, dv) from the transcription's own forward (out bits widened, stats)."""
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    o_ref, st_ref = reference_attention(q, k, v, q_pos, k_start, scale)
    o = R.load_bits(o_ref, q.dtype)
    qk = (q_pos.numpy(), k_start.numpy(), scale, q.dtype)
    return R.attention_backward(widen(do), widen(q), widen(k), widen(v), o, st_ref, *qk, **variant)


def assert_grads_same(got, want) -> None:
    for name, g, w in zip(("dq", "dk", "dv"), got, want, strict=True):
        assert_same(g, w, name)


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("dh", HEAD_DIMS)
def test_attention_backward_equals_reference(dh: int, dtype: torch.dtype) -> None:
    """attention_inputs' cases (GQA 4 over 2, 70 keys, left padding 0, 3, 33, 69, a NaN key, an inf query)."""
    q, k, v, q_pos, k_start = attention_inputs(dh, dtype, seed=dh)
    do = rand(tuple(q.shape), dtype, dh + 3)
    dq, dk, dv = attention_grads(q, k, v, q_pos, k_start, do)
    assert_grads_same((dq, dk, dv), reference_attention_backward(q, k, v, q_pos, k_start, do))
    # The contract's edge cases, on the CPU's bits.
    nan = C.store_bits(C.CANONICAL_NAN, dtype)
    assert (dq[3, :, :69] == 0).all(), "a row that sees no key gets +0"
    for b, j0 in enumerate((0, 3, 33, 69)):
        assert (dk[b, :, :j0] == 0).all() and (dv[b, :, :j0] == 0).all(), "keys before k_start get +0"
    assert (dq[1, :2, 40:] == nan).all() and (dq[1, :2, :40] != nan).all(), "rows that see the NaN key are bad"
    assert (dk[1, 0, 3:] == nan).all() and (dv[1, 0, 3:] == nan).all(), "a bad row poisons every key it sees"
    assert (dq[2, 3, 50] == nan).all() and (dk[2, 1, 33:51] == nan).all()
    assert (dk[2, 1, 51:] != nan).all() and (dk[2, 0] != nan).all()
    for g in (dq, dk, dv):  # not vacuous: 47 % to 56 % are ordinary numbers (the rest padding zeros, NaN)
        assert ((g != 0) & (g != nan)).mean() > 0.4


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_attention_backward_decode_rows_equal_reference(dtype: torch.dtype) -> None:
    """Tq = 3 rows over a 70-key cache, no GQA, an explicit scale: keys no row sees get +0, and so does a row
    whose q_pos is below k_start."""
    dh = 16
    q = rand((3, 2, 3, dh), dtype, 40, 2.0)
    k, v = rand((3, 2, 70, dh), dtype, 41), rand((3, 2, 70, dh), dtype, 42)
    q_pos = torch.tensor([[10, 45, 69], [31, 32, 64], [4, 40, 69]])
    k_start = torch.tensor([0, 1, 5])
    do = rand(tuple(q.shape), dtype, 43)
    dq, dk, dv = attention_grads(q, k, v, q_pos, k_start, do, 0.3)
    assert_grads_same((dq, dk, dv), reference_attention_backward(q, k, v, q_pos, k_start, do, 0.3))
    assert (dq[2, :, 0] == 0).all() and (dk[1, :, 65:] == 0).all() and (dv[1, :, 65:] == 0).all()
    assert (dk[1, :, 1:65] != 0).all()


# ---------------------------------------------------------------- sliding windows (11.2)
WINDOWS = (1, 20, 32, 45)  # one key; shorter, equal to and longer than a tile; the 70-key rows cut by each


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("window", WINDOWS)
def test_windowed_attention_and_its_backward_equal_reference(window: int, dtype: torch.dtype) -> None:
    """attention_inputs' cases with a sliding window shorter than the rows: a row sees max(k_start, q - w + 1) .. q,
    its tiles counted from that first key; output, statistics and (dq, dk, dv) == the transcription's."""
    q, k, v, q_pos, k_start = attention_inputs(24, dtype, seed=window)
    out, stats = attention_with_stats(q, k, v, q_pos, k_start, window=window)
    o_ref, st_ref = reference_attention(q, k, v, q_pos, k_start, window=window)
    assert_same(cpu_bits(out), o_ref, "output")
    assert_same(cpu_bits(stats), f32_bits(st_ref), "stats (m, l)")
    do = rand(tuple(q.shape), dtype, window + 5)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    got = torch.autograd.grad(rl_kernel.attention(*leaves, q_pos, k_start, window=window), leaves, grad_outputs=do)
    scale = q.shape[-1] ** -0.5
    o = R.load_bits(o_ref, q.dtype)
    want = R.attention_backward(widen(do), widen(q), widen(k), widen(v), o, st_ref, q_pos.numpy(), k_start.numpy(),
                                scale, q.dtype, window=window)  # fmt: skip
    assert_grads_same(tuple(cpu_bits(g) for g in got), want)
    unwindowed = cpu_bits(rl_kernel.attention(q, k, v, q_pos, k_start))
    assert (cpu_bits(out)[0, :, window + 2 :] != unwindowed[0, :, window + 2 :]).any(), "the window must cut keys"


@pytest.mark.parametrize("window", WINDOWS)
def test_a_windowed_decode_row_over_a_cut_cache_equals_its_prefill_row(window: int) -> None:
    """The row's bits depend on its window's keys only: the last row of a left-padded prefill, the same row as a
    decode step over the full cache, and over a cache that keeps only the window's keys (as transformers' sliding
    window layers do) are equal. The control: tiles counted from the sequence's first key (k_start, not the
    window's) give other bits."""
    dtype, dh, t = torch.bfloat16, 24, 70
    q = rand((2, 4, t, dh), dtype, 60 + window, 2.0)
    k, v = rand((2, 2, t, dh), dtype, 61), rand((2, 2, t, dh), dtype, 62)
    q_pos, k_start = torch.arange(t).repeat(2, 1), torch.tensor([0, 7])
    prefill = cpu_bits(rl_kernel.attention(q, k, v, q_pos, k_start, window=window))[:, :, -1]
    last = torch.tensor([[t - 1], [t - 1]])
    full = cpu_bits(rl_kernel.attention(q[:, :, -1:], k, v, last, k_start, window=window))[:, :, 0]
    assert_same(full, prefill, "decode over the full cache")
    keep = min(window, t - 7)  # the window's keys (fewer where the left padding cuts it)
    cut = rl_kernel.attention(q[:, :, -1:], k[:, :, -keep:], v[:, :, -keep:], torch.full((2, 1), keep - 1),
                              torch.tensor([0, max(0, 7 - (t - keep))]), window=window)  # fmt: skip
    assert_same(cpu_bits(cut)[:, :, 0], prefill, "decode over a cache cut to the window")
    _, stats = attention_with_stats(q, k, v, q_pos, k_start, window=window)
    _, st_wrong = reference_attention(q, k, v, q_pos, k_start, window=window, tile_base=np.array([0, 7]))
    if window > 32:  # a window of one tile or less has one tile whichever key it is counted from
        assert (f32_bits(st_wrong) != cpu_bits(stats)).any(), "tiles from k_start must differ (the statistics)"


def test_a_window_must_be_a_count_of_keys() -> None:
    q, k, v, q_pos, k_start = attention_inputs(8, torch.float32)
    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match="window must be an int >= 0"):
            rl_kernel.attention(q, k, v, q_pos, k_start, window=bad)


# ---------------------------------------------------------------- negative controls


def test_negative_control_linear_reverse_k() -> None:
    """The chain summed in reverse k order is a wrong transcription: it differs from the CPU build."""
    x, w, b, _ = linear_inputs(257, torch.float32, seed=257)
    got = cpu_bits(rl_kernel.linear(x, w, b))
    assert_same(got, R.linear(widen(x), widen(w), widen(b), torch.float32), "y")
    wrong = R.linear(widen(x), widen(w), widen(b), torch.float32, k_order=range(256, -1, -1))
    assert (got != wrong).sum() > got.size // 4, "the reversed chain must differ"


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
def test_negative_control_attention_tiles_from_zero(dtype: torch.dtype) -> None:
    """Tiles counted from key 0 instead of k_start are a wrong transcription: the statistics differ."""
    q, k, v, q_pos, k_start = attention_inputs(34, dtype, seed=34)
    out, stats = attention_with_stats(q, k, v, q_pos, k_start)
    o_wrong, st_wrong = reference_attention(q, k, v, q_pos, k_start, tile_base=np.zeros(4, np.int64))
    differ = int((cpu_bits(stats) != f32_bits(st_wrong)).sum())
    assert differ > 0, "tiles counted from 0 must differ"
    if dtype == torch.float32:
        assert (cpu_bits(out) != o_wrong).any()


def test_negative_control_attention_backward() -> None:
    """Wrong transcriptions of the backward differ from the CPU build (fp32, where the chains' last bits are
    kept): dk and dv with the query rows in descending order (dq unchanged; measured 6464 and 6872 of 19040
    differ), and dS = p*dp - p*Dr (dv unchanged; 12076 of 38080 dq and 4943 of 19040 dk differ). In bf16 and
    fp16 the final rounding hides almost all of these (0 to 13 elements), so fp32 carries the control."""
    q, k, v, q_pos, k_start = attention_inputs(34, torch.float32, seed=34)
    do = rand(tuple(q.shape), torch.float32, 37)
    dq, dk, dv = attention_grads(q, k, v, q_pos, k_start, do)
    assert_grads_same((dq, dk, dv), reference_attention_backward(q, k, v, q_pos, k_start, do))
    wq, wk, wv = reference_attention_backward(q, k, v, q_pos, k_start, do, row_order=range(69, -1, -1))
    assert_same(dq, wq, "dq (the row order is dk's and dv's)")
    assert (dk != wk).sum() > dk.size // 5 and (dv != wv).sum() > dv.size // 5, "descending rows must differ"
    wq, wk, wv = reference_attention_backward(q, k, v, q_pos, k_start, do, split_ds=True)
    assert_same(dv, wv, "dv (no dS in it)")
    assert (dq != wq).sum() > dq.size // 5 and (dk != wk).sum() > dk.size // 10, "p*dp - p*Dr must differ"


# ---------------------------------------------------------------- accuracy of the scalars (float64)


def test_rcp_pos_accuracy() -> None:
    """rcp_pos on [1, 2] within 1 ulp of 1/x (measured 0.5: correctly rounded on this grid)."""
    x = np.unique(np.concatenate([np.linspace(1, 2, 1 << 17), np.random.default_rng(1).uniform(1, 2, 1 << 15)]))
    x = x.astype(np.float32)
    assert ulps(R.rcp_pos(x), 1.0 / x.astype(np.float64)).max() <= 1.0


def test_rsqrt_pos_accuracy_and_special_values() -> None:
    """rsqrt_pos within 2 ulp of 1/sqrt(v) from the smallest subnormal to 3e38 (measured 1.72, just above
    2^-126); NaN or negative -> canonical NaN; +-0 -> +inf; +inf -> +0."""
    v = np.geomspace(1.4e-45, 3e38, 200001).astype(np.float32)
    v = v[v > 0]
    assert ulps(R.rsqrt_pos(v), 1.0 / np.sqrt(v.astype(np.float64))).max() <= 2.0
    assert int((v < C.MIN_NORMAL).sum()) > 1000
    special = np.array([NAN, -1.0, -INF, -1e-40, 0.0, -0.0, INF], dtype=np.float32)
    want = [C.CANONICAL_NAN_BITS] * 4 + [0x7F800000, 0x7F800000, 0]
    assert f32_bits(R.rsqrt_pos(special)).tolist() == want


def test_sin_cos_accuracy() -> None:
    """sin_cos on |x| < 100 within 2 ulp on a uniform grid (measured 1.8) and within 6 ulp at the float32
    numbers nearest the multiples of pi/2 (measured 5.8: there the result is ~1e-8 and the reduction's
    pi/2 = P1 + P2 + P3 error shows); |x| >= 2^22 gives NaN. P1 + P2 + P3 is pi/2 to 2^-48."""
    x = np.linspace(-100, 100, 400001, dtype=np.float32)
    s, c = R.sin_cos(x)
    x64 = x.astype(np.float64)
    assert ulps(s, np.sin(x64)).max() <= 2.0 and ulps(c, np.cos(x64)).max() <= 2.0
    near = (np.arange(-63, 64) * np.pi / 2).astype(np.float32)
    near = np.concatenate([near, np.nextafter(near, np.float32(INF)), np.nextafter(near, np.float32(-INF))])
    s, c = R.sin_cos(near)
    n64 = near.astype(np.float64)
    assert ulps(s, np.sin(n64)).max() <= 6.0 and ulps(c, np.cos(n64)).max() <= 6.0
    assert abs(float(R.PIO2_1) + float(R.PIO2_2) + float(R.PIO2_3) - math.pi / 2) < 2.0**-48
    assert np.float32(2 / math.pi) == R.TWO_OVER_PI
    s, c = R.sin_cos(np.array([2.0**22, -(2.0**22), 1e30], dtype=np.float32))
    assert np.isnan(s).all() and np.isnan(c).all()
