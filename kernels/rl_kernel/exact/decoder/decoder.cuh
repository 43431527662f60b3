// The decoder family (docs/numerics.md section 11): linear, RMSNorm, rotary embedding, SiLU x up and
// causal grouped-query attention, each as the contract's per-element or per-row function (used by the
// CPU executor, decoder_cpu.cpp) and, beside it, the GPU kernel that computes the same function in the
// same order (decoder_gpu.cu launches them). No ATen here: kernels-check compiles this file alone
// (decoder_check.cu) for every GPU target.
#pragma once

#include "../common/dtypes.h"
#include "../common/gpu.h"
#include "../common/reduce.h"

namespace rl {

// ---- shared scalar rules ----------------------------------------------------------------------
// An output element: canonical NaN, then rounded to D (round to nearest even).
template <class D>
RL_HD typename D::storage store_out(float x) {
  return D::store(canonical(x));
}

// x rounded to D and widened back (exact): the value a D tensor would hold.
template <class D>
RL_HD float rounded(float x) {
  const typename D::storage s = store_out<D>(x);
  return D::load(&s, 0);
}

// +0.0 for a zero of either sign, x otherwise: terms of a padded tree sum may never be -0.0 (-0 + 0 = +0).
RL_HD float no_neg_zero(float x) { return x + 0.0f; }

// ---- linear: y[m, n] = sum_k x[m, k] * w[n, k] ------------------------------------------------
// One fma_rn chain per output element, k = 0, 1, ..., K - 1 from +0.0 (every M, every tile shape:
// the same chain), then + bias[n] (one rounding) when there is a bias.
template <class D>
inline float linear_dot(const typename D::storage* x, const typename D::storage* w, int64_t K) {
  float acc = 0.0f;
  for (int64_t k = 0; k < K; ++k) acc = fma_rn(D::load(x, k), D::load(w, k), acc);
  return acc;
}

RL_HD float with_bias(float acc, const float* bias_or_null, float bias) {
  return bias_or_null == nullptr ? acc : acc + bias;
}

// ---- RMSNorm: y = w * rounded(x * rsqrt(mean(x^2) + eps)) ------------------------------------
// The sum of squares is a plain sum of the row's tree (section 2) over the terms x_i * x_i.
RL_HD float rms_rstd(float sum_sq, float inv_n, float eps) { return rsqrt_pos(sum_sq * inv_n + eps); }

template <class D>
RL_HD typename D::storage rms_out(float x, float r, float w) {
  return store_out<D>(rounded<D>(x * r) * w);
}

// Backward, for g_i = dy_i * w_i and dot = tree sum of no_neg_zero(g_i * x_i):
// c = ((dot * inv_n) * r) * r) * r, dx_i = r * g_i - x_i * c.
RL_HD float rms_grad_coef(float dot, float inv_n, float r) { return ((dot * inv_n) * r * r) * r; }
RL_HD float rms_grad_x(float x, float g, float r, float c) { return r * g - x * c; }

// ---- rotary embedding -------------------------------------------------------------------------
// The table: angle = float(position) * inv_freq, then the contract's sin_cos.
RL_HD SinCos rope_angle(int64_t pos, float inv_freq) { return sin_cos(float(pos) * inv_freq); }

// Pairs (x1, x2) = (x_i, x_{i + D/2}) (Hugging Face's rotate_half): (x1*c - x2*s, x2*c + x1*s).
struct Pair {
  float a, b;
};
RL_HD Pair rotate(float x1, float x2, float c, float s) { return Pair{x1 * c - x2 * s, x2 * c + x1 * s}; }

// ---- SiLU(gate) * up --------------------------------------------------------------------------
RL_HD float silu(float g) { return g * sigmoid(g); }
RL_HD float silu_mul(float g, float u) { return silu(g) * u; }

// d/dgate = (dy * u) * (s + (g * s) * (1 - s)), d/dup = dy * (g * s), s = sigmoid(g).
RL_HD Pair silu_mul_grad(float dy, float g, float u) {
  const float s = sigmoid(g);
  const float gs = g * s;
  return Pair{(dy * u) * (s + gs * (1.0f - s)), dy * gs};
}

// ---- attention --------------------------------------------------------------------------------
// A query row sees the keys j0 .. j1 (inclusive) of its sequence, in tiles of RL_ATTN_TILE keys
// counted from j0. Per tile: s_u = dot(q, k_u) * scale (one fma_rn chain over d from +0.0);
// mt = max(m, s_0, s_1, ...); alpha = exp_fold(m - mt); l = l * alpha; acc_d = acc_d * alpha; then for
// u in order: p = exp_fold(s_u - mt); l = l + p; acc_d = fma_rn(p, v_u[d], acc_d). Start m = -FLT_MAX,
// l = 0, acc = 0; the output is acc_d * rcp_pos(l), the canonical NaN when m is NaN or +inf, and +0.0
// for a row that sees no key.
constexpr int RL_ATTN_TILE = 32;
constexpr int RL_ATTN_MAX_DIM = 256;  // head_dim limit of both executors (a GPU lane holds 8 accumulators)

template <class D>
RL_HD float attn_score(const typename D::storage* q, const typename D::storage* k, int64_t Dh, float scale) {
  float acc = 0.0f;
  for (int64_t d = 0; d < Dh; ++d) acc = fma_rn(D::load(q, d), D::load(k, d), acc);
  return acc * scale;
}

RL_HD bool attn_bad(float m) { return !(m <= RL_FLT_MAX); }

// The statistics a row leaves (for diagnostics and a backward): m with a zero's sign cleared, and l.
RL_HD float attn_stat_m(float m) { return canonical(no_neg_zero(m)); }

template <class D>
inline void attention_row(const typename D::storage* q, const typename D::storage* k, const typename D::storage* v,
                          int64_t Dh, int64_t j0, int64_t j1, float scale, typename D::storage* o, float* stats,
                          float* acc) {
  float m = -RL_FLT_MAX, l = 0.0f;
  for (int64_t d = 0; d < Dh; ++d) acc[d] = 0.0f;
  for (int64_t t0 = j0; t0 <= j1; t0 += RL_ATTN_TILE) {
    const int n = int(j1 - t0 + 1 < RL_ATTN_TILE ? j1 - t0 + 1 : RL_ATTN_TILE);
    float s[RL_ATTN_TILE];
    float mt = m;
    for (int u = 0; u < n; ++u) {
      s[u] = attn_score<D>(q, k + (t0 + u) * Dh, Dh, scale);
      mt = max_nan(mt, s[u]);
    }
    const float alpha = exp_fold(m - mt);
    l = l * alpha;
    for (int64_t d = 0; d < Dh; ++d) acc[d] = acc[d] * alpha;
    for (int u = 0; u < n; ++u) {
      const float p = exp_fold(s[u] - mt);
      l = l + p;
      const typename D::storage* vu = v + (t0 + u) * Dh;
      for (int64_t d = 0; d < Dh; ++d) acc[d] = fma_rn(p, D::load(vu, d), acc[d]);
    }
    m = mt;
  }
  const bool empty = j1 < j0;
  const float r = (empty || attn_bad(m)) ? 0.0f : rcp_pos(l);
  for (int64_t d = 0; d < Dh; ++d)
    o[d] = empty ? store_out<D>(0.0f) : store_out<D>(attn_bad(m) ? canonical_nan() : acc[d] * r);
  stats[0] = attn_stat_m(m);
  stats[1] = canonical(l);
}

// ---- attention backward (section 11) ----------------------------------------------------------
// Per query row, from the forward's statistics and output: m, r = rcp_pos(l), Dr = dot(dO, O) (one fma_rn
// chain over d). For each key j the row sees, p = exp_fold(s - m) * r and dS = p * (dot(dO, v_j) - Dr);
// a bad row (m NaN or +inf) has p = dS = NaN. dq_i = scale * sum_j dS_ij k_j (j ascending); dk_j = scale
// * sum dS_ij q_i and dv_j = sum p_ij dO_i over the query heads of j's KV head in order, then the rows i
// that see j in order (one fma_rn chain each, from +0). The pair (i, j) gives the same (p, dS) wherever
// it is computed: attn_grad_terms below.
struct RowGrad {
  float m, r, dr;
  bool bad;
};

template <class D>
RL_HD RowGrad attn_row_grad(const float* stats, const typename D::storage* o, const typename D::storage* go,
                            int64_t Dh) {
  const float m = stats[0];
  const bool bad = attn_bad(m);
  float dr = 0.0f;
  for (int64_t d = 0; d < Dh; ++d) dr = fma_rn(D::load(go, d), D::load(o, d), dr);
  return RowGrad{m, bad ? 0.0f : rcp_pos(stats[1]), dr, bad};
}

RL_HD Pair attn_grad_terms(float s, float dp, const RowGrad& g) {
  if (g.bad) return Pair{canonical_nan(), canonical_nan()};
  const float p = exp_fold(s - g.m) * g.r;
  return Pair{p, p * (dp - g.dr)};
}

template <class D>
RL_HD Pair attn_pair_grad(const typename D::storage* q, const typename D::storage* go, const typename D::storage* k,
                          const typename D::storage* v, int64_t Dh, float scale, const RowGrad& g) {
  const float s = attn_score<D>(q, k, Dh, scale);
  float dp = 0.0f;
  for (int64_t d = 0; d < Dh; ++d) dp = fma_rn(D::load(go, d), D::load(v, d), dp);
  return attn_grad_terms(s, dp, g);
}

// ============================ GPU kernels ====================================
#if defined(RL_GPU_COMPILE)

// ---- linear: a 128 x 128 output tile per block of 256 threads, 8 x 8 per thread ---------------
// K is walked in steps of 8 through shared memory (double buffered); every thread's outputs take
// their k terms in order 0 .. K-1, so the tile shape changes no bit.
constexpr int RL_GEMM_BM = 128;
constexpr int RL_GEMM_BN = 128;
constexpr int RL_GEMM_BK = 8;
constexpr int RL_GEMM_T = 8;  // outputs per thread along m and along n
constexpr int RL_GEMM_THREADS = 256;
constexpr int RL_GEMM_PAD = 4;

template <class D>
__device__ __forceinline__ void gemm_load(const typename D::storage* p, int64_t ld, int64_t rows, int64_t K,
                                          int64_t r0, int64_t k0, float out[4]) {
  const int tid = RL_TID;
  const int64_t r = r0 + tid / 2, k = k0 + (tid % 2) * 4;
  RL_UNROLL(unroll)
  for (int i = 0; i < 4; ++i) out[i] = (r < rows && k + i < K) ? D::load(p, r * ld + k + i) : 0.0f;
}

__device__ __forceinline__ void gemm_stage(float (*s)[RL_GEMM_BM + RL_GEMM_PAD], const float v[4]) {
  const int tid = RL_TID;
  RL_UNROLL(unroll)
  for (int i = 0; i < 4; ++i) s[(tid % 2) * 4 + i][tid / 2] = v[i];
}

__device__ __forceinline__ void gemm_steps(const float (*as)[RL_GEMM_BM + RL_GEMM_PAD],
                                           const float (*bs)[RL_GEMM_BN + RL_GEMM_PAD], int tm, int tn,
                                           float acc[RL_GEMM_T][RL_GEMM_T]) {
  RL_UNROLL(unroll)
  for (int kk = 0; kk < RL_GEMM_BK; ++kk) {
    float a[RL_GEMM_T], b[RL_GEMM_T];
    RL_UNROLL(unroll)
    for (int i = 0; i < RL_GEMM_T; ++i) {
      a[i] = as[kk][tm + i];
      b[i] = bs[kk][tn + i];
    }
    RL_UNROLL(unroll)
    for (int i = 0; i < RL_GEMM_T; ++i) {
      RL_UNROLL(unroll)
      for (int j = 0; j < RL_GEMM_T; ++j) acc[i][j] = fma_rn(a[i], b[j], acc[i][j]);
    }
  }
}

// The partial last step of K: the first `steps` (< 8) k of the tile, in order.
__device__ __forceinline__ void gemm_tail(const float (*as)[RL_GEMM_BM + RL_GEMM_PAD],
                                          const float (*bs)[RL_GEMM_BN + RL_GEMM_PAD], int steps, int tm, int tn,
                                          float acc[RL_GEMM_T][RL_GEMM_T]) {
  for (int kk = 0; kk < steps; ++kk) {
    RL_UNROLL(unroll)
    for (int i = 0; i < RL_GEMM_T; ++i) {
      RL_UNROLL(unroll)
      for (int j = 0; j < RL_GEMM_T; ++j) acc[i][j] = fma_rn(as[kk][tm + i], bs[kk][tn + j], acc[i][j]);
    }
  }
}

// y[M, N] = x[M, K] (row stride ldx) . w[N, K]^T (+ bias[N]); blockIdx.x tiles n, blockIdx.y tiles m.
template <class D>
__global__ void __launch_bounds__(RL_GEMM_THREADS, 2) linear_kernel(int64_t M, int64_t N, int64_t K,
                                                                  const typename D::storage* x, int64_t ldx,
                                                                  const typename D::storage* w,
                                                                  const typename D::storage* bias,
                                                                  typename D::storage* y) {
  __shared__ float as[2][RL_GEMM_BK][RL_GEMM_BM + RL_GEMM_PAD];
  __shared__ float bs[2][RL_GEMM_BK][RL_GEMM_BN + RL_GEMM_PAD];
  const int64_t n0 = RL_ROW * RL_GEMM_BN, m0 = RL_BLOCK_Y * RL_GEMM_BM;
  const int tm = (RL_TID / 16) * RL_GEMM_T, tn = (RL_TID % 16) * RL_GEMM_T;
  float acc[RL_GEMM_T][RL_GEMM_T];
  RL_UNROLL(unroll)
  for (int i = 0; i < RL_GEMM_T; ++i) {
    RL_UNROLL(unroll)
    for (int j = 0; j < RL_GEMM_T; ++j) acc[i][j] = 0.0f;
  }
  float ra[4], rb[4];
  gemm_load<D>(x, ldx, M, K, m0, 0, ra);
  gemm_load<D>(w, K, N, K, n0, 0, rb);
  gemm_stage(as[0], ra);
  gemm_stage(bs[0], rb);
  RL_SYNC();
  int buf = 0;
  for (int64_t k0 = 0; k0 < K; k0 += RL_GEMM_BK) {
    const bool more = k0 + RL_GEMM_BK < K;
    if (more) {
      gemm_load<D>(x, ldx, M, K, m0, k0 + RL_GEMM_BK, ra);
      gemm_load<D>(w, K, N, K, n0, k0 + RL_GEMM_BK, rb);
    }
    if (k0 + RL_GEMM_BK <= K)
      gemm_steps(as[buf], bs[buf], tm, tn, acc);
    else
      gemm_tail(as[buf], bs[buf], int(K - k0), tm, tn, acc);
    if (more) {
      gemm_stage(as[buf ^ 1], ra);
      gemm_stage(bs[buf ^ 1], rb);
    }
    RL_SYNC();
    buf ^= 1;
  }
  RL_UNROLL(unroll)
  for (int i = 0; i < RL_GEMM_T; ++i) {
    const int64_t m = m0 + tm + i;
    if (m >= M) break;
    RL_UNROLL(unroll)
    for (int j = 0; j < RL_GEMM_T; ++j) {
      const int64_t n = n0 + tn + j;
      if (n < N) {
        const float b = bias == nullptr ? 0.0f : D::load(bias, n);
        y[m * N + n] = store_out<D>(bias == nullptr ? acc[i][j] : acc[i][j] + b);
      }
    }
  }
}

// ---- linear for few rows (a decode step): one thread per output column ---------------------------
// A 128 x 128 tile would leave most of the GPU idle at M = 1: here lane l of block j computes column
// n = 32 j + l for up to RL_SKINNY_ROWS rows (blockIdx.y picks the rows), walking its weight row with
// 16-byte loads (x is read alike by every lane: a broadcast). The chains are the tiled kernel's: k in
// order from +0, one fma_rn each, so a row's bits do not depend on which kernel ran.
constexpr int RL_SKINNY_ROWS = 16;

template <class D>
__device__ __forceinline__ void load8(const typename D::storage* p, float v[8]) {
  if constexpr (sizeof(typename D::storage) == 2) {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    RL_UNROLL(unroll)
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = D::from_bits(uint16_t(w[i] & 0xffffu));
      v[2 * i + 1] = D::from_bits(uint16_t(w[i] >> 16));
    }
  } else {
    const float4 a = *reinterpret_cast<const float4*>(p);
    const float4 b = *reinterpret_cast<const float4*>(p + 4);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
}

// vec: every row of x and w starts 16-byte aligned and K % 8 == 0 (the host checks), so 8 elements load
// at once; otherwise one at a time.
template <class D, bool vec>
__global__ void __launch_bounds__(RL_WARP) linear_skinny_kernel(int64_t M, int64_t N, int64_t K,
                                                                const typename D::storage* x, int64_t ldx,
                                                                const typename D::storage* w,
                                                                const typename D::storage* bias,
                                                                typename D::storage* y) {
  const int64_t n = RL_ROW * RL_WARP + lane_id(), m0 = RL_BLOCK_Y * RL_SKINNY_ROWS;
  if (n >= N) return;
  const int rows = int(M - m0 < RL_SKINNY_ROWS ? M - m0 : RL_SKINNY_ROWS);
  const typename D::storage* wr = w + n * K;
  const typename D::storage* xr = x + m0 * ldx;
  float acc[RL_SKINNY_ROWS];
  RL_UNROLL(unroll)
  for (int r = 0; r < RL_SKINNY_ROWS; ++r) acc[r] = 0.0f;
  int64_t k = 0;
  if constexpr (vec) {
    RL_UNROLL(unroll 4)
    for (; k + 8 <= K; k += 8) {
      float wv[8];
      load8<D>(wr + k, wv);
      RL_UNROLL(unroll)
      for (int r = 0; r < RL_SKINNY_ROWS; ++r) {
        if (r >= rows) break;
        float xv[8];
        load8<D>(xr + r * ldx + k, xv);
        RL_UNROLL(unroll)
        for (int i = 0; i < 8; ++i) acc[r] = fma_rn(xv[i], wv[i], acc[r]);
      }
    }
  }
  for (; k < K; ++k) {
    const float wk = D::load(wr, k);
    RL_UNROLL(unroll)
    for (int r = 0; r < RL_SKINNY_ROWS; ++r) {
      if (r >= rows) break;
      acc[r] = fma_rn(D::load(xr, r * ldx + k), wk, acc[r]);
    }
  }
  const float b = bias == nullptr ? 0.0f : D::load(bias, n);
  RL_UNROLL(unroll)
  for (int r = 0; r < RL_SKINNY_ROWS; ++r) {
    if (r >= rows) break;
    y[(m0 + r) * N + n] = store_out<D>(bias == nullptr ? acc[r] : acc[r] + b);
  }
}

// ---- RMSNorm: one block of RL_NORM_THREADS per row ----------------------------------------------
// The row's chunk sums go to shared memory, padded with +0.0 to a power of two, and are joined level
// by level: the perfect tree of section 2 (terms are never -0.0, so a padding +0.0 changes no node).
// Level by level in place at a doubling stride: node c of a level is written where its left child was
// (sh[2 c s] = sh[2 c s] + sh[2 c s + s]), so within a level no thread reads what another writes.
// (Compacting into sh[c] instead raced across warps once a row had more than 64 chunks.)
constexpr int RL_NORM_THREADS = 256;
constexpr int RL_NORM_MAX_CHUNKS = 8192;  // rows of up to 65536 elements

__device__ __forceinline__ float block_tree_sum(float* sh, int64_t chunks) {
  int64_t width = 1;
  while (width < chunks) width <<= 1;
  for (int64_t c = chunks + RL_TID; c < width; c += RL_NORM_THREADS) sh[c] = 0.0f;
  RL_SYNC();
  for (int64_t stride = 1, nodes = width >> 1; nodes > 0; stride <<= 1, nodes >>= 1) {
    for (int64_t c = RL_TID; c < nodes; c += RL_NORM_THREADS) {
      const int64_t at = 2 * c * stride;
      sh[at] = sh[at] + sh[at + stride];
    }
    RL_SYNC();
  }
  const float total = sh[0];
  RL_SYNC();
  return total;
}

// Chunk c's pairwise sum of term(i) over elements 8c .. 8c+7 (padded with +0.0 past n).
template <class Term>
__device__ __forceinline__ float chunk_terms(const Term& term, int64_t c, int64_t n) {
  float v[RL_CHUNK];
  RL_UNROLL(unroll)
  for (int j = 0; j < RL_CHUNK; ++j) v[j] = (c * RL_CHUNK + j < n) ? term(c * RL_CHUNK + j) : 0.0f;
  return chunk_sum(v);
}

template <class Term>
__device__ __forceinline__ float block_row_sum(float* sh, const Term& term, int64_t n) {
  const int64_t chunks = chunks_of(n);
  for (int64_t c = RL_TID; c < chunks; c += RL_NORM_THREADS) sh[c] = chunk_terms(term, c, n);
  return block_tree_sum(sh, chunks);
}

template <class D>
__global__ void __launch_bounds__(RL_NORM_THREADS) rms_norm_kernel(int64_t H, const typename D::storage* x,
                                                                    const typename D::storage* w, float inv_n,
                                                                    float eps, typename D::storage* y, float* rstd) {
  extern __shared__ float sh[];
  const typename D::storage* row = x + RL_ROW * H;
  const float ss = block_row_sum(sh, [&](int64_t i) {
    const float v = D::load(row, i);
    return v * v;
  }, H);
  const float r = rms_rstd(ss, inv_n, eps);
  for (int64_t i = RL_TID; i < H; i += RL_NORM_THREADS) y[RL_ROW * H + i] = rms_out<D>(D::load(row, i), r, D::load(w, i));
  if (RL_TID == 0) rstd[RL_ROW] = r;
}

template <class D>
__global__ void __launch_bounds__(RL_NORM_THREADS) rms_norm_backward_kernel(int64_t H, const typename D::storage* dy,
                                                                             const typename D::storage* x,
                                                                             const typename D::storage* w,
                                                                             const float* rstd, float inv_n,
                                                                             typename D::storage* dx) {
  extern __shared__ float sh[];
  const int64_t base = RL_ROW * H;
  const float dot = block_row_sum(sh, [&](int64_t i) {
    return no_neg_zero((D::load(dy, base + i) * D::load(w, i)) * D::load(x, base + i));
  }, H);
  const float r = rstd[RL_ROW];
  const float c = rms_grad_coef(dot, inv_n, r);
  for (int64_t i = RL_TID; i < H; i += RL_NORM_THREADS) {
    const float g = D::load(dy, base + i) * D::load(w, i);
    dx[base + i] = store_out<D>(rms_grad_x(D::load(x, base + i), g, r, c));
  }
}

// dw[j] = sum over rows m, in order, of dy[m, j] * rounded(x[m, j] * r_m) (an fma_rn chain from +0.0):
// one thread per column.
template <class D>
__global__ void __launch_bounds__(RL_NORM_THREADS) rms_norm_weight_grad_kernel(int64_t rows, int64_t H,
                                                                                const typename D::storage* dy,
                                                                                const typename D::storage* x,
                                                                                const float* rstd,
                                                                                typename D::storage* dw) {
  const int64_t j = RL_ROW * RL_NORM_THREADS + RL_TID;
  if (j >= H) return;
  float acc = 0.0f;
  for (int64_t m = 0; m < rows; ++m)
    acc = fma_rn(D::load(dy, m * H + j), rounded<D>(D::load(x, m * H + j) * rstd[m]), acc);
  dw[j] = store_out<D>(acc);
}

// ---- elementwise: rotary table, rotary, SiLU x up --------------------------------------------
constexpr int RL_ELEM_THREADS = 256;

__device__ __forceinline__ int64_t elem_index() { return RL_ROW * RL_ELEM_THREADS + RL_TID; }

// cos/sin[p, i]: one block per position p (blockIdx.x), threads over i < half. No index is divided
// (a runtime integer division compiles to the hardware reciprocal, which kernels_check rejects).
constexpr int RL_ROPE_THREADS = 128;

__global__ void __launch_bounds__(RL_ROPE_THREADS) rope_table_kernel(int64_t half, const int64_t* pos,
                                                                      const float* inv_freq, float* cos_out,
                                                                      float* sin_out) {
  const int64_t p = RL_ROW;
  for (int64_t i = RL_TID; i < half; i += RL_ROPE_THREADS) {
    const SinCos sc = rope_angle(pos[p], inv_freq[i]);
    cos_out[p * half + i] = canonical(sc.c);
    sin_out[p * half + i] = canonical(sc.s);
  }
}

// x [B, H, T, Dh] contiguous; cos/sin [B, T, Dh/2]. One block per (t, h, b) = (blockIdx.x, y, z), threads
// over the pairs.
template <class D>
__global__ void __launch_bounds__(RL_ROPE_THREADS) rotary_kernel(int64_t H, int64_t T, int64_t Dh,
                                                                  const typename D::storage* x, const float* cosv,
                                                                  const float* sinv, typename D::storage* out) {
  const int64_t t = RL_ROW, h = RL_BLOCK_Y, b = RL_BLOCK_Z, half = Dh / 2;
  const int64_t row = ((b * H + h) * T + t) * Dh, cs = (b * T + t) * half;
  for (int64_t i = RL_TID; i < half; i += RL_ROPE_THREADS) {
    const Pair p = rotate(D::load(x, row + i), D::load(x, row + i + half), cosv[cs + i], sinv[cs + i]);
    out[row + i] = store_out<D>(p.a);
    out[row + i + half] = store_out<D>(p.b);
  }
}

template <class D>
__global__ void __launch_bounds__(RL_ELEM_THREADS) silu_mul_kernel(int64_t n, const typename D::storage* g,
                                                                    const typename D::storage* u,
                                                                    typename D::storage* out) {
  const int64_t e = elem_index();
  if (e < n) out[e] = store_out<D>(silu_mul(D::load(g, e), D::load(u, e)));
}

template <class D>
__global__ void __launch_bounds__(RL_ELEM_THREADS) silu_mul_backward_kernel(int64_t n, const typename D::storage* dy,
                                                                             const typename D::storage* g,
                                                                             const typename D::storage* u,
                                                                             typename D::storage* dg,
                                                                             typename D::storage* du) {
  const int64_t e = elem_index();
  if (e >= n) return;
  const Pair p = silu_mul_grad(D::load(dy, e), D::load(g, e), D::load(u, e));
  dg[e] = store_out<D>(p.a);
  du[e] = store_out<D>(p.b);
}

// ---- attention: one logical warp (32 lanes) per query row, a block per group of rows that share keys --
// Block (blockIdx.x, y, z) = (query chunk, KV head, batch) holds qc query positions x the `group` query
// heads of that KV head, a warp each, so all its rows read the same keys. Per tile the block stages the
// 32 keys and values in shared memory (widened to fp32; key rows padded by 4 floats so that lane u's
// 16-byte reads of row u hit distinct banks). Lane u computes the score of key u (its fma_rn chain over
// d in order); the tile's max is a shuffle max (exact, order-free up to a zero's sign, which no output
// shows); every lane adds the tile's p in order to l (the same bits in every lane), and lane d owns
// acc[d], acc[d + 32], ...: per key in order, one fma_rn each. So every row runs section 11's loop.
constexpr int RL_ATTN_PER_LANE = RL_ATTN_MAX_DIM / RL_WARP;
constexpr int RL_ATTN_MAX_WARPS = 32;

__device__ __forceinline__ float warp_max(float v) {
  RL_UNROLL(unroll)
  for (int m = 1; m < RL_WARP; m <<= 1) v = max_nan(v, shfl_xor(v, m));
  return v;
}

// The score of one key row kr (shared, fp32) against q (shared, fp32): 16-byte reads when Dh % 4 == 0.
__device__ __forceinline__ float attn_score_shared(const float* qs, const float* kr, int64_t Dh, float scale) {
  float acc = 0.0f;
  if ((Dh & 3) == 0) {
    for (int64_t d = 0; d < Dh; d += 4) {
      const float4 a = *reinterpret_cast<const float4*>(qs + d);
      const float4 b = *reinterpret_cast<const float4*>(kr + d);
      acc = fma_rn(a.x, b.x, acc);
      acc = fma_rn(a.y, b.y, acc);
      acc = fma_rn(a.z, b.z, acc);
      acc = fma_rn(a.w, b.w, acc);
    }
  } else {
    for (int64_t d = 0; d < Dh; ++d) acc = fma_rn(qs[d], kr[d], acc);
  }
  return acc * scale;
}

// Shared memory of a block: the key tile [32][Dh + 4], the value tile [32][Dh], one q row per warp.
RL_HD int64_t attn_shared_floats(int64_t Dh, int warps) { return RL_ATTN_TILE * (Dh + 4) + RL_ATTN_TILE * Dh + warps * Dh; }

// q [B, Hq, Tq, Dh], k/v [B, Hkv, Tk, Dh], q_pos [B, Tq], k_start [B]; o like q, stats [B, Hq, Tq, 2].
template <class D>
__global__ void __launch_bounds__(RL_ATTN_MAX_WARPS* RL_WARP) attention_kernel(
    int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t Dh, int group, int qc, const typename D::storage* q,
    const typename D::storage* k, const typename D::storage* v, const int64_t* q_pos, const int64_t* k_start,
    float scale, typename D::storage* o, float* stats) {
  extern __shared__ float sm[];
  __shared__ int64_t last_key[RL_ATTN_MAX_WARPS];
  const int warps = group * qc, threads = warps * RL_WARP, w = warp_id(), lane = lane_id();
  float* kt = sm;
  float* vt = kt + RL_ATTN_TILE * (Dh + 4);
  float* qs = vt + RL_ATTN_TILE * Dh + w * Dh;
  int tw = 0, gw = w;  // warp -> (query position in the chunk, head in the group), without a division
  while (gw >= group) {
    gw -= group;
    ++tw;
  }
  const int64_t b = RL_BLOCK_Z, kvh = RL_BLOCK_Y, t = RL_ROW * qc + tw;
  const bool active = t < Tq;
  const int64_t row = (b * Hq + kvh * group + gw) * Tq + t;
  const typename D::storage* kb = k + (b * Hkv + kvh) * Tk * Dh;
  const typename D::storage* vb = v + (b * Hkv + kvh) * Tk * Dh;
  const int64_t j0 = k_start[b], j1 = active ? q_pos[b * Tq + t] : j0 - 1;
  if (active)
    for (int64_t d = lane; d < Dh; d += RL_WARP) qs[d] = D::load(q, row * Dh + d);
  if (lane == 0) last_key[w] = j1;
  RL_SYNC();
  int64_t jend = j0 - 1;
  for (int i = 0; i < warps; ++i) jend = last_key[i] > jend ? last_key[i] : jend;
  float acc[RL_ATTN_PER_LANE];
  RL_UNROLL(unroll)
  for (int i = 0; i < RL_ATTN_PER_LANE; ++i) acc[i] = 0.0f;
  float m = -RL_FLT_MAX, l = 0.0f;
  for (int64_t t0 = j0; t0 <= jend; t0 += RL_ATTN_TILE) {
    const int nt = int(jend - t0 + 1 < RL_ATTN_TILE ? jend - t0 + 1 : RL_ATTN_TILE);
    RL_SYNC();  // the previous tile is consumed
    for (int u = 0; u < nt; ++u) {
      for (int64_t d = RL_TID; d < Dh; d += threads) {
        kt[u * (Dh + 4) + d] = D::load(kb, (t0 + u) * Dh + d);
        vt[u * Dh + d] = D::load(vb, (t0 + u) * Dh + d);
      }
    }
    RL_SYNC();
    const int n = int(j1 - t0 + 1 < RL_ATTN_TILE ? j1 - t0 + 1 : RL_ATTN_TILE);
    if (n <= 0) continue;  // this row's keys ended before the tile (warp-uniform)
    const float s = lane < n ? attn_score_shared(qs, kt + lane * (Dh + 4), Dh, scale) : -RL_FLT_MAX;
    const float mt = max_nan(m, warp_max(s));
    const float alpha = exp_fold(m - mt);
    const float p = exp_fold(s - mt);
    l = l * alpha;
    RL_UNROLL(unroll)
    for (int i = 0; i < RL_ATTN_PER_LANE; ++i) acc[i] = acc[i] * alpha;
    for (int u = 0; u < n; ++u) {
      const float pu = shfl_from(p, u);
      l = l + pu;
      RL_UNROLL(unroll)
      for (int i = 0; i < RL_ATTN_PER_LANE; ++i) {
        const int64_t d = lane + RL_WARP * i;
        if (d < Dh) acc[i] = fma_rn(pu, vt[u * Dh + d], acc[i]);
      }
    }
    m = mt;
  }
  if (!active) return;
  const bool empty = j1 < j0;
  const float r = (empty || attn_bad(m)) ? 0.0f : rcp_pos(l);
  RL_UNROLL(unroll)
  for (int i = 0; i < RL_ATTN_PER_LANE; ++i) {
    const int64_t d = lane + RL_WARP * i;
    if (d < Dh)
      o[row * Dh + d] = empty ? store_out<D>(0.0f) : store_out<D>(attn_bad(m) ? canonical_nan() : acc[i] * r);
  }
  if (lane == 0) {
    stats[2 * row] = attn_stat_m(m);
    stats[2 * row + 1] = canonical(l);
  }
}

// ---- attention backward on the GPU: a warp per query row (dq), a warp per key row (dk, dv) -----------
// Lane u takes key u (dq) or query u (dk, dv) of a tile of 32 and computes that pair's (p, dS); then lane
// d owns the outputs' d, d + 32, ...: per pair in order, one fma_rn each. Grids are (rows of a head,
// head, sequence) and the group size comes from the host, so no index is divided.
constexpr int RL_ATTN_BWD_WARPS = 4;

__device__ __forceinline__ int64_t kv_head_of(int64_t h, int64_t group) {
  int64_t kvh = 0;
  for (int64_t left = h; left >= group; left -= group) ++kvh;
  return kvh;
}

// rowg [B, Hq, Tq, 4]: m, r, Dr, bad (as 0/1), a thread per query row.
template <class D>
__global__ void __launch_bounds__(128) attention_row_grad_kernel(int64_t Hq, int64_t Tq, int64_t Dh,
                                                                  const float* stats, const typename D::storage* o,
                                                                  const typename D::storage* go, float* rowg) {
  const int64_t t = RL_ROW * 128 + RL_TID, h = RL_BLOCK_Y, b = RL_BLOCK_Z;
  if (t >= Tq) return;
  const int64_t row = (b * Hq + h) * Tq + t;
  const RowGrad g = attn_row_grad<D>(stats + 2 * row, o + row * Dh, go + row * Dh, Dh);
  rowg[4 * row] = g.m;
  rowg[4 * row + 1] = g.r;
  rowg[4 * row + 2] = g.dr;
  rowg[4 * row + 3] = g.bad ? 1.0f : 0.0f;
}

__device__ __forceinline__ RowGrad row_grad_at(const float* rowg, int64_t row) {
  return RowGrad{rowg[4 * row], rowg[4 * row + 1], rowg[4 * row + 2], rowg[4 * row + 3] != 0.0f};
}

template <class D>
__global__ void __launch_bounds__(RL_ATTN_BWD_WARPS* RL_WARP) attention_dq_kernel(
    int64_t Hq, int64_t Hkv, int64_t group, int64_t Tq, int64_t Tk, int64_t Dh, const typename D::storage* q,
    const typename D::storage* k, const typename D::storage* v, const typename D::storage* go, const int64_t* q_pos,
    const int64_t* k_start, const float* rowg, float scale, typename D::storage* dq) {
  const int64_t t = RL_ROW * RL_ATTN_BWD_WARPS + warp_id(), h = RL_BLOCK_Y, b = RL_BLOCK_Z;
  if (t >= Tq) return;
  const int lane = lane_id();
  const int64_t row = (b * Hq + h) * Tq + t, kvh = kv_head_of(h, group);
  const typename D::storage* kb = k + (b * Hkv + kvh) * Tk * Dh;
  const typename D::storage* vb = v + (b * Hkv + kvh) * Tk * Dh;
  const RowGrad g = row_grad_at(rowg, row);
  const int64_t j0 = k_start[b], j1 = q_pos[b * Tq + t];
  float acc[RL_ATTN_PER_LANE];
  RL_UNROLL(unroll)
  for (int i = 0; i < RL_ATTN_PER_LANE; ++i) acc[i] = 0.0f;
  for (int64_t t0 = j0; t0 <= j1; t0 += RL_WARP) {
    const int n = int(j1 - t0 + 1 < RL_WARP ? j1 - t0 + 1 : RL_WARP);
    const float ds = lane < n ? attn_pair_grad<D>(q + row * Dh, go + row * Dh, kb + (t0 + lane) * Dh,
                                                  vb + (t0 + lane) * Dh, Dh, scale, g).b
                              : 0.0f;
    for (int u = 0; u < n; ++u) {
      const float du = shfl_from(ds, u);
      RL_UNROLL(unroll)
      for (int i = 0; i < RL_ATTN_PER_LANE; ++i) {
        const int64_t d = lane + RL_WARP * i;
        if (d < Dh) acc[i] = fma_rn(du, D::load(kb, (t0 + u) * Dh + d), acc[i]);
      }
    }
  }
  RL_UNROLL(unroll)
  for (int i = 0; i < RL_ATTN_PER_LANE; ++i) {
    const int64_t d = lane + RL_WARP * i;
    if (d < Dh) dq[row * Dh + d] = store_out<D>(acc[i] * scale);
  }
}

template <class D>
__global__ void __launch_bounds__(RL_ATTN_BWD_WARPS* RL_WARP) attention_dkv_kernel(
    int64_t Hq, int64_t Hkv, int64_t group, int64_t Tq, int64_t Tk, int64_t Dh, const typename D::storage* q,
    const typename D::storage* k, const typename D::storage* v, const typename D::storage* go, const int64_t* q_pos,
    const int64_t* k_start, const float* rowg, float scale, typename D::storage* dk, typename D::storage* dv) {
  const int64_t j = RL_ROW * RL_ATTN_BWD_WARPS + warp_id(), kvh = RL_BLOCK_Y, b = RL_BLOCK_Z;
  if (j >= Tk) return;
  const int lane = lane_id();
  const int64_t kvrow = (b * Hkv + kvh) * Tk + j;
  const typename D::storage* kj = k + kvrow * Dh;
  const typename D::storage* vj = v + kvrow * Dh;
  const bool seen = j >= k_start[b];
  float ak[RL_ATTN_PER_LANE], av[RL_ATTN_PER_LANE];
  RL_UNROLL(unroll)
  for (int i = 0; i < RL_ATTN_PER_LANE; ++i) ak[i] = av[i] = 0.0f;
  for (int64_t g = 0; g < group && seen; ++g) {
    const int64_t h = kvh * group + g;
    for (int64_t i0 = 0; i0 < Tq; i0 += RL_WARP) {
      const int64_t i = i0 + lane;
      const bool mine = i < Tq && j <= q_pos[b * Tq + (i < Tq ? i : 0)];
      const int64_t row = (b * Hq + h) * Tq + i;
      Pair pg{0.0f, 0.0f};
      if (mine) pg = attn_pair_grad<D>(q + row * Dh, go + row * Dh, kj, vj, Dh, scale, row_grad_at(rowg, row));
      const float flag = mine ? 1.0f : 0.0f;
      const int n = int(Tq - i0 < RL_WARP ? Tq - i0 : RL_WARP);
      for (int u = 0; u < n; ++u) {
        const float pu = shfl_from(pg.a, u), du = shfl_from(pg.b, u);
        if (shfl_from(flag, u) == 0.0f) continue;  // the pair is not seen: no term (the same in every lane)
        const int64_t ru = ((b * Hq + h) * Tq + i0 + u) * Dh;
        RL_UNROLL(unroll)
        for (int c = 0; c < RL_ATTN_PER_LANE; ++c) {
          const int64_t d = lane + RL_WARP * c;
          if (d < Dh) {
            ak[c] = fma_rn(du, D::load(q, ru + d), ak[c]);
            av[c] = fma_rn(pu, D::load(go, ru + d), av[c]);
          }
        }
      }
    }
  }
  RL_UNROLL(unroll)
  for (int c = 0; c < RL_ATTN_PER_LANE; ++c) {
    const int64_t d = lane + RL_WARP * c;
    if (d < Dh) {
      dk[kvrow * Dh + d] = store_out<D>(ak[c] * scale);
      dv[kvrow * Dh + d] = store_out<D>(av[c]);
    }
  }
}

#endif  // RL_GPU_COMPILE

}  // namespace rl
