// The decoder family's RMSNorm (docs/numerics.md section 11), forward and backward: the contract's per-row
// functions (the CPU executor's, decoder_cpu.cpp) and, beside them, the GPU kernels that compute the same
// functions in the same order. No ATen: kernels-check compiles it through decoder_check.cu.
#pragma once

#include "../common/reduce.h"
#include "scalar.cuh"

namespace rl {

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

// ============================ GPU kernels ====================================
#if defined(RL_GPU_COMPILE)

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

#endif  // RL_GPU_COMPILE

}  // namespace rl
