"""The decoder family's reference in numpy: docs/numerics.md section 11 (the scalar functions of 11.1 and
the operators of 11.2: linear, rms_norm, rope_table, rotary, silu_mul, attention, and their backwards), on
the shared contract (reference/contract.py, sections 1-3).

Inputs are float32 numpy arrays holding the exactly widened values of the operator's dtype
(contract.row_to_f32); ``dtype`` is the torch dtype the outputs are stored in. Outputs stored by
``store_out`` come back as integer bits (uint32 for fp32, uint16 for bf16/fp16, as contract.store_bits);
fp32-only results (rms_norm's rstd, the rope table, attention's statistics) as float32 arrays.

Every reduction is evaluated in the order section 11 writes: a linear/dot/dw chain is a Python loop over
its index (vectorised over the other axes), a plain sum is section 2's tree (vectorised over rows).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from rl_kernel.exact.common.contract import (
    CANONICAL_NAN,
    CHUNK,
    F32,
    FLT_MAX,
    HALF,
    MIN_NORMAL,
    ONE,
    ROUND_MAGIC,
    U32,
    ZERO,
    _c,
    _f32,
    _quiet,
    bits_of,
    canonical,
    chunk_sum,
    exp_flushed,
    exp_fold,
    float_of,
    fma_rn,
    from_bf16_bits,
    from_f16_bits,
    max_nan,
    row_sum,
    store_bits,
)

# ---- constants of section 11.1 (the polynomial and pi/2 constants: "constants in numerics.h") ----
RCP_MAGIC = U32(0x7EF311C3)
RSQRT_MAGIC = U32(0x5F375A86)
POS_INF = F32(np.inf)
SCALE_UP_64 = _c("0x1p64")  # a subnormal v is scaled by 2^64 ...
SCALE_DOWN_32 = _c("0x1p32")  # ... and its rsqrt by 2^32 (sqrt(2^64))
TRIG_MAX = _c("0x1p22")
TWO_OVER_PI = _c("0x1.45f306p-1")
PIO2_1 = _c("0x1.92p+0")
PIO2_2 = _c("0x1.fb4p-12")
PIO2_3 = _c("0x1.4442d2p-24")
SIN_COEFFS = (_c("-0x1.555546p-3"), _c("0x1.11073cp-7"), _c("-0x1.9943f2p-13"))  # S1, S2, S3
COS_COEFFS = (_c("0x1.55554ap-5"), _c("-0x1.6c0c34p-10"), _c("0x1.99eb9cp-16"))  # C1, C2, C3
ATTN_TILE = 32  # "tiles of 32 keys counted from j0"


# ---- 11.1 scalar functions (elementwise on arrays) ---------------------------------------------
@_quiet
def rcp_pos(x) -> np.ndarray:
    """1/x for a positive normal x < 2^126 (11.1): r = bits^-1(0x7ef311c3 - bits(x)), then 4 times
    e = fma_rn(-x, r, 1), r = fma_rn(r, e, r)."""
    x = _f32(x)
    r = float_of(RCP_MAGIC - bits_of(x))
    for _ in range(4):
        e = fma_rn(-x, r, ONE)
        r = fma_rn(r, e, r)
    return r


@_quiet
def rsqrt_core(v) -> np.ndarray:
    """h = 0.5 * v, y = bits^-1(0x5f375a86 - (bits(v) >> 1)), then 3 times e = fma_rn(-(h*y), y, 0.5),
    y = fma_rn(y, e, y) (11.1)."""
    v = _f32(v)
    h = HALF * v
    y = float_of(RSQRT_MAGIC - (bits_of(v) >> U32(1)))
    for _ in range(3):
        e = fma_rn(-(h * y), y, HALF)
        y = fma_rn(y, e, y)
    return y


@_quiet
def rsqrt_pos(v) -> np.ndarray:
    """1/sqrt(v) (11.1): NaN or negative -> canonical NaN; +0 -> +inf; +inf -> +0; subnormal v ->
    rsqrt_core(v * 2^64) * 2^32; else rsqrt_core(v). (-0 compares equal to +0 and is not < 0, so it
    takes the +0 case; it cannot reach here through rms_norm, whose argument is ss * inv_n + eps.)"""
    v = _f32(v)
    sub = (v > ZERO) & (v < MIN_NORMAL)
    core = rsqrt_core(np.where(sub, v * SCALE_UP_64, v))
    core = np.where(sub, core * SCALE_DOWN_32, core)
    out = np.where(v == POS_INF, ZERO, core)
    out = np.where(v == ZERO, POS_INF, out)
    return np.where(np.isnan(v) | (v < ZERO), CANONICAL_NAN, out)


@_quiet
def sin_cos(x) -> tuple[np.ndarray, np.ndarray]:
    """(sin x, cos x) (11.1): |x| >= 2^22 or NaN -> both canonical NaN; t = x * (2/pi) + M (two roundings),
    k = t - M, q = bits(t) & 3; r = x - k*pi/2 by three fma_rn (P1, P2, P3); z = r*r;
    sr = fma_rn(fma_rn(fma_rn(S3, z, S2), z, S1) * z, r, r);
    cr = fma_rn(fma_rn(fma_rn(C3, z, C2), z, C1) * z, z, fma_rn(-0.5, z, 1));
    (sin, cos) = (sr, cr), (cr, -sr), (-sr, -cr), (-cr, sr) for q = 0, 1, 2, 3."""
    x = _f32(x)
    t = (x * TWO_OVER_PI) + ROUND_MAGIC
    k = t - ROUND_MAGIC
    q = bits_of(t) & U32(3)
    r = fma_rn(-k, PIO2_1, x)
    r = fma_rn(-k, PIO2_2, r)
    r = fma_rn(-k, PIO2_3, r)
    z = r * r
    s1, s2, s3 = SIN_COEFFS
    c1, c2, c3 = COS_COEFFS
    sr = fma_rn(fma_rn(fma_rn(s3, z, s2), z, s1) * z, r, r)
    cr = fma_rn(fma_rn(fma_rn(c3, z, c2), z, c1) * z, z, fma_rn(-HALF, z, ONE))
    sin = np.select([q == 0, q == 1, q == 2], [sr, cr, -sr], -cr)
    cos = np.select([q == 0, q == 1, q == 2], [cr, -sr, -cr], sr)
    bad = ~(np.abs(x) < TRIG_MAX)
    return np.where(bad, CANONICAL_NAN, sin).astype(F32), np.where(bad, CANONICAL_NAN, cos).astype(F32)


@_quiet
def sigmoid(g) -> np.ndarray:
    """11.1: NaN -> canonical NaN; e = exp_flushed(0 - |g|), r = rcp_pos(1 + e); r for g >= 0, e*r for g < 0."""
    g = _f32(g)
    e = exp_flushed(ZERO - np.abs(g))
    r = rcp_pos(ONE + e)
    return np.where(np.isnan(g), CANONICAL_NAN, np.where(g >= ZERO, r, e * r))


def no_neg_zero(x) -> np.ndarray:
    """no_neg_zero(x) = x + 0 (11.1): -0 becomes +0, every other value is unchanged."""
    return _f32(x) + ZERO


# ---- storing (section 11 preamble, section 1's conversions) --------------------------------------
def store_out(x, dtype: torch.dtype) -> np.ndarray:
    """store_out: a NaN becomes the canonical NaN, then rounded to dtype (nearest even); integer bits."""
    return store_bits(canonical(x), dtype)


def load_bits(bits, dtype: torch.dtype) -> np.ndarray:
    """Stored bits of dtype widened exactly to float32."""
    if dtype == torch.float32:
        return float_of(bits)
    if dtype == torch.bfloat16:
        return from_bf16_bits(bits)
    if dtype == torch.float16:
        return from_f16_bits(bits)
    raise TypeError(f"rl_kernel.exact.reference: unsupported dtype {dtype}")


def rounded(x, dtype: torch.dtype) -> np.ndarray:
    """rounded_D(v): v stored to dtype and widened back."""
    return load_bits(store_out(x, dtype), dtype)


# ---- linear (11.2) ---------------------------------------------------------------------------------
@_quiet
def linear_acc(x, w, k_order: Sequence[int] | None = None) -> np.ndarray:
    """acc[m, n]: one chain from +0, acc = fma_rn(x[m, k], w[n, k], acc) for k = 0 .. K-1 (x [M, K],
    w [N, K]; fp32). k_order replaces the order of k (a wrong variant, for the negative control)."""
    x, w = _f32(x), _f32(w)
    acc = np.zeros((x.shape[0], w.shape[0]), dtype=F32)
    for k in range(x.shape[1]) if k_order is None else k_order:
        acc = fma_rn(x[:, k, None], w[None, :, k], acc)
    return acc


@_quiet
def linear(x, w, bias, dtype: torch.dtype, k_order: Sequence[int] | None = None) -> np.ndarray:
    """y = store_out(acc + bias[n]) (or store_out(acc) without a bias); x [..., K], w [N, K]."""
    x = _f32(x)
    acc = linear_acc(x.reshape(-1, x.shape[-1]), w, k_order)
    if bias is not None:
        acc = acc + _f32(bias)[None, :]
    return store_out(acc, dtype).reshape(*x.shape[:-1], acc.shape[1])


@_quiet
def linear_backward(
    x, w, dy, dtype: torch.dtype, bias: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(dx, dW, db) (11.2): dx = linear(dy, w^T), dW = linear(dy^T, x^T) (a chain over rows m in order),
    db = linear(dy^T, 1) (fma_rn(dy, 1, acc): the rounded sum in row order); transposes are exact copies."""
    x, w, dy = _f32(x), _f32(w), _f32(dy)
    x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, w.shape[0])
    dx = linear(dy2, w.T, None, dtype).reshape(x.shape)
    dw = linear(dy2.T, x2.T, None, dtype)
    db = linear(dy2.T, np.ones((1, dy2.shape[0]), dtype=F32), None, dtype).reshape(-1) if bias else None
    return dx, dw, db


# ---- rms_norm (11.2) -------------------------------------------------------------------------------
@_quiet
def row_tree_sums(terms) -> np.ndarray:
    """Section 2's plain sum of every row of terms [R, H]: chunks of 8 (padded with 0) summed pairwise,
    then one perfect binary tree over the chunk index (empty leaves 0), one level at a time."""
    terms = _f32(terms)
    rows, h = terms.shape
    nchunks = -(-h // CHUNK)
    width = 1 << max(0, nchunks - 1).bit_length()
    x = np.zeros((rows, nchunks * CHUNK), dtype=F32)
    x[:, :h] = terms
    leaves = np.zeros((rows, width), dtype=F32)
    leaves[:, :nchunks] = chunk_sum(x.reshape(rows, nchunks, CHUNK))
    while leaves.shape[1] > 1:
        leaves = leaves[:, 0::2] + leaves[:, 1::2]
    return leaves[:, 0]


def inverse_of(h: int) -> np.float32:
    """inv_n = 1/H computed in float64 and rounded to binary32 (on the host)."""
    return F32(1.0 / float(h))


@_quiet
def rms_norm(x, w, eps: float, dtype: torch.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(y bits, rstd) over the last dimension H: ss = tree sum of x_i*x_i; r = rsqrt_pos(ss * inv_n + eps)
    (eps rounded to binary32); y_i = store_out(rounded_D(x_i * r) * w_i). rstd = r, fp32 [...]."""
    x, w = _f32(x), _f32(w)
    h = x.shape[-1]
    x2 = x.reshape(-1, h)
    ss = row_tree_sums(x2 * x2)
    r = rsqrt_pos(ss * inverse_of(h) + F32(eps))
    y = store_out(rounded(x2 * r[:, None], dtype) * w[None, :], dtype)
    return y.reshape(x.shape), r.reshape(x.shape[:-1])


@_quiet
def rms_norm_backward(dy, x, w, rstd, dtype: torch.dtype) -> tuple[np.ndarray, np.ndarray]:
    """(dx, dw) bits (11.2), g_i = dy_i * w_i: dot = tree sum of no_neg_zero(g_i * x_i);
    c = (((dot * inv_n) * r) * r) * r; dx_i = store_out(r * g_i - x_i * c);
    dw_j = chain from +0 over rows m in order of fma_rn(dy[m, j], rounded_D(x[m, j] * r_m), acc)."""
    dy, x, w, rstd = _f32(dy), _f32(x), _f32(w), _f32(rstd)
    h = x.shape[-1]
    dy2, x2, r = dy.reshape(-1, h), x.reshape(-1, h), rstd.reshape(-1)
    inv_n = inverse_of(h)
    g = dy2 * w[None, :]
    dot = row_tree_sums(no_neg_zero(g * x2))
    c = (((dot * inv_n) * r) * r) * r
    dx = store_out(r[:, None] * g - x2 * c[:, None], dtype)
    acc = np.zeros(h, dtype=F32)
    for m in range(x2.shape[0]):
        acc = fma_rn(dy2[m], rounded(x2[m] * r[m], dtype), acc)
    return dx.reshape(x.shape), store_out(acc, dtype)


# ---- rotary (11.2) ---------------------------------------------------------------------------------
def rope_inv_freq(head_dim: int, base: float = 10000.0) -> np.ndarray:
    """base^(-2i/D) for i < D/2 in float64, rounded once to binary32 (no scaling)."""
    return np.array([float(base) ** (-(2 * i) / head_dim) for i in range(head_dim // 2)], dtype=np.float64).astype(F32)


@_quiet
def rope_table(positions, inv_freq) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin)[..., i] = sin_cos(float(pos) * inv_freq_i) (one rounded product), canonical NaN; fp32."""
    pos = np.asarray(positions, dtype=np.int64).astype(F32)
    sin, cos = sin_cos(pos[..., None] * _f32(inv_freq))
    return canonical(cos), canonical(sin)


@_quiet
def rotary(x, cos, sin, dtype: torch.dtype) -> np.ndarray:
    """x [B, H, T, D], cos/sin [B, T, D/2]: out_i = store_out(x1*c - x2*s), out_{i+D/2} =
    store_out(x2*c + x1*s), x1 = x_i, x2 = x_{i+D/2} (Hugging Face's rotate_half pairing)."""
    x = _f32(x)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = _f32(cos)[:, None], _f32(sin)[:, None]
    return store_out(np.concatenate([x1 * c - x2 * s, x2 * c + x1 * s], axis=-1), dtype)


def rotary_backward(dy, cos, sin, dtype: torch.dtype) -> np.ndarray:
    """The same operator with -sin (a rotation's transpose; the negation is exact)."""
    return rotary(dy, cos, -_f32(sin), dtype)


# ---- silu_mul (11.2) -------------------------------------------------------------------------------
@_quiet
def silu_mul(g, u, dtype: torch.dtype) -> np.ndarray:
    """out = store_out((g * sigmoid(g)) * u) (the SiLU in fp32, not rounded before the product)."""
    g, u = _f32(g), _f32(u)
    return store_out((g * sigmoid(g)) * u, dtype)


@_quiet
def silu_mul_backward(dy, g, u, dtype: torch.dtype) -> tuple[np.ndarray, np.ndarray]:
    """s = sigmoid(g), gs = g * s: dg = store_out((dy * u) * (s + gs * (1 - s))), du = store_out(dy * gs)."""
    dy, g, u = _f32(dy), _f32(g), _f32(u)
    s = sigmoid(g)
    gs = g * s
    return store_out((dy * u) * (s + gs * (ONE - s)), dtype), store_out(dy * gs, dtype)


# ---- attention (11.2) ------------------------------------------------------------------------------
@_quiet
def attention_scores(q, k, scale: float) -> np.ndarray:
    """s[b, h, t, j] = dot(q[b, h, t], k[b, h / (Hq/Hkv), j]) * scale, dot one fma_rn chain over d from +0."""
    q, k = _f32(q), _f32(k)
    hq, hkv = q.shape[1], k.shape[1]
    kh = k[:, np.arange(hq) // (hq // hkv)]  # [B, Hq, Tk, D]: query head h reads KV head h / (Hq/Hkv)
    acc = np.zeros((*q.shape[:3], k.shape[2]), dtype=F32)
    for d in range(q.shape[3]):
        acc = fma_rn(q[:, :, :, None, d], kh[:, :, None, :, d], acc)
    return acc * F32(scale)


def first_key(k_start: np.ndarray, j1: np.ndarray, window: int) -> np.ndarray:
    """A row's first key (11.2): k_start, or with a window of w > 0 keys max(k_start, j1 - w + 1)."""
    return np.maximum(k_start, j1 - window + 1) if window > 0 else np.broadcast_to(k_start, np.shape(j1)).copy()


@_quiet
def attention(
    q, k, v, q_pos, k_start, scale: float, dtype: torch.dtype, tile_base=None, window: int = 0, sinks=None,
    sink_last: bool = False,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """Causal GQA attention (11.2): (output bits [B, Hq, Tq, D], stats fp32 [B, Hq, Tq, 2] = (m, l)).

    Row (b, h, t) sees keys j0 = k_start[b] (with a window of w > 0 keys, max(k_start[b], j1 - w + 1)) .. j1 =
    q_pos[b, t]; from m = -FLT_MAX, l = 0, acc = 0 it walks tiles of 32 keys counted from j0:
    mt = max_nan(m, s_0, ...); alpha = exp_fold(m - mt); l *= alpha;
    acc *= alpha; per key in order p = exp_fold(s_u - mt), l += p, acc_d = fma_rn(p, v_u[d], acc_d); m = mt.
    Output store_out(acc * rcp_pos(l)), canonical NaN if m is NaN or +inf, +0 if j1 < j0; stats
    (no_neg_zero(m), l), canonical. With sinks [Hq] (a logit per query head) a row starts from m = sink, l = 1:
    the sink joins first, a key with a zero value. tile_base [B] counts the tiles from another key and sink_last
    joins the sink after the row's last tile (wrong variants).
    """
    v = _f32(v)
    b_, hq, tq, dh = q.shape
    hkv, tk = v.shape[1], v.shape[2]
    rows = b_ * hq * tq
    s = attention_scores(q, k, scale).reshape(rows, tk)
    vh = v[:, np.arange(hq) // (hq // hkv)].reshape(b_ * hq, tk, dh)
    q_pos, k_start = np.asarray(q_pos, dtype=np.int64), np.asarray(k_start, dtype=np.int64)

    def per_row(a: np.ndarray) -> np.ndarray:  # [B] or [B, Tq] -> one value per row (b, h, t)
        return np.broadcast_to(a[:, None, None] if a.ndim == 1 else a[:, None, :], (b_, hq, tq)).reshape(rows)

    j0, j1 = first_key(per_row(k_start), per_row(q_pos), window), per_row(q_pos)
    base = j0 if tile_base is None else per_row(np.asarray(tile_base, dtype=np.int64))
    bh = np.arange(rows) // tq

    m = np.full(rows, -FLT_MAX, dtype=F32)
    lsum = np.zeros(rows, dtype=F32)  # the doc's l
    acc = np.zeros((rows, dh), dtype=F32)
    sink = None if sinks is None else np.broadcast_to(_f32(sinks)[None, :, None], (b_, hq, tq)).reshape(rows)
    if sink is not None and not sink_last:
        m, lsum = sink.copy(), np.full(rows, ONE, dtype=F32)
    ntiles = int(max(0, ((j1 - base) // ATTN_TILE + 1).max(initial=0)))
    for tile in range(ntiles):
        keys = (base + tile * ATTN_TILE)[:, None] + np.arange(ATTN_TILE)[None, :]  # [rows, 32]
        valid = (keys >= j0[:, None]) & (keys <= j1[:, None])
        active = valid.any(axis=1)
        kidx = np.clip(keys, 0, tk - 1)
        su = np.take_along_axis(s, kidx, axis=1)
        vu = vh[bh[:, None], kidx]  # [rows, 32, D]
        mt = m
        for u in range(ATTN_TILE):
            mt = np.where(valid[:, u], max_nan(mt, su[:, u]), mt)
        alpha = exp_fold(m - mt)
        lsum = np.where(active, lsum * alpha, lsum)
        acc = np.where(active[:, None], acc * alpha[:, None], acc)
        for u in range(ATTN_TILE):
            p = exp_fold(su[:, u] - mt)
            ok = valid[:, u]
            lsum = np.where(ok, lsum + p, lsum)
            acc = np.where(ok[:, None], fma_rn(p[:, None], vu[:, u], acc), acc)
        m = np.where(active, mt, m)
    if sink is not None and sink_last:  # the wrong variant: the sink as one more tile
        mt = max_nan(m, sink)
        lsum = lsum * exp_fold(m - mt) + exp_fold(sink - mt)
        acc = acc * exp_fold(m - mt)[:, None]
        m = mt

    empty = j1 < j0
    bad = ~(m <= FLT_MAX)
    r = rcp_pos(np.where(empty | bad, ONE, lsum))
    o = np.where(bad[:, None], CANONICAL_NAN, acc * r[:, None])
    o = np.where(empty[:, None], ZERO, o)
    stats = np.stack([canonical(no_neg_zero(m)), canonical(lsum)], axis=-1)
    return store_out(o, dtype).reshape(b_, hq, tq, dh), stats.reshape(b_, hq, tq, 2)


@_quiet
def attention_backward(
    do,
    q,
    k,
    v,
    o,
    stats,
    q_pos,
    k_start,
    scale: float,
    dtype: torch.dtype,
    row_order: Sequence[int] | None = None,
    split_ds: bool = False,
    window: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The backward of attention (11.2) from its output o and statistics (m, l): (dq, dk, dv) bits.

    Per row: bad = m NaN or +inf; r = 0 if bad else rcp_pos(l); Dr = fma_rn chain over d of dO*O from +0.
    Per pair (i, j) with first_key(k_start[b], q_pos[b, i], window) <= j <= q_pos[b, i]: s = the forward's score,
    dp = fma_rn chain over d of
    dO_i*v_j from +0; p = exp_fold(s - m) * r, dS = p * (dp - Dr) (both canonical NaN if bad).
    dq_i = store_out(acc * scale), acc the chain over the keys j the row sees, ascending, of fma_rn(dS, k_j).
    dk_j = store_out(ak * scale), dv_j = store_out(av): chains from +0 over the query heads g of j's KV head
    in order, then the rows i that see j in order (the others add no term) of fma_rn(dS, q_i), fma_rn(p, dO_i).
    Wrong variants for the negative controls: row_order replaces the order of i in dk and dv; split_ds
    computes dS as p*dp - p*Dr.
    """
    do, q, k, v, o, stats = (_f32(a) for a in (do, q, k, v, o, stats))
    b_, hq, tq, dh = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    group = hq // hkv
    vh = v[:, np.arange(hq) // group]  # [B, Hq, Tk, D]
    kh = k[:, np.arange(hq) // group]
    q_pos, k_start = np.asarray(q_pos, dtype=np.int64), np.asarray(k_start, dtype=np.int64)
    keys = np.arange(tk)
    first = first_key(k_start[:, None], q_pos, window)  # [B, Tq]
    sees = (keys[None, None, :] >= first[:, :, None]) & (keys[None, None, :] <= q_pos[:, :, None])  # [B, Tq, Tk]

    m = stats[..., 0]
    bad = ~(m <= FLT_MAX)
    r = np.where(bad, ZERO, rcp_pos(stats[..., 1]))
    dr = np.zeros((b_, hq, tq), dtype=F32)
    dp = np.zeros((b_, hq, tq, tk), dtype=F32)
    for d in range(dh):
        dr = fma_rn(do[..., d], o[..., d], dr)
        dp = fma_rn(do[:, :, :, None, d], vh[:, :, None, :, d], dp)
    s = attention_scores(q, k, scale)
    p = exp_fold(s - m[..., None]) * r[..., None]
    ds = p * dp - p * dr[..., None] if split_ds else p * (dp - dr[..., None])
    p = np.where(bad[..., None], CANONICAL_NAN, p)
    ds = np.where(bad[..., None], CANONICAL_NAN, ds)

    acc = np.zeros(q.shape, dtype=F32)
    for j in range(tk):
        acc = np.where(sees[:, None, :, j, None], fma_rn(ds[..., j, None], kh[:, :, None, j], acc), acc)
    dq = store_out(acc * F32(scale), dtype)

    grouped = (b_, hkv, group, tq)  # query head h = kvh * group + g
    qg, dog = q.reshape(*grouped, dh), do.reshape(*grouped, dh)
    dsg, pg = ds.reshape(*grouped, tk), p.reshape(*grouped, tk)
    ak = np.zeros(k.shape, dtype=F32)
    av = np.zeros(v.shape, dtype=F32)
    for g in range(group):
        for i in range(tq) if row_order is None else row_order:
            ok = sees[:, None, i, :, None]  # [B, 1, Tk, 1]
            ak = np.where(ok, fma_rn(dsg[:, :, g, i, :, None], qg[:, :, g, i, None, :], ak), ak)
            av = np.where(ok, fma_rn(pg[:, :, g, i, :, None], dog[:, :, g, i, None, :], av), av)
    return dq, store_out(ak * F32(scale), dtype), store_out(av, dtype)


@_quiet
def attention_sink_grad(do, o, stats, sinks) -> np.ndarray:
    """The sinks' gradient (11.2), fp32 [Hq]: per row, with the backward's bad, r and Dr, the sink's pair term
    dS = p * (0 - Dr), p = exp_fold(sink - m) * r (canonical NaN if bad); per head, row_sum over its rows (b, then
    t)."""
    do, o, stats, sinks = _f32(do), _f32(o), _f32(stats), _f32(sinks)
    m = stats[..., 0]
    bad = ~(m <= FLT_MAX)
    r = np.where(bad, ZERO, rcp_pos(stats[..., 1]))
    dr = np.zeros(m.shape, dtype=F32)
    for d in range(do.shape[-1]):
        dr = fma_rn(do[..., d], o[..., d], dr)
    p = exp_fold(sinks[None, :, None] - m) * r
    terms = np.where(bad, CANONICAL_NAN, p * (ZERO - dr))
    return np.stack([row_sum(terms[:, h].reshape(-1)) for h in range(terms.shape[1])])
