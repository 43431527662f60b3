// The decoder family's SiLU(gate) x up (docs/numerics.md section 11), forward and backward: the contract's
// per-element functions (the CPU executor's, decoder_cpu.cpp) and, beside them, the elementwise GPU kernels.
// No ATen: kernels-check compiles it through decoder_check.cu.
#pragma once

#include "scalar.cuh"

namespace rl {

// ---- SiLU(gate) * up --------------------------------------------------------------------------
RL_HD float silu(float g) { return g * sigmoid(g); }
RL_HD float silu_mul(float g, float u) { return silu(g) * u; }

// d/dgate = (dy * u) * (s + (g * s) * (1 - s)), d/dup = dy * (g * s), s = sigmoid(g).
RL_HD Pair silu_mul_grad(float dy, float g, float u) {
  const float s = sigmoid(g);
  const float gs = g * s;
  return Pair{(dy * u) * (s + gs * (1.0f - s)), dy * gs};
}

// ============================ GPU kernels ====================================
#if defined(RL_GPU_COMPILE)

// ---- elementwise: SiLU x up, a thread per element --------------------------------------------
constexpr int RL_ELEM_THREADS = 256;

__device__ __forceinline__ int64_t elem_index() { return RL_ROW * RL_ELEM_THREADS + RL_TID; }

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

#endif  // RL_GPU_COMPILE

}  // namespace rl
