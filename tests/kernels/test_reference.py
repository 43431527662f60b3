"""The CPU build of rl_kernel equals the contract's numpy transcription (rl_kernel/reference/) bit for bit.

Every equality here compares integer views (never allclose). Accuracy claims of the contract's exp and
log against float64 are checked with explicit, measured bounds. A negative control shows that a
slightly wrong transcription (another summation order) does not match, so the comparison can fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from bit_checks import assert_same, cpu_bits, dname

import rl_kernel
import rl_kernel.exact.reference as S
from rl_kernel import inputs

VOCABS = (1, 7, 8, 9, 255, 256, 257, 2048, 2049, 5000, 151936)
DTYPES = inputs.DTYPES
IGNORE = -100
ops = torch.ops.rl_kernel  # the operators themselves, for the row statistics they return


def f32_bits(*values) -> np.ndarray:
    """float32 spec values (scalars or arrays) as one uint32 array."""
    return S.bits_of(np.concatenate([np.atleast_1d(S._f32(v)) for v in values]))


# ---------------------------------------------------------------- inputs


def make_case(vocab: int, dtype: torch.dtype):
    """Logits (random rows, then edge_rows for vocab >= 8), tokens and fixed upstream gradients."""
    n = 1 if vocab > 5000 else 3
    x = inputs.logits(n, vocab, dtype, seed=1000 + vocab)
    t = inputs.tokens(n, vocab, seed=1000 + vocab)
    if n > 1:
        t[1] = IGNORE
    if vocab >= 8:
        # A ramp 0 .. -100 puts log-probs around exp_flushed's threshold (-86) and the flush of p * x.
        ramp = torch.linspace(0.0, -100.0, vocab).to(dtype)[None]
        x = torch.cat([x, inputs.edge_rows(vocab, dtype), ramp])
        # Edge rows: 1 (one NaN) is ignored, 2 (all -inf) is not; 8 picks the single finite value.
        te = torch.tensor([1, IGNORE, 3, 0, 5, 6, 7, 0, vocab - 1, 4, vocab - 2])
        t = torch.cat([t, te])
    rows = x.shape[0]
    g = torch.Generator().manual_seed(vocab)
    w_lsm = torch.randn(rows, vocab, generator=g) * 0.75
    if n > 1:  # zeros of both signs, a subnormal, huge values; then a row whose sum overflows
        specials = torch.tensor([0.0, -0.0, 1e-40, -3e-39, 3e38, -1e30, 2.0**-126, 7.0])
        idx = torch.arange(specials.numel()) * max(1, vocab // specials.numel()) % vocab
        w_lsm[1, idx] = specials
        w_lsm[2, (vocab - 1) // 2] = float("inf")
    w_row = torch.randn(rows, generator=g)
    w_row[1 % rows] = -0.0
    if rows > 2:
        w_row[2] = 3e38
    if rows > 4:
        w_row[4] = 0.0
    return x, t, w_lsm, w_row


def cpu_results(x: torch.Tensor, t: torch.Tensor, w_lsm: torch.Tensor, w_row: torch.Tensor) -> dict:
    """Everything the CPU build computes for these inputs, as integer bits."""
    out = {"row_stats": cpu_bits(rl_kernel.row_stats(x))}
    tok, tok_stats = ops.token_logprobs(x, t, IGNORE)
    ent, ent_stats = ops.entropy(x)
    out["token_stats"], out["entropy_stats"] = cpu_bits(tok_stats), cpu_bits(ent_stats)

    leaf = x.clone().requires_grad_()
    y = rl_kernel.log_softmax(leaf)
    (g,) = torch.autograd.grad(y, leaf, grad_outputs=w_lsm)
    out["log_softmax"], out["log_softmax_grad"] = cpu_bits(y), cpu_bits(g)

    leaf = x.clone().requires_grad_()
    y = rl_kernel.token_logprobs(leaf, t, IGNORE)
    (g,) = torch.autograd.grad(y, leaf, grad_outputs=w_row)
    assert np.array_equal(cpu_bits(y), cpu_bits(tok))
    out["token_logprobs"], out["token_logprobs_grad"] = cpu_bits(y), cpu_bits(g)

    leaf = x.clone().requires_grad_()
    y = rl_kernel.entropy(leaf)
    (g,) = torch.autograd.grad(y, leaf, grad_outputs=w_row)
    assert np.array_equal(cpu_bits(y), cpu_bits(ent))
    out["entropy"], out["entropy_grad"] = cpu_bits(y), cpu_bits(g)
    return out


def spec_row(xr: np.ndarray, tok: int, g_lsm: np.ndarray, g_row: np.float32, dtype: torch.dtype) -> dict:
    """The contract's results for one row (integer bits), computed by rl_kernel.exact.reference."""
    st = S.row_stats(xr)
    lsm = S.logprob(xr, st)
    h = S.entropy(xr, st)
    return {
        "row_stats": f32_bits(*st),
        "log_softmax": f32_bits(lsm),
        "token_logprobs": f32_bits(S.token_logprob(xr, tok, IGNORE, st)),
        "entropy": f32_bits(h),
        "log_softmax_grad": S.log_softmax_backward(g_lsm, lsm, dtype),
        "token_logprobs_grad": S.token_logprob_backward(g_row, xr, tok, st, IGNORE, dtype),
        "entropy_grad": S.entropy_backward(g_row, xr, st, h, dtype),
    }


def check_against_spec(x, t, w_lsm, w_row, label: str) -> None:
    cpu = cpu_results(x, t, w_lsm, w_row)
    dtype = x.dtype
    for r in range(x.shape[0]):
        xr = S.row_to_f32(x[r])
        want = spec_row(xr, int(t[r]), w_lsm[r].numpy(), w_row[r].numpy(), dtype)
        want["token_stats"] = want["entropy_stats"] = want["row_stats"]
        for key, bits in want.items():
            got = cpu[key][r]
            assert_same(np.atleast_1d(got), bits, f"{label} row {r} {key}")


# ---------------------------------------------------------------- the CPU build equals the contract


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("vocab", VOCABS)
def test_cpu_equals_spec(vocab: int, dtype: torch.dtype) -> None:
    x, t, w_lsm, w_row = make_case(vocab, dtype)
    check_against_spec(x, t, w_lsm, w_row, f"V={vocab} {dname(dtype)}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dname)
@pytest.mark.parametrize("vocab", [7, 257])
def test_out_of_range_tokens_equal_spec(vocab: int, dtype: torch.dtype) -> None:
    """validate=False: an id outside [0, V) gives a NaN log-prob and a NaN gradient row."""
    x = inputs.logits(4, vocab, dtype, seed=5)
    t = torch.tensor([vocab, -1, IGNORE, 0])
    w = torch.tensor([0.5, -2.0, 1.0, 0.0])
    leaf = x.clone().requires_grad_()
    y = rl_kernel.token_logprobs(leaf, t, IGNORE, validate=False)
    (g,) = torch.autograd.grad(y, leaf, grad_outputs=w)
    for r in range(4):
        xr = S.row_to_f32(x[r])
        st = S.row_stats(xr)
        assert_same(cpu_bits(y[r : r + 1]), f32_bits(S.token_logprob(xr, int(t[r]), IGNORE, st)), f"row {r}")
        want = S.token_logprob_backward(w[r].numpy(), xr, int(t[r]), st, IGNORE, dtype)
        assert_same(cpu_bits(g[r]), want, f"row {r} gradient")


# ---------------------------------------------------------------- unspecified details do not show

_NEG_ZERO = np.float32(-0.0)


def _max_prefer(zero: np.float32):
    """A NaN-propagating max that returns the given zero for max(-0, +0) and max(+0, -0)."""

    def max_nan(a, b):
        r = np.where(np.isnan(a) | np.isnan(b), np.float32(np.nan), np.maximum(a, b))
        return np.where((a == 0) & (b == 0), zero, r).astype(np.float32)

    return max_nan


def _exp_fold_nan_as(value: np.float32):
    """exp_fold with exp_fold(NaN) replaced by value (the contract leaves it unspecified)."""
    real = S.exp_fold

    def exp_fold(d):
        return np.where(np.isnan(d), value, real(d)).astype(np.float32)

    return exp_fold


@pytest.mark.parametrize(
    ("name", "fn"),
    [
        ("max_nan", _max_prefer(np.float32(0.0))),
        ("max_nan", _max_prefer(_NEG_ZERO)),
        ("exp_fold", _exp_fold_nan_as(np.float32(0.0))),
        ("exp_fold", _exp_fold_nan_as(np.float32(1.0))),
        ("exp_fold", _exp_fold_nan_as(S.float_of(np.uint32(0xFFBFFFFF))[()])),
    ],
    ids=["max+0", "max-0", "expnan0", "expnan1", "expnan-payload"],
)
def test_unspecified_choices_do_not_change_outputs(monkeypatch: pytest.MonkeyPatch, name: str, fn) -> None:
    """Whichever zero max(-0, +0) returns and whatever exp_fold(NaN) is, every output is the same."""
    monkeypatch.setattr(S, name, fn)
    for dtype in DTYPES:
        x, t, w_lsm, w_row = make_case(257, dtype)
        check_against_spec(x, t, w_lsm, w_row, f"{name} variant {dname(dtype)}")


# ---------------------------------------------------------------- negative control


def _chunk_sum_sequential(v):
    """Wrong: left to right instead of pairwise."""
    s = v[..., 0]
    for j in range(1, S.CHUNK):
        s = s + v[..., j]
    return s


def _tree_sequential_stats(m, s):
    """Wrong: the leaves folded left to right instead of the tree."""
    am, as_ = m[0:1], s[0:1]
    for i in range(1, m.shape[0]):
        am, as_ = S.combine(am, as_, m[i : i + 1], s[i : i + 1])
    return am[0], as_[0]


def _tree_sequential_sum(p):
    acc = p[0]
    for v in p[1:]:
        acc = acc + v
    return acc


def test_negative_control_wrong_order_does_not_match() -> None:
    """The comparison can fail: transcriptions with another summation order differ from the CPU build."""
    x = inputs.logits(4, 5000, torch.float32, seed=77)
    cpu_stats = cpu_bits(rl_kernel.row_stats(x))
    cpu_lsm = cpu_bits(rl_kernel.log_softmax(x))
    cpu_ent = cpu_bits(rl_kernel.entropy(x))
    rows = [S.row_to_f32(x[r]) for r in range(4)]

    # The right transcription matches on these rows ...
    for r, xr in enumerate(rows):
        st = S.row_stats(xr)
        assert_same(cpu_stats[r], f32_bits(*st), f"row {r} stats")
        assert_same(cpu_lsm[r], f32_bits(S.logprob(xr, st)), f"row {r} log_softmax")
        assert_same(cpu_ent[r : r + 1], f32_bits(S.entropy(xr, st)), f"row {r} entropy")

    # ... and each wrong one does not. (A one-ulp change of s need not change log_s, and on some rows
    # another order happens to round to the same s, so "differs" is required of some rows, not all.)
    variants = {
        "sequential chunk sum": {"chunk_sum_fn": _chunk_sum_sequential},
        "sequential leaves": {"tree": _tree_sequential_stats},
    }
    for name, kw in variants.items():
        stats_differ = lsm_differ = 0
        for r, xr in enumerate(rows):
            st = S.row_stats(xr, **kw)
            stats_differ += not np.array_equal(cpu_stats[r], f32_bits(*st))
            lsm_differ += not np.array_equal(cpu_lsm[r], f32_bits(S.logprob(xr, st)))
        assert stats_differ >= 2 and lsm_differ >= 1, (name, stats_differ, lsm_differ)

    # Plain row sums (the G of the log_softmax backward, the entropy) in a wrong order differ too.
    # (Entropy is a sum of positive terms and rarely moves: only the sequential order changes it here.)
    leaf = x.clone().requires_grad_()
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(78))
    (g,) = torch.autograd.grad(rl_kernel.log_softmax(leaf), leaf, grad_outputs=w)
    cpu_grad = cpu_bits(g)
    sums = {
        "sequential chunk sum": {"chunk_sum_fn": _chunk_sum_sequential},
        "sequential tree": {"tree": _tree_sequential_sum},
    }
    assert_same(cpu_grad[0], S.log_softmax_backward(w[0].numpy(), S.log_softmax(rows[0]), torch.float32), "grad")
    for name, kw in sums.items():
        wrong = [
            S.log_softmax_backward(w[r].numpy(), S.log_softmax(xr), torch.float32, **kw) for r, xr in enumerate(rows)
        ]
        assert not np.array_equal(cpu_grad, np.stack(wrong)), f"log_softmax gradient with {name} matches"
    wrong = f32_bits(*[S.entropy(xr, **sums["sequential tree"]) for xr in rows])
    assert not np.array_equal(cpu_ent, wrong), "entropy with the sequential order matches"


# ---------------------------------------------------------------- exp and log against float64

_RNG_SEED = 20240601


def _exp_args() -> np.ndarray:
    """d in [-86, 0]: an even grid, random bit patterns (dense near 0) and the ends."""
    rng = np.random.default_rng(_RNG_SEED)
    grid = np.linspace(-86.0, 0.0, 1 << 20, dtype=np.float32)
    hi = int(np.float32(86.0).view(np.uint32))
    rand = (rng.integers(0, hi + 1, 1 << 20).astype(np.uint32) | np.uint32(0x80000000)).view(np.float32)
    return np.concatenate([grid, rand, np.float32([-86.0, -0.0, 0.0, -1e-30, -(2.0**-149)])])


# Measured (x86-64, numpy 2.x), max |exp_fold(d) - exp(d)| / exp(d):
#   d in [-1, 0]: 1.97e-7;  [-10, -1]: 5.9e-7;  [-40, -10]: 2.0e-6;  [-86, -40]: 3.94e-6 (63 ulp, d = -85.66).
# The growth with |d| is the rounding of y = d * log2(e) (half an ulp of y, 2^-18 for |y| in [64, 128)) and
# the error of log2(e) itself (relative 1.3e-8): an error e_y in y is a relative error ln(2) * e_y in 2^y.
# So 4e-7 holds only for d in [-1, 0] (and for the 2^f polynomial alone, 1.9e-7); over [-86, 0] the
# measured error stays below EXP_REL_POLY + ln(2) * (ulp(y) / 2 + |y| * 1.34e-8) (at most 0.99 of it).
EXP_REL_NEAR_ZERO = 4e-7  # d in [-1, 0]
EXP_REL_POLY = 2.5e-7
EXP_REL_MAX = 4.5e-6  # d in [-86, 0]
EXP2_POLY_ULP = 3.2  # measured 2.25 ulp (relative 1.9e-7) on f in [-1/2, 1/2]
# log_pos on [1, 2^24]: measured max relative error 8.3e-8 (0.9 ulp), max absolute 9.9e-7 (at s ~ 2^24).
LOG_REL = 2e-7


def test_exp_fold_accuracy() -> None:
    d = _exp_args()
    got = S.exp_fold(d)
    assert got.dtype == np.float32
    ref = np.exp(d.astype(np.float64))
    rel = np.abs(got.astype(np.float64) - ref) / ref
    near = d >= -1.0
    assert rel[near].max() <= EXP_REL_NEAR_ZERO, rel[near].max()
    y = d * S.LOG2E
    log2e_rel = abs(float(S.LOG2E) * np.log(2.0) - 1.0)
    limit = EXP_REL_POLY + np.log(2.0) * (np.spacing(np.abs(y)).astype(np.float64) / 2 + np.abs(y) * log2e_rel)
    worst = int(np.argmax(rel - limit))
    assert rel[worst] <= limit[worst], (float(d[worst]), float(rel[worst]))
    assert rel.max() <= EXP_REL_MAX, rel.max()
    # The result is always a normal number.
    assert (np.abs(got) >= S.MIN_NORMAL).all() and np.isfinite(got).all()


def test_exp2_polynomial_accuracy() -> None:
    f = np.linspace(-0.5, 0.5, 1 << 20, dtype=np.float32)
    p = S.exp2_poly(f).astype(np.float64)
    ref = np.exp2(f.astype(np.float64))
    ulp = np.spacing(ref.astype(np.float32)).astype(np.float64)
    assert (np.abs(p - ref) / ulp).max() <= EXP2_POLY_ULP
    assert (np.abs(p - ref) / ref).max() <= 2e-7


def _fma_exact(a: np.float32, b: np.float32, c: np.float32) -> np.float32:
    """a*b + c rounded once to binary32, from exact rationals: the nearest of the three binary32 values
    around the float64 guess, ties to the even significand."""
    from fractions import Fraction

    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    guess = np.float32(float(exact))
    cands = [np.nextafter(guess, np.float32(-np.inf)), guess, np.nextafter(guess, np.float32(np.inf))]
    cands = [v for v in cands if np.isfinite(v)]
    return min(cands, key=lambda v: (abs(Fraction(float(v)) - exact), int(v.view(np.uint32)) & 1))


def _fma_cases(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random operands, and products placed so that c cancels most of a*b or sits near its rounding
    boundary (where a float64 sum rounded twice would be wrong)."""
    a = rng.uniform(-2, 2, n).astype(np.float32)
    b = rng.uniform(-2, 2, n).astype(np.float32)
    p32 = (a * b).astype(np.float32)
    c = np.concatenate(
        [
            rng.uniform(-4, 4, n // 4),
            -p32[: n // 4],  # exact cancellation of the rounded product: the result is its error
            (p32 * np.float32(2.0**-25))[: n // 4],  # near half an ulp of a*b
            np.ldexp(rng.uniform(-1, 1, n - 3 * (n // 4)), rng.integers(-60, 10, n - 3 * (n // 4))),
        ]
    ).astype(np.float32)
    return a, b, c


def test_fma_rn_is_correctly_rounded() -> None:
    """The transcription's fma_rn (float64 round-to-odd) against exact rational arithmetic, on operands
    chosen to hit cancellation and halfway cases; the plain float64 a*b + c, rounded twice, must be
    wrong somewhere on the same operands (the negative control of this test)."""
    a, b, c = _fma_cases(np.random.default_rng(_RNG_SEED), 4000)
    # (1 + k 2^-12)^2 = 1 + k 2^-11 + k^2 2^-24 is a binary32 halfway case for odd k; a c of +-2^-80 decides
    # the rounding, which float64 drops before rounding to binary32 (to even): wrong for one sign.
    k = np.arange(1, 64, 2, dtype=np.float64)
    sq = np.float32(1 + k * 2.0**-12)
    tiny = np.float32([2.0**-80, -(2.0**-80)])
    ties_a, ties_b = np.repeat(sq, 2), np.repeat(sq, 2)
    ties_c = np.tile(tiny, sq.size)
    a, b, c = (np.concatenate([x, y]) for x, y in ((a, ties_a), (b, ties_b), (c, ties_c)))
    got = S.fma_rn(a, b, c)
    want = np.array([_fma_exact(x, y, z) for x, y, z in zip(a, b, c, strict=True)], dtype=np.float32)
    assert_same(S.bits_of(got), S.bits_of(want), "fma_rn")
    naive = (a.astype(np.float64) * b + c).astype(np.float32)
    assert not np.array_equal(S.bits_of(naive), S.bits_of(want)), "the double-rounding control never differed"


def test_cpu_fma_equals_the_transcription() -> None:
    """The CPU build's fma_rn (the C library's fmaf) through the exp it feeds: exp_fold of the build,
    seen through the leaf of one-element rows, equals the transcription's on the same arguments."""
    d = np.float32(-np.linspace(0.0, 80.0, 4096, dtype=np.float32))
    x = torch.from_numpy(np.stack([np.zeros_like(d), d], axis=1))  # rows (0, d): s = 1 + exp_fold(d)
    stats = ops.row_stats(x)
    want = (S.ONE + S.exp_fold(d)).astype(np.float32)
    assert_same(stats[:, 1].numpy().view(np.uint32), S.bits_of(want), "row sum 1 + exp_fold(d)")


def test_exp_fold_and_exp_flushed_edges() -> None:
    """Below about -86.64 (and at -inf) exp_fold is one constant ~2.4e-38; exp_flushed is 0 below -86,
    the canonical NaN for NaN, and exp_fold elsewhere."""
    floor = S.exp_fold(np.float32(-87.0))
    assert 2.3e-38 < float(floor) < 2.5e-38
    low = np.float32([-86.7, -100.0, -1e30, -3.4e38, -np.inf])
    assert_same(S.bits_of(S.exp_fold(low)), np.full(5, S.bits_of(floor), np.uint32), "exp_fold floor")
    assert float(S.exp_fold(np.float32(0.0))) == 1.0 and float(S.exp_fold(np.float32(-0.0))) == 1.0
    d = np.float32([np.nan, -86.00001, -86.0, -1.0, 0.0])
    got = S.bits_of(S.exp_flushed(d))
    want = np.concatenate([[S.CANONICAL_NAN_BITS, 0], S.bits_of(S.exp_fold(d[2:]))]).astype(np.uint32)
    assert_same(got, want, "exp_flushed")


def test_log_pos_accuracy() -> None:
    rng = np.random.default_rng(_RNG_SEED)
    lo, hi = int(np.float32(1.0).view(np.uint32)), int(np.float32(2.0**24).view(np.uint32))
    s = np.concatenate(
        [
            np.linspace(1.0, 2.0**24, 1 << 20, dtype=np.float32),
            rng.integers(lo, hi + 1, 1 << 20).astype(np.uint32).view(np.float32),
            np.float32(1.0) + np.arange(1, 1 << 14, dtype=np.float32) * np.float32(2.0**-23),  # just above 1
            np.float32(2.0) ** np.arange(25, dtype=np.float32),
            S.SQRT2 * np.float32(2.0) ** np.arange(24, dtype=np.float32),
        ]
    )
    got = S.log_pos(s)
    assert got.dtype == np.float32
    assert float(S.log_pos(np.float32(1.0))) == 0.0
    ref = np.log(s.astype(np.float64))
    pos = ref > 0
    rel = np.abs(got.astype(np.float64) - ref)[pos] / ref[pos]
    assert rel.max() <= LOG_REL, rel.max()


def test_log1p_polynomial_accuracy() -> None:
    """The contract's claim for log1p(f) = f + f^2 Q(f) on [sqrt(1/2)-1, sqrt(2)-1]: 1.4 ulp."""
    f = np.linspace(np.sqrt(0.5) - 1.0, np.sqrt(2.0) - 1.0, 1 << 20).astype(np.float32)
    f = f[f != 0]
    got = S.log1p_poly(f).astype(np.float64)
    ref = np.log1p(f.astype(np.float64))
    ulp = np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64)
    assert (np.abs(got - ref) / ulp).max() <= 1.4


# ---------------------------------------------------------------- conversions


def _conversion_values() -> np.ndarray:
    """Random bit patterns, every binary16 and bfloat16 value with its round-to-nearest-even tie points
    and their binary32 neighbours, and hand-picked edges."""
    rng = np.random.default_rng(_RNG_SEED)
    rand = rng.integers(0, 2**32, 1 << 19, dtype=np.uint64).astype(np.uint32).view(np.float32)
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    f16 = h.view(np.float16).astype(np.float64)
    f16 = np.sort(f16[np.isfinite(f16)])
    ties16 = (f16[:-1] + f16[1:]) / 2  # exact in binary32 (12 significant bits)
    bf = S.from_bf16_bits(h)
    bf = np.sort(bf[np.isfinite(bf)].astype(np.float64))
    ties_bf = (bf[:-1] + bf[1:]) / 2  # exact in binary32 (9 significant bits)
    base = np.concatenate([f16, ties16, bf, ties_bf]).astype(np.float32)
    assert np.array_equal(base.astype(np.float64), np.concatenate([f16, ties16, bf, ties_bf]))
    near = np.concatenate([np.nextafter(base, np.float32(np.inf)), np.nextafter(base, np.float32(-np.inf))])
    edges = np.float32(
        [0.0, -0.0, 2.0**-24, -(2.0**-24), 2.0**-25, -(2.0**-25), 3 * 2.0**-26, -(3 * 2.0**-26), 2.0**-14,
         65504.0, 65519.996, 65520.0, -65520.0, 65536.0, 3.4e38, -3.4e38, np.inf, -np.inf, 1e-45, -1e-45,
         2.0**-126, -(2.0**-126), 1.0 + 2.0**-11, 1.0 + 3 * 2.0**-11, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8]
    )  # fmt: skip
    nans = S.float_of(np.uint32([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FFFFFFF, 0x7FA00000, 0xFFFFFFFF]))
    return np.concatenate([rand, base, near, edges, nans])


def test_to_f16_bits_matches_torch_except_nan_and_zero_sign() -> None:
    x = _conversion_values()
    ours = S.to_f16_bits(x)
    theirs = cpu_bits(torch.from_numpy(x.copy()).to(torch.float16))
    nan = np.isnan(x)
    assert (ours[nan] == S.F16_NAN_BITS).all()
    assert np.isnan(theirs[nan].view(np.float16)).all()
    # A value that rounds to zero is +0.0 here, signed in torch: ours 0x0000 where torch has 0x8000.
    neg_zero = theirs == 0x8000
    assert (ours[neg_zero] == 0).all() and (np.signbit(x[neg_zero])).all()
    assert neg_zero.sum() > 100  # the case is really exercised
    same = ~nan & ~neg_zero
    assert_same(ours[same], theirs[same], "to_f16_bits vs torch")


def test_to_bf16_bits_matches_torch_except_nan() -> None:
    x = _conversion_values()
    ours = S.to_bf16_bits(x)
    theirs = cpu_bits(torch.from_numpy(x.copy()).to(torch.bfloat16))
    nan = np.isnan(x)
    assert (ours[nan] == S.BF16_NAN_BITS).all()
    assert ((theirs[nan] & 0x7FFF) > 0x7F80).all()
    # bf16 keeps the sign of a zero (as torch does): no other difference at all.
    assert_same(ours[~nan], theirs[~nan], "to_bf16_bits vs torch")


def test_input_conversions_are_exact() -> None:
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    # fp16: numpy's widening keeps NaN payloads (as the contract's integer conversion does).
    assert_same(S.bits_of(S.from_f16_bits(h)), S.bits_of(h.view(np.float16).astype(np.float32)), "fp16")
    got = S.row_to_f32(torch.from_numpy(h.view(np.int16).copy()).view(torch.float16))
    assert_same(S.bits_of(got), S.bits_of(S.from_f16_bits(h)), "row_to_f32 fp16")
    want = cpu_bits(torch.from_numpy(h.view(np.int16).copy()).view(torch.bfloat16).float())
    assert_same(S.bits_of(S.row_to_f32(torch.from_numpy(h.view(np.int16).copy()).view(torch.bfloat16))), want, "bf16")
