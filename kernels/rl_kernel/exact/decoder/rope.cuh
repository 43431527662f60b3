// The decoder family's rotary embedding (docs/numerics.md section 11): the cos/sin table and the rotation
// of pairs, as the contract's per-element functions (the CPU executor's, decoder_cpu.cpp) and, beside them,
// the GPU kernels. No ATen: kernels-check compiles it through decoder_check.cu.
#pragma once

#include "scalar.cuh"

namespace rl {

// ---- rotary embedding -------------------------------------------------------------------------
// The table: angle = float(position) * inv_freq, then the contract's sin_cos.
RL_HD SinCos rope_angle(int64_t pos, float inv_freq) { return sin_cos(float(pos) * inv_freq); }

// Pairs (x1, x2) = (x_i, x_{i + D/2}) (Hugging Face's rotate_half): (x1*c - x2*s, x2*c + x1*s).
RL_HD Pair rotate(float x1, float x2, float c, float s) { return Pair{x1 * c - x2 * s, x2 * c + x1 * s}; }

// ============================ GPU kernels ====================================
#if defined(RL_GPU_COMPILE)

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

#endif  // RL_GPU_COMPILE

}  // namespace rl
