// rl_kernel numerical contract, in code. docs/numerics.md is the prose version;
// the two must say the same thing. Every function here is compiled three ways
// (host C++ for the CPU golden reference, nvcc for CUDA, clang/hipcc for HIP)
// and must give identical bits on all of them. Rules that make that true:
//   * only IEEE-754 binary32 +, -, *, the fused multiply-add fma_rn (one rounding:
//     correctly rounded on every target), compares, selects and integer bit
//     manipulation; no division, no sqrt, no libm/ocml/CUDA math;
//   * no implicit contraction: build with -ffp-contract=off / --fmad=false, so every
//     mul and add the code writes is rounded on its own; the only fused operations
//     are the explicit fma_rn calls (inline assembly on the GPUs, which the static
//     check tells apart from a compiler's contraction);
//   * the order of every reduction is fixed (reduce.h) and depends on the row length
//     only (never on warp/wavefront width, block count or batch size).
// This file holds the scalar rules (bits, flush, exp, log, conversions); reduce.h
// the fold and the tree; dtypes.h the element types.
#pragma once

#include <stdint.h>
#include <string.h>
#if defined(RL_MUTATIONS)
#include <stdio.h>
#include <stdlib.h>
#endif

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

namespace rl {

// ---- contract mutations (tests only) ------------------------------------------
// A build with -DRL_MUTATIONS (rl_kernel.contract.mutations) carries deliberate contract
// violations, each behind RL_MUTATED(id); the one to apply is chosen once per
// process from RL_KERNEL_MUTATION (unset: none, so that build gives the golden
// bits). Without RL_MUTATIONS, RL_MUTATED(id) is the constant false: the normal
// build has no code for any of it. The names are build_flags.mutation_names().
#if defined(RL_MUTATIONS)
enum Mutation : int {
  RL_MUT_NONE = 0,
  RL_MUT_TREE_ORDER = 1,      // the row tree's top nodes joined left to right instead of from the right
  RL_MUT_FLUSH_BOUNDARY = 2,  // flush: |x| <= 2^-126 instead of <
  RL_MUT_TIE_ROUNDING = 3,    // fp16/bf16 gradients: ties away (up) instead of to even
  RL_MUT_EXP_CONSTANT = 4,    // E3 of exp_fold one ulp larger
  RL_MUT_MAX_NO_NAN = 5,      // max(a, b) = b > a ? b : a (drops a NaN b)
};

inline int mutation_from_env() {
  static const char* const names[] = {"", "tree_order", "flush_boundary", "tie_rounding", "exp_constant",
                                      "max_no_nan"};
  const char* s = getenv("RL_KERNEL_MUTATION");
  if (s == nullptr || *s == 0) return RL_MUT_NONE;
  for (int i = 1; i < int(sizeof(names) / sizeof(names[0])); ++i)
    if (strcmp(s, names[i]) == 0) return i;
  fprintf(stderr, "rl_kernel: unknown RL_KERNEL_MUTATION=%s\n", s);
  abort();
}

// Read once per process (the first call), on the host.
inline int host_mutation() {
  static const int m = mutation_from_env();
  return m;
}

#if defined(__CUDACC__) || defined(__HIPCC__)
// The device copy; GpuExec's launch() copies host_mutation() into it once per device.
static __device__ int rl_mutation_device = 0;
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)
__host__ __device__ inline int mutation() {
#else
inline int mutation() {
#endif
#if defined(__HIP_DEVICE_COMPILE__) || defined(__CUDA_ARCH__)
  return rl_mutation_device;
#else
  return host_mutation();
#endif
}
#define RL_MUTATED(id) (::rl::mutation() == ::rl::id)
#else
#define RL_MUTATED(id) false
#endif

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

// 2^f on [-0.5, 0.5]: 1 + f*(E1 + f*(E2 + f*(E3 + f*(E4 + f*E5)))) by fused Horner steps, max 3.2 ulp.
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

// Results below 2^-126 in magnitude (subnormals, -0.0) become +0.0. Every executor
// runs in IEEE mode (gradual underflow): the GPU builds by their flags, the CPU
// executor by setting the FP environment for each call (cpu.h), so a process put in
// FTZ/DAZ by a library it loaded cannot change a bit (docs/numerics.md section 7).
RL_HD float flush(float x) {
  if (RL_MUTATED(RL_MUT_FLUSH_BOUNDARY)) return abs_of(x) <= RL_MIN_NORMAL ? 0.0f : x;
  return abs_of(x) < RL_MIN_NORMAL ? 0.0f : x;
}

// NaN-propagating maximum: a NaN operand wins (which NaN is unspecified). For
// max(-0, +0) either zero may come back; no output depends on it
// (docs/numerics.md, "signed zero").
RL_HD float max_nan(float a, float b) {
  if (RL_MUTATED(RL_MUT_MAX_NO_NAN)) return (b > a) ? b : a;
#if defined(RL_DEVICE_PASS) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;  // one FMNMX.NAN; the select below compiles to three instructions
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
  return r;
#else
  return (b > a || b != b) ? b : a;
#endif
}

// Fused multiply-add a*b + c with one rounding (IEEE-754 fusedMultiplyAdd, nearest even), the
// contract's only fused operation. On the GPUs it is inline assembly, so that a compiler's own
// contraction (an FMA the code did not write) is told apart in the assembly: PTX and AMD assembly
// mark inline asm, and kernels_check counts the rest. On the host, the C library's fmaf is
// correctly rounded (hardware FMA where the CPU has it).
RL_HD float fma_rn(float a, float b, float c) {
#if defined(RL_DEVICE_PASS) && defined(__CUDA_ARCH__)
  float r;
  asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(a), "f"(b), "f"(c));
  return r;
#elif defined(RL_DEVICE_PASS)
  float r;
  asm("v_fma_f32 %0, %1, %2, %3" : "=v"(r) : "v"(a), "v"(b), "v"(c));
  return r;
#else
  return __builtin_fmaf(a, b, c);
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
  if (RL_MUTATED(RL_MUT_TIE_ROUNDING)) return uint16_t((u + 0x8000u) >> 16);
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
    if (RL_MUTATED(RL_MUT_TIE_ROUNDING)) return uint16_t(sign | ((r + 0x1000u) >> 13));
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
//   |f| <= 1/2); p = poly(f) ~ 2^f in [0.70, 1.42], five fma_rn steps; result = p*2^k, formed by
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
  float p = RL_E5;  // each Horner step one fma_rn (contract v3)
  p = fma_rn(f, p, RL_E4);
  p = fma_rn(f, p, RL_MUTATED(RL_MUT_EXP_CONSTANT) ? float_of(bits_of(RL_E3) + 1u) : RL_E3);
  p = fma_rn(f, p, RL_E2);
  p = fma_rn(f, p, RL_E1);
  p = fma_rn(f, p, 1.0f);
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

// ---- the decoder layers' scalar functions (docs/numerics.md section 11) ----------------------
// An output value as stored: a NaN becomes the canonical NaN (vendors' arithmetic makes different
// NaN payloads, and an fp32 store keeps them), then rounded to D (dtypes.h) by D::store.
RL_HD float canonical(float x) { return x != x ? canonical_nan() : x; }

// 1/x for a positive normal x below 2^126: a bit-trick seed (relative error < 1/8), then four
// Newton steps e = 1 - x*r, r = r + r*e, each two fma_rn. Within 1 ulp; no division.
RL_HD float rcp_pos(float x) {
  float r = float_of(0x7ef311c3u - bits_of(x));
  RL_UNROLL(unroll)
  for (int i = 0; i < 4; ++i) {
    const float e = fma_rn(-x, r, 1.0f);
    r = fma_rn(r, e, r);
  }
  return r;
}

// 1/sqrt(v): for v normal a bit-trick seed and three Newton steps y = y + y*(1/2 - (v/2)*y*y) (each
// one product and two fma_rn); a subnormal v is scaled by 2^64 first (exact) and the result by 2^32.
// v = +0 gives +inf, +inf gives +0, a negative v or NaN the canonical NaN. No sqrt, no division.
RL_HD float rsqrt_core(float v) {
  const float h = 0.5f * v;
  float y = float_of(0x5f375a86u - (bits_of(v) >> 1));
  RL_UNROLL(unroll)
  for (int i = 0; i < 3; ++i) {
    const float e = fma_rn(-(h * y), y, 0.5f);
    y = fma_rn(y, e, y);
  }
  return y;
}

RL_HD float rsqrt_pos(float v) {
  if (!(v >= 0.0f)) return canonical_nan();
  if (v == 0.0f) return float_of(0x7f800000u);
  if (v > RL_FLT_MAX) return 0.0f;
  if (v < RL_MIN_NORMAL) return rsqrt_core(v * 0x1p64f) * 0x1p32f;
  return rsqrt_core(v);
}

// sin and cos of x, |x| < 2^22 (else both the canonical NaN): k = rint(x * 2/pi) (the magic constant),
// r = x - k*pi/2 by three fma_rn with pi/2 = P1 + P2 + P3, the quadrant k mod 4 from t's low bits, and
// Cephes' minimax polynomials on |r| <= pi/4 by fma_rn Horner steps. Accurate to a few ulp for
// |x| < 2^12 and degrading slowly above (the reduction's error grows with k); the same bits everywhere.
constexpr float RL_TRIG_MAX = 0x1p22f;
constexpr float RL_TWO_OVER_PI = 0x1.45f306p-1f;
constexpr float RL_PIO2_1 = 0x1.92p+0f;
constexpr float RL_PIO2_2 = 0x1.fb4p-12f;
constexpr float RL_PIO2_3 = 0x1.4442d2p-24f;
constexpr float RL_S1 = -0x1.555546p-3f;
constexpr float RL_S2 = 0x1.11073cp-7f;
constexpr float RL_S3 = -0x1.9943f2p-13f;
constexpr float RL_C1 = 0x1.55554ap-5f;
constexpr float RL_C2 = -0x1.6c0c34p-10f;
constexpr float RL_C3 = 0x1.99eb9cp-16f;

struct SinCos {
  float s, c;
};

RL_HD SinCos sin_cos(float x) {
  if (!(abs_of(x) < RL_TRIG_MAX)) return SinCos{canonical_nan(), canonical_nan()};
  const float t = x * RL_TWO_OVER_PI + RL_ROUND_MAGIC;
  const float k = t - RL_ROUND_MAGIC;
  const uint32_t q = bits_of(t) & 3u;  // k mod 4: bits(t) = bits(M) + k and bits(M) is a multiple of 4
  float r = fma_rn(-k, RL_PIO2_1, x);
  r = fma_rn(-k, RL_PIO2_2, r);
  r = fma_rn(-k, RL_PIO2_3, r);
  const float z = r * r;
  float sp = fma_rn(RL_S3, z, RL_S2);
  sp = fma_rn(sp, z, RL_S1);
  const float sr = fma_rn(sp * z, r, r);
  float cp = fma_rn(RL_C3, z, RL_C2);
  cp = fma_rn(cp, z, RL_C1);
  const float cr = fma_rn(cp * z, z, fma_rn(-0.5f, z, 1.0f));
  if (q == 0u) return SinCos{sr, cr};
  if (q == 1u) return SinCos{cr, -sr};
  if (q == 2u) return SinCos{-sr, -cr};
  return SinCos{-cr, sr};
}

// sigmoid(g) = 1/(1 + exp(-g)) with the contract's exp of a value <= 0: e = exp_flushed(-|g|) in
// [0, 1], so 1 + e is in [1, 2] and rcp_pos applies; for g < 0 the result is e/(1 + e).
RL_HD float sigmoid(float g) {
  if (g != g) return canonical_nan();
  const float e = exp_flushed(0.0f - abs_of(g));
  const float r = rcp_pos(1.0f + e);
  return g >= 0.0f ? r : e * r;
}

}  // namespace rl
