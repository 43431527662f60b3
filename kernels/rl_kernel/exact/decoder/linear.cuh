// The decoder family's linear (docs/numerics.md section 11): the contract's per-element chain (the CPU
// executor's, decoder_cpu.cpp) and, beside it, the GPU kernels that compute the same chain (a tiled one and
// one for few rows). No ATen: kernels-check compiles it through decoder_check.cu.
#pragma once

#include "scalar.cuh"

namespace rl {

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

#endif  // RL_GPU_COMPILE

}  // namespace rl
