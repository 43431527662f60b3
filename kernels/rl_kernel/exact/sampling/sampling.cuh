// The sampling family (docs/numerics.md section 12): a seeded Gumbel-max draw that picks the same token
// on every device. The noise of element i of a row is a pure function of (seed, the row's key, step, i)
// (a counter-based hash, no generator state) and the contract's log; the draw is the lowest index of the
// largest score + noise, a choice no reduction order can change. The per-element function is used by the
// CPU executor (sampling_cpu.cpp); the GPU kernel beside it computes the same thing (sampling_gpu.cu).
// No ATen here: kernels-check compiles this file alone (sampling_check.cu) for every GPU target.
#pragma once

#include "../common/dtypes.h"
#include "../common/gpu.h"
#include "../common/numerics.h"

namespace rl {

constexpr uint64_t RL_GOLDEN64 = 0x9e3779b97f4a7c15ull;

// splitmix64's finaliser: a bijection of 64-bit words whose output bits all depend on every input bit.
RL_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The row's stream: seed, then the row's key (a sequence id), then the step, each mixed in.
RL_HD uint64_t gumbel_row_base(int64_t seed, int64_t key, int64_t step) {
  return mix64(mix64(mix64(uint64_t(seed) + RL_GOLDEN64) ^ uint64_t(key)) ^ uint64_t(step));
}

// Gumbel noise -log(-log(u)) of element i, u = (2m + 1) / 2^24 with m the hash's top 23 bits: u is exact in
// binary32 and lies in [2^-24, 1 - 2^-24], so both logs take normal positive arguments (log_pos).
RL_HD float gumbel_noise(uint64_t base, int64_t i) {
  const uint64_t h = mix64(base ^ (uint64_t(i) * RL_GOLDEN64));
  const float u = float(uint32_t((h >> 41) * 2u + 1u)) * 0x1p-24f;
  return -log_pos(-log_pos(u));
}

// The perturbed score: score + noise, one rounding; a NaN score counts as -inf (never drawn unless every
// score of the row is NaN or -inf, when the draw is the lowest such index).
RL_HD float gumbel_score(float score, uint64_t base, int64_t i) {
  const float z = score + gumbel_noise(base, i);
  return z != z ? neg_inf() : z;
}

// Whether (v, i) beats the best (bv, bi) so far: a larger value, or the same value at a lower index. It is a
// total order on the pairs, so any grouping of the comparisons gives the same winner.
RL_HD bool gumbel_better(float v, int64_t i, float bv, int64_t bi) { return v > bv || (v == bv && i < bi); }

#if defined(__CUDACC__) || defined(__HIPCC__)
constexpr int RL_SAMPLE_THREADS = 256;

// One block per row of scores [N, V] (row stride ld); out[row] = the drawn index.
template <class D>
__global__ void __launch_bounds__(RL_SAMPLE_THREADS) gumbel_argmax_kernel(int64_t V, const typename D::storage* x,
                                                                          int64_t ld, int64_t seed,
                                                                          const int64_t* keys, const int64_t* steps,
                                                                          int64_t* out) {
  __shared__ float best_v[RL_SAMPLE_THREADS];
  __shared__ int64_t best_i[RL_SAMPLE_THREADS];
  const int64_t row = RL_ROW;
  const int tid = RL_TID;
  const uint64_t base = gumbel_row_base(seed, keys[row], steps[row]);
  float bv = neg_inf();
  int64_t bi = V;
  for (int64_t i = tid; i < V; i += RL_SAMPLE_THREADS) {
    const float z = gumbel_score(D::load(x, row * ld + i), base, i);
    if (gumbel_better(z, i, bv, bi)) bv = z, bi = i;
  }
  best_v[tid] = bv;
  best_i[tid] = bi;
  RL_SYNC();
  for (int s = RL_SAMPLE_THREADS / 2; s > 0; s >>= 1) {
    if (tid < s && gumbel_better(best_v[tid + s], best_i[tid + s], best_v[tid], best_i[tid])) {
      best_v[tid] = best_v[tid + s];
      best_i[tid] = best_i[tid + s];
    }
    RL_SYNC();
  }
  if (tid == 0) out[row] = best_i[0];
}
#endif

}  // namespace rl
