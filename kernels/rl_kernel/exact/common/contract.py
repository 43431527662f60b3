"""An independent numpy transcription of rl_kernel's numerical contract (docs/numerics.md): the scalar
rules, the row layout, the fold and the tree, shared by every family's reference (reference/<family>.py).

Written from the contract (docs/numerics.md and the comments of kernels/rl_kernel/csrc/common/numerics.h
and reduce.h), not from the compiled code, so that tests/kernels/test_reference.py can prove that the CPU
build equals the contract bit for bit.

Rules of this file:

* Only binary32 arithmetic: every value is a numpy float32 array (0-d for a scalar) and every
  constant an ``np.float32``; each ``+``, ``-``, ``*`` is a separate numpy ufunc call, so each is
  rounded on its own (numpy never contracts to an FMA). ``_f32`` checks that nothing was promoted.
  The contract's one fused operation, ``fma_rn(a, b, c)``, is emulated exactly (``fma_rn`` below:
  float64 with round-to-odd, then one rounding to binary32).
* Bit manipulation on ``np.uint32`` / ``np.int32`` arrays, which wrap modulo 2**32.
* All floating-point exceptions are ignored (``np.errstate(all="ignore")``, see ``_quiet``).
* The row tree is evaluated one level at a time: the leaves (one per chunk) are an array, and each
  level joins its even and odd entries in one vector operation.

Where the contract leaves a detail unspecified (the NaN that ``exp_fold(NaN)`` returns, which
zero ``max(-0, +0)`` returns) this file does whatever numpy does; the contract says no output
depends on it, and the tests check exactly that.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch

F32 = np.float32
U32 = np.uint32


def _c(hex_literal: str) -> np.float32:
    """A binary32 constant from its C hex-float literal (exactly representable)."""
    v = F32(float.fromhex(hex_literal))
    assert float(v) == float.fromhex(hex_literal), hex_literal
    return v


# ---- the fixed shape of every row reduction --------------------------------
CHUNK = 8  # "It is cut into chunks of 8 consecutive elements"

# ---- constants (numerics.h) --------------------------------------------------
LOG2E = _c("0x1.715476p+0")  # 1/ln2 rounded to binary32
ROUND_MAGIC = _c("0x1.8p+23")  # 1.5*2^23: x + M - M = rint(x)
EXP2_YMIN = F32(-125.0)  # keeps p*2^k normal
EXP_FLUSH_BELOW = F32(-86.0)  # exp_flushed(d) = 0 below this
LN2_HI = _c("0x1.62e300p-1")  # 17 significant bits: e*HI exact
LN2_LO = _c("0x1.2fefa4p-17")
SQRT2 = _c("0x1.6a09e6p+0")
MIN_NORMAL = _c("0x1p-126")
FLT_MAX = _c("0x1.fffffep+127")
CANONICAL_NAN_BITS = 0x7FC00000
BF16_NAN_BITS = 0x7FC0
F16_NAN_BITS = 0x7E00

E1 = _c("0x1.62e42ap-1")
E2 = _c("0x1.ebf9bcp-3")
E3 = _c("0x1.c6b752p-5")
E4 = _c("0x1.3cea88p-7")
E5 = _c("0x1.5bba14p-10")
L_COEFFS = tuple(
    _c(h)
    for h in (
        "-0x1.fffff8p-2",  # L0
        "0x1.555550p-2",  # L1
        "-0x1.000426p-2",  # L2
        "0x1.99a3f6p-3",  # L3
        "-0x1.542766p-3",  # L4
        "0x1.22715ep-3",  # L5
        "-0x1.0f3756p-3",  # L6
        "0x1.0849bep-3",  # L7
        "-0x1.38339ap-4",  # L8
    )
)

ZERO = F32(0.0)
ONE = F32(1.0)
HALF = F32(0.5)
NEG_INF = F32(-np.inf)


def _quiet(fn: Callable) -> Callable:
    """Run fn with every floating-point (and integer-overflow) warning ignored."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with np.errstate(all="ignore"):
            return fn(*args, **kwargs)

    return wrapper


def _f32(x) -> np.ndarray:
    """x as a float32 array; refuses anything that is not already binary32 (no silent rounding)."""
    a = np.asarray(x)
    if a.dtype != np.float32:
        raise TypeError(f"rl_kernel.exact.reference: expected float32, got {a.dtype}")
    return a


# ---- bits ----------------------------------------------------------------------
def bits_of(x) -> np.ndarray:
    """The binary32 bit pattern of x, as uint32."""
    return _f32(x).view(U32)


def float_of(u) -> np.ndarray:
    """The binary32 value with bit pattern u."""
    return np.asarray(u, dtype=U32).view(F32)


CANONICAL_NAN = float_of(np.array(CANONICAL_NAN_BITS, dtype=U32))[()]


def canonical(x) -> np.ndarray:
    """ "Any NaN result is the canonical NaN" (0x7fc00000)."""
    x = _f32(x)
    return np.where(np.isnan(x), CANONICAL_NAN, x)


def flush(x) -> np.ndarray:
    """ "Results below 2^-126 in magnitude (subnormals, -0.0) become +0.0": |x| < 2^-126 gives +0.0."""
    x = _f32(x)
    return np.where(np.abs(x) < MIN_NORMAL, ZERO, x)


def max_nan(a, b) -> np.ndarray:
    """ "NaN-propagating maximum: a NaN operand wins." Which NaN, and which zero of max(-0, +0),
    are left to numpy (the contract leaves them unspecified)."""
    a, b = _f32(a), _f32(b)
    return np.where(np.isnan(a) | np.isnan(b), F32(np.nan), np.maximum(a, b))


# ---- input conversion (exact) --------------------------------------------------
def from_bf16_bits(h) -> np.ndarray:
    """ "bf16: bits << 16"."""
    return float_of(np.asarray(h, dtype=np.uint16).astype(U32) << U32(16))


def from_f16_bits(h) -> np.ndarray:
    """ "fp16: integer conversion of sign, exponent and mantissa": inf/NaN keep the mantissa
    (shifted by 13), normals rebias the exponent (15 -> 127), subnormals m*2^-24 come from an
    exact int -> binary32 conversion and a multiplication by 2^-24."""
    h = np.asarray(h, dtype=np.uint16).astype(U32)
    sign = (h & U32(0x8000)) << U32(16)
    expo = (h >> U32(10)) & U32(0x1F)
    mant = h & U32(0x3FF)
    special = sign | U32(0x7F800000) | (mant << U32(13))
    normal = sign | ((expo + U32(112)) << U32(23)) | (mant << U32(13))
    mag = mant.astype(np.int32).astype(F32) * _c("0x1p-24")
    sub = sign | bits_of(mag)
    return float_of(np.where(expo == U32(0x1F), special, np.where(expo != U32(0), normal, sub)))


def row_to_f32(row: torch.Tensor) -> np.ndarray:
    """A torch row (float32, bfloat16 or float16) converted exactly to a float32 numpy array."""
    row = row.detach().cpu().contiguous()
    if row.dtype == torch.float32:
        return row.numpy().astype(F32, copy=True)
    if row.dtype == torch.bfloat16:
        return from_bf16_bits(row.view(torch.int16).numpy().view(np.uint16))
    if row.dtype == torch.float16:
        return from_f16_bits(row.view(torch.int16).numpy().view(np.uint16))
    raise TypeError(f"rl_kernel.exact.reference: unsupported dtype {row.dtype}")


# ---- output conversion (round to nearest even, canonical NaN) ---------------------
@_quiet
def to_bf16_bits(x) -> np.ndarray:
    """bf16 by round to nearest even on the bits, "NaN as 0x7fc0 (bf16)":
    (u + 0x7fff + ((u >> 16) & 1)) >> 16."""
    u = bits_of(x)
    r = (u + U32(0x7FFF) + ((u >> U32(16)) & U32(1))) >> U32(16)
    return np.where((u & U32(0x7FFFFFFF)) > U32(0x7F800000), U32(BF16_NAN_BITS), r).astype(np.uint16)


@_quiet
def to_f16_bits(x) -> np.ndarray:
    """fp16 by round to nearest even, "NaN as 0x7e00 (fp16), a value that rounds to zero as +0.0".

    |x| >= 65520 rounds to inf; normal fp16 results: rebias the exponent (subtract 112 << 23) and
    round the bits to 10 mantissa bits; subnormal fp16 results: rint(|x| * 2^24) by the magic
    constant, and a zero result has no sign.
    """
    u = bits_of(x)
    sign = (u >> U32(16)) & U32(0x8000)
    a = u & U32(0x7FFFFFFF)
    r = a - U32(0x38000000)
    normal = sign | ((r + U32(0x0FFF) + ((r >> U32(13)) & U32(1))) >> U32(13))
    v = float_of(a) * _c("0x1p24")
    q = ((v + ROUND_MAGIC) - ROUND_MAGIC).astype(np.int32).astype(U32)
    sub = np.where(q == U32(0), U32(0), sign | q)
    out = np.where(
        a > U32(0x7F800000),
        U32(F16_NAN_BITS),
        np.where(a >= U32(0x477FF000), sign | U32(0x7C00), np.where(a >= U32(0x38800000), normal, sub)),
    )
    return out.astype(np.uint16)


def store_bits(x, dtype: torch.dtype) -> np.ndarray:
    """A float32 result stored in dtype, as unsigned integer bits (uint32 for fp32, uint16 else)."""
    if dtype == torch.float32:
        return bits_of(x).copy()
    if dtype == torch.bfloat16:
        return to_bf16_bits(x)
    if dtype == torch.float16:
        return to_f16_bits(x)
    raise TypeError(f"rl_kernel.exact.reference: unsupported dtype {dtype}")


# ---- the fused multiply-add ----------------------------------------------------------
@_quiet
def fma_rn(a, b, c) -> np.ndarray:
    """ "fma_rn(a, b, c) = a*b + c rounded once to binary32 (IEEE-754 fusedMultiplyAdd)".

    a*b is exact in float64 (24 + 24 significant bits). The float64 sum s = a*b + c is rounded, but
    its error e is exact (TwoSum); moving an even s one ulp towards e gives a*b + c rounded to odd in
    53 bits, and rounding that to binary32 (24 <= 53 - 2 bits) is the correctly rounded result
    (Boldo and Melquiond, "Emulation of FMA and correctly rounded sums", 2008)."""
    a, b, c = (_f32(v).astype(np.float64) for v in (a, b, c))
    p = a * b
    s = p + c
    bp = s - p
    e = (p - (s - bp)) + (c - bp)
    even = (s.view(np.uint64) & np.uint64(1)) == 0
    towards = np.where(e > 0, np.inf, -np.inf)
    odd = np.where((e != 0) & even & np.isfinite(s), np.nextafter(s, towards), s)
    return odd.astype(np.float32)


# ---- exp -----------------------------------------------------------------------------
@_quiet
def exp2_poly(f) -> np.ndarray:
    """ "p = 1 + f*(E1 + f*(E2 + f*(E3 + f*(E4 + f*E5))))  (2^f, Horner), each step one fma_rn"."""
    f = _f32(f)
    p = np.broadcast_to(E5, f.shape).astype(F32)
    for coeff in (E4, E3, E2, E1, ONE):
        p = fma_rn(f, p, np.broadcast_to(coeff, f.shape).astype(F32))
    return p


@_quiet
def exp_fold(d) -> np.ndarray:
    """exp(d) for d <= 0 (docs/numerics.md section 3):

    y = d * log2(e); y = (y < -125) ? -125 : y; t = y + M, M = 1.5 * 2^23; k = t - M; f = y - k;
    p = poly(f) ~ 2^f; "result = p * 2^k, by adding (bits(t) << 23) mod 2^32 to the bits of p".
    """
    d = _f32(d)
    y = d * LOG2E
    y = np.where(y < EXP2_YMIN, EXP2_YMIN, y)
    t = y + ROUND_MAGIC
    k = t - ROUND_MAGIC
    f = y - k
    p = exp2_poly(f)
    return float_of(bits_of(p) + (bits_of(t) << U32(23)))


@_quiet
def exp_flushed(d) -> np.ndarray:
    """ "exp_flushed(d) ... is 0 for d < -86, NaN for NaN, else exp_fold(d)" (the NaN canonical)."""
    d = _f32(d)
    return np.where(np.isnan(d), CANONICAL_NAN, np.where(d < EXP_FLUSH_BELOW, ZERO, exp_fold(d)))


# ---- log -----------------------------------------------------------------------------
@_quiet
def log1p_poly(f) -> np.ndarray:
    """ "log1p(f) = f + (f*f) * Q(f), Q of degree 8 by Horner with coefficients L0..L8"."""
    f = _f32(f)
    q = L_COEFFS[8]
    for c in reversed(L_COEFFS[:8]):
        q = c + f * q
    return f + (f * f) * q


@_quiet
def log_pos(s) -> np.ndarray:
    """log(s) for finite s >= 1 (section 4): "write s = 2^e * m with m in [1, 2); if m > sqrt(2) then
    m = m/2 (a multiplication by 0.5) and e = e + 1. f = m - 1 is exact ...
    log(s) = e*LN2_HI + (e*LN2_LO + log1p(f))"."""
    b = bits_of(s)
    e = ((b >> U32(23)) & U32(0xFF)).astype(np.int32) - np.int32(127)
    m = float_of((b & U32(0x007FFFFF)) | U32(0x3F800000))
    big = m > SQRT2
    m = np.where(big, m * HALF, m)
    e = np.where(big, e + np.int32(1), e)
    f = m - ONE
    l1p = log1p_poly(f)
    ef = e.astype(F32)  # exact: |e| < 2^24
    return ef * LN2_HI + (ef * LN2_LO + l1p)


# ---- the row tree (docs/numerics.md section 2, contract v2) --------------------------------------
def chunk_layout(values: np.ndarray, pad) -> np.ndarray:
    """ "It is cut into chunks of 8 consecutive elements: chunk c holds elements 8c .. 8c+7. If V is not
    a multiple of 8, the last chunk is partial and padded with -inf (statistics) or 0 (plain sums)."
    Returns x of shape [C, 8]."""
    values = _f32(values)
    v = values.shape[0]
    nchunks = -(-v // CHUNK)
    x = np.full(nchunks * CHUNK, pad, dtype=F32)
    x[:v] = values
    return x.reshape(nchunks, CHUNK)


@_quiet
def chunk_sum(v) -> np.ndarray:
    """ "Inside a chunk, values are summed pairwise: ((v0+v1)+(v2+v3)) + ((v4+v5)+(v6+v7))"
    (over the last axis)."""
    v = _f32(v)
    return ((v[..., 0] + v[..., 1]) + (v[..., 2] + v[..., 3])) + ((v[..., 4] + v[..., 5]) + (v[..., 6] + v[..., 7]))


@_quiet
def leaf_stats(x_row, chunk_sum_fn=chunk_sum) -> tuple[np.ndarray, np.ndarray]:
    """The leaves of a row: "cm = max(-FLT_MAX, x0, ..., x7) (NaN-propagating, left to right);
    s = pairwise_sum(exp_fold(x_j - cm))", one per chunk, padding -inf."""
    x = chunk_layout(x_row, NEG_INF)
    cm = max_nan(np.full(x.shape[0], -FLT_MAX, dtype=F32), x[:, 0])
    for j in range(1, CHUNK):
        cm = max_nan(cm, x[:, j])
    return cm, chunk_sum_fn(exp_fold(x - cm[:, None]))


@_quiet
def combine(ma, sa, mb, sb) -> tuple[np.ndarray, np.ndarray]:
    """ "join((ma, sa), (mb, sb)): m = max(ma, mb); top = (ma == m); e = exp_fold((top ? mb : ma) - m);
    s = top ? sa + sb*e : sa*e + sb" (one exp: the side holding the maximum is kept as is)."""
    m = max_nan(ma, mb)
    top = ma == m
    e = exp_fold(np.where(top, mb, ma) - m)
    return m, np.where(top, sa + sb * e, sa * e + sb)


EMPTY_M = -FLT_MAX  # "the empty node: (-FLT_MAX, 0) for statistics, 0 for sums"


def _padded(a: np.ndarray, fill) -> np.ndarray:
    """a padded along its last axis to the next power of two with fill (the empty node)."""
    n = 1 << max(0, a.shape[-1] - 1).bit_length()
    out = np.full((*a.shape[:-1], n), fill, dtype=F32)
    out[..., : a.shape[-1]] = a
    return out


@_quiet
def tree_stats(m, s) -> tuple[np.ndarray, np.ndarray]:
    """ "One perfect binary tree over the chunk index: node (L, i) = join(node (L-1, 2i), node (L-1, 2i+1));
    chunks past the row's end are the empty node." Leaves in, root out, one level at a time, over the last axis
    (one row's leaves, or rows of them at once: the same joins, elementwise)."""
    m, s = _padded(_f32(m), EMPTY_M), _padded(_f32(s), ZERO)
    while m.shape[-1] > 1:
        m, s = combine(m[..., 0::2], s[..., 0::2], m[..., 1::2], s[..., 1::2])
    return m[..., 0][()], s[..., 0][()]


@_quiet
def tree_sum(p) -> np.ndarray:
    """The same tree for plain sums: join(a, b) = a + b, the empty node 0."""
    p = _padded(_f32(p), ZERO)
    while p.shape[0] > 1:
        p = p[0::2] + p[1::2]
    return p[0]


@_quiet
def row_sum(terms, chunk_sum_fn=chunk_sum, tree=tree_sum) -> np.ndarray:
    """A plain sum over a row in section 2's order: chunk sums (padding 0) as the leaves of the tree."""
    return tree(chunk_sum_fn(chunk_layout(terms, ZERO)))
