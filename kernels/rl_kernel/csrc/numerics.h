// rl_kernel numerical contract, in code. docs/numerics.md is the prose version;
// the two must say the same thing. Every function here is compiled three ways
// (host C++ for the CPU golden reference, nvcc for CUDA, clang/hipcc for HIP)
// and must give identical bits on all of them. Rules that make that true:
//   * only IEEE-754 binary32 +, -, * (round to nearest even), compares, selects
//     and integer bit manipulation; no division, no sqrt, no libm/ocml/CUDA math;
//   * no contraction: build with -ffp-contract=off / --fmad=false and never
//     call fmaf here, so every mul and add is rounded on its own;
//   * the order of every reduction is fixed below and depends on the row length
//     only (never on warp/wavefront width, block count or batch size).
#pragma once

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define RL_HD __host__ __device__ __forceinline__
#define RL_GPU_COMPILE 1
#else
#define RL_HD inline
#endif

#if defined(__HIP_DEVICE_COMPILE__) || defined(__CUDA_ARCH__)
#define RL_DEVICE_PASS 1
#endif

// Loop unrolling hints change instruction scheduling only, never the order of
// the arithmetic (each iteration's operations are the same, in the same order).
#if defined(__CUDACC__) || defined(__HIPCC__) || defined(__clang__)
#define RL_UNROLL(n) _Pragma(#n)
#else
#define RL_UNROLL(n)
#endif
#define RL_UNROLL_N(n) RL_UNROLL(unroll n)

// How many chunks of a lane loop are unrolled (loads issued ahead); tuning only.
#ifndef RL_LANE_UNROLL
#define RL_LANE_UNROLL 2
#endif

namespace rl {

// ---- fixed shape of every row reduction -----------------------------------
// A row of V elements is cut into chunks of RL_CHUNK consecutive elements.
// Lane t (0 <= t < RL_LANES) owns chunks t, t + RL_LANES, t + 2*RL_LANES, ...
// and folds them in increasing order; the RL_LANES lane partials are then
// combined by a binary tree: for stride = 128, 64, ..., 1, partial[t] =
// combine(partial[t], partial[t + stride]) for t < stride.
constexpr int RL_LANES = 256;
constexpr int RL_CHUNK = 8;

// ---- constants (hex floats: exact) -----------------------------------------
constexpr float RL_LOG2E = 0x1.715476p+0f;      // 1/ln2 rounded to binary32
constexpr float RL_ROUND_MAGIC = 0x1.8p+23f;    // 1.5*2^23: x + M - M = rint(x)
constexpr float RL_EXP2_YMIN = -125.0f;         // keeps p*2^k normal: the scaling is an exponent add
constexpr float RL_EXP_FLUSH_BELOW = -86.0f;    // exp_flushed(d) = 0 below this (exp(-86) ~ 4e-38)
constexpr float RL_LN2_HI = 0x1.62e300p-1f;     // 17 significant bits: k*HI exact for |k|<128
constexpr float RL_LN2_LO = 0x1.2fefa4p-17f;
constexpr float RL_SQRT2 = 0x1.6a09e6p+0f;
constexpr float RL_MIN_NORMAL = 0x1p-126f;
constexpr float RL_FLT_MAX = 0x1.fffffep+127f;
constexpr uint32_t RL_CANONICAL_NAN_BITS = 0x7fc00000u;

// 2^f on [-0.5, 0.5]: 1 + f*(E1 + f*(E2 + f*(E3 + f*(E4 + f*E5)))), max 3.2 ulp.
constexpr float RL_E1 = 0x1.62e42ap-1f;
constexpr float RL_E2 = 0x1.ebf9bcp-3f;
constexpr float RL_E3 = 0x1.c6b752p-5f;
constexpr float RL_E4 = 0x1.3cea88p-7f;
constexpr float RL_E5 = 0x1.5bba14p-10f;
// log1p(f) = f + f^2*Q(f) on [sqrt(1/2)-1, sqrt(2)-1], Q of degree 8, max 1.4 ulp.
constexpr float RL_L0 = -0x1.fffff8p-2f;
constexpr float RL_L1 = 0x1.555550p-2f;
constexpr float RL_L2 = -0x1.000426p-2f;
constexpr float RL_L3 = 0x1.99a3f6p-3f;
constexpr float RL_L4 = -0x1.542766p-3f;
constexpr float RL_L5 = 0x1.22715ep-3f;
constexpr float RL_L6 = -0x1.0f3756p-3f;
constexpr float RL_L7 = 0x1.0849bep-3f;
constexpr float RL_L8 = -0x1.38339ap-4f;

// ---- bits ------------------------------------------------------------------
RL_HD uint32_t bits_of(float x) {
#if defined(RL_DEVICE_PASS) && defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#elif defined(RL_DEVICE_PASS)
  return __builtin_bit_cast(uint32_t, x);
#else
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return u;
#endif
}

RL_HD float float_of(uint32_t u) {
#if defined(RL_DEVICE_PASS) && defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#elif defined(RL_DEVICE_PASS)
  return __builtin_bit_cast(float, u);
#else
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
#endif
}

RL_HD float canonical_nan() { return float_of(RL_CANONICAL_NAN_BITS); }

RL_HD float neg_inf() { return float_of(0xff800000u); }

// |x| by clearing the sign bit: exact, no libm.
RL_HD float abs_of(float x) { return float_of(bits_of(x) & 0x7fffffffu); }

// Results below 2^-126 in magnitude (subnormals, -0.0) become +0.0, so the
// hardware's denormal mode (FTZ/DAZ or IEEE gradual underflow) cannot show.
RL_HD float flush(float x) { return abs_of(x) < RL_MIN_NORMAL ? 0.0f : x; }

// NaN-propagating maximum: a NaN operand wins (which NaN is unspecified). For
// max(-0, +0) either zero may come back; no output depends on it
// (docs/numerics.md, "signed zero").
RL_HD float max_nan(float a, float b) {
#if defined(RL_DEVICE_PASS) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;  // one FMNMX.NAN; the select below compiles to three instructions
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (b > a || b != b) ? b : a;
#endif
}

// ---- input conversion (exact) ----------------------------------------------
RL_HD float from_bf16_bits(uint16_t h) { return float_of(uint32_t(h) << 16); }

// binary16 -> binary32 with integer operations only (exact; a binary16
// subnormal m*2^-24 is a normal binary32, built from an exact int conversion).
RL_HD float from_f16_bits(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t expo = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (expo == 0x1fu) return float_of(sign | 0x7f800000u | (mant << 13));
  if (expo != 0u) return float_of(sign | ((expo + 112u) << 23) | (mant << 13));
  const float mag = float(int(mant)) * 0x1p-24f;
  return float_of(sign | bits_of(mag));
}

// ---- output conversion (round to nearest even, canonical NaN) --------------
// Vendors disagree on the NaN a float->half conversion makes, so gradients are
// converted here rather than by the framework.
RL_HD uint16_t to_bf16_bits(float x) {
  const uint32_t u = bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

RL_HD uint16_t to_f16_bits(float x) {
  const uint32_t u = bits_of(x);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return 0x7e00u;
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a >= 0x38800000u) {                                  // a normal binary16
    const uint32_t r = a - 0x38000000u;                    // exponent bias 127 -> 15
    return uint16_t(sign | ((r + 0x0fffu + ((r >> 13) & 1u)) >> 13));
  }
  // Subnormal binary16: rint(|x| * 2^24); the scaling is exact and the result < 2^10.
  // A value that rounds to zero becomes +0.0, as flush() does for binary32.
  const float v = float_of(a) * 0x1p24f;
  const uint32_t q = uint32_t(int((v + RL_ROUND_MAGIC) - RL_ROUND_MAGIC));
  return uint16_t(q == 0u ? 0u : (sign | q));
}

// ---- exp ----------------------------------------------------------------------
// exp(d) for d <= 0 or -inf, the form used inside row folds:
//   y = d*log2(e) (rounded), clamped below at -125; k = rint(y) via the magic
//   constant (t = y + M holds k in its low mantissa bits); f = y - k (exact,
//   |f| <= 1/2); p = poly(f) ~ 2^f in [0.70, 1.42]; result = p*2^k, formed by
//   adding k to p's exponent field (exact, and always a normal number).
// So exp_fold(d) = exp_fold(-86.64...) ~ 2.4e-38 for every d below about
// -86.64, -inf included: inside a fold such a term is added to a sum >= 1 and
// vanishes. exp_fold(NaN) is unspecified: rows with a NaN are caught through
// their maximum, never through this value.
RL_HD float exp_fold(float d) {
  float y = d * RL_LOG2E;
  y = (y < RL_EXP2_YMIN) ? RL_EXP2_YMIN : y;
  const float t = y + RL_ROUND_MAGIC;
  const float k = t - RL_ROUND_MAGIC;
  const float f = y - k;
  float p = RL_E5;
  p = RL_E4 + f * p;
  p = RL_E3 + f * p;
  p = RL_E2 + f * p;
  p = RL_E1 + f * p;
  p = 1.0f + f * p;
  // bits(t) = bits(M) + k and bits(M) << 23 wraps to 0, so this adds k << 23.
  return float_of(bits_of(p) + (bits_of(t) << 23));
}

// exp(d) for stored or multiplied values: 0 below -86, NaN for NaN.
RL_HD float exp_flushed(float d) {
  if (d != d) return canonical_nan();
  return (d < RL_EXP_FLUSH_BELOW) ? 0.0f : exp_fold(d);
}

// ---- log -------------------------------------------------------------------
// log(s) for finite s >= 2^-126. s = 2^e * m with m in [sqrt(1/2), sqrt(2));
// f = m - 1 is exact; log(s) = e*LN2_HI + (e*LN2_LO + (f + f^2*Q(f))).
RL_HD float log_pos(float s) {
  const uint32_t b = bits_of(s);
  int e = int((b >> 23) & 0xffu) - 127;
  float m = float_of((b & 0x007fffffu) | 0x3f800000u);
  if (m > RL_SQRT2) {
    m = m * 0.5f;
    e = e + 1;
  }
  const float f = m - 1.0f;
  float q = RL_L8;
  q = RL_L7 + f * q;
  q = RL_L6 + f * q;
  q = RL_L5 + f * q;
  q = RL_L4 + f * q;
  q = RL_L3 + f * q;
  q = RL_L2 + f * q;
  q = RL_L1 + f * q;
  q = RL_L0 + f * q;
  const float l = f + (f * f) * q;
  const float ef = float(e);
  return ef * RL_LN2_HI + (ef * RL_LN2_LO + l);
}

// ---- the row fold: (running max, sum of exp(x - max)) ----------------------
struct Acc {
  float m;  // running maximum (NaN once a NaN was seen); starts at -FLT_MAX
  float s;  // sum of exp_fold(x - m) over the elements seen
};

RL_HD Acc acc_init() { return Acc{-RL_FLT_MAX, 0.0f}; }

// Pairwise sum of one chunk: ((v0+v1)+(v2+v3)) + ((v4+v5)+(v6+v7)).
RL_HD float chunk_sum(const float v[RL_CHUNK]) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// Fold one chunk into a lane's accumulator. Elements past the row end are -inf.
RL_HD void fold_chunk(Acc& a, const float x[RL_CHUNK]) {
  float cm = x[0];
  RL_UNROLL(unroll)
  for (int j = 1; j < RL_CHUNK; ++j) cm = max_nan(cm, x[j]);
  const float nm = max_nan(a.m, cm);
  if (!(nm == a.m)) {  // a larger maximum (or a NaN): rescale the sum
    a.s = a.s * exp_fold(a.m - nm);
    a.m = nm;
  }
  float e[RL_CHUNK];
  RL_UNROLL(unroll)
  for (int j = 0; j < RL_CHUNK; ++j) e[j] = exp_fold(x[j] - a.m);
  a.s = a.s + chunk_sum(e);
}

// Tree step: merge two lane partials (a from the lower lane index).
RL_HD Acc combine(Acc a, Acc b) {
  const float m = max_nan(a.m, b.m);
  const float sa = (a.m == m) ? a.s : a.s * exp_fold(a.m - m);
  const float sb = (b.m == m) ? b.s : b.s * exp_fold(b.m - m);
  return Acc{m, sa + sb};
}

// A row is well defined iff its maximum is finite (not NaN, not +inf) and s >= 1
// (s < 1 means every element was -inf). Bad rows output the canonical NaN.
RL_HD bool row_ok(Acc a) { return a.m <= RL_FLT_MAX && a.s >= 1.0f; }

// Row statistics handed from the forward to the backward and to users.
struct RowStats {
  float m;      // row maximum, flushed (so +0.0 for any zero), or NaN for a bad row
  float s;      // sum of exp(x - m), or NaN for a bad row
  float log_s;  // log(s), or NaN for a bad row
};

RL_HD RowStats finish(Acc a) {
  if (!row_ok(a)) return RowStats{canonical_nan(), canonical_nan(), canonical_nan()};
  return RowStats{flush(a.m), a.s, log_pos(a.s)};
}

// log p(x_i) = (x_i - m) - log(s), flushed; NaN for a bad row.
RL_HD float logprob(float x, RowStats st) {
  return (st.s >= 1.0f) ? flush((x - st.m) - st.log_s) : canonical_nan();
}

// Entropy term -p*log p of one element, with p = exp(lp); 0 where p == 0.
RL_HD float entropy_term(float lp) {
  const float p = exp_flushed(lp);
  return (p == 0.0f) ? 0.0f : flush(p * (0.0f - lp));
}

// ---- generic row loops shared by every build --------------------------------
// Load(c, x, full) fills x[0..7] with elements 8c..8c+7 of the row; when full is
// false the chunk is the row's last, partial one and is padded with -inf.
// Term(c, v, full) likewise fills per-element terms of a sum, padded with 0.
// Chunk c belongs to lane c % RL_LANES, so the partial chunk (if any) is the
// last chunk of its lane: the loops below visit exactly the order stated above.
RL_HD int full_chunks(int64_t V) { return int(V / RL_CHUNK); }
RL_HD bool has_tail(int64_t V) { return V % RL_CHUNK != 0; }

template <class Load>
RL_HD Acc lane_stats(const Load& load, int64_t V, int t) {
  Acc a = acc_init();
  float x[RL_CHUNK];
  const int nfull = full_chunks(V);
  RL_UNROLL_N(RL_LANE_UNROLL)
  for (int c = t; c < nfull; c += RL_LANES) {
    load(c, x, true);
    fold_chunk(a, x);
  }
  if (has_tail(V) && nfull % RL_LANES == t) {
    load(nfull, x, false);
    fold_chunk(a, x);
  }
  return a;
}

template <class Term>
RL_HD float lane_sum(const Term& term, int64_t V, int t) {
  float s = 0.0f;
  float v[RL_CHUNK];
  const int nfull = full_chunks(V);
  RL_UNROLL_N(RL_LANE_UNROLL)
  for (int c = t; c < nfull; c += RL_LANES) {
    term(c, v, true);
    s = s + chunk_sum(v);
  }
  if (has_tail(V) && nfull % RL_LANES == t) {
    term(nfull, v, false);
    s = s + chunk_sum(v);
  }
  return s;
}

// One level of the lane tree, for lane t < stride.
RL_HD void tree_step(Acc* p, int t, int stride) { p[t] = combine(p[t], p[t + stride]); }
RL_HD void tree_step(float* p, int t, int stride) { p[t] = p[t] + p[t + stride]; }

// Host form of the tree (the GPU runs the same steps with a barrier per level).
template <class P>
inline P host_tree(P* partials) {
  for (int stride = RL_LANES / 2; stride > 0; stride >>= 1)
    for (int t = 0; t < stride; ++t) tree_step(partials, t, stride);
  return partials[0];
}

}  // namespace rl
