// Instantiates every kernel of the decoder family without ATen, so that `make kernels-check` can
// compile the device code alone for each GPU target and scan its assembly (found by its name).
#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#else
#include <cuda_runtime.h>
#endif

#include "decoder.cuh"

namespace rl {

#define RL_INSTANTIATE_DECODER(D)                                                                               \
  template __global__ void linear_kernel<D>(int64_t, int64_t, int64_t, const D::storage*, int64_t,              \
                                            const D::storage*, const D::storage*, D::storage*);                 \
  template __global__ void linear_skinny_kernel<D, true>(int64_t, int64_t, int64_t, const D::storage*, int64_t, \
                                                         const D::storage*, const D::storage*, D::storage*);    \
  template __global__ void linear_skinny_kernel<D, false>(int64_t, int64_t, int64_t, const D::storage*, int64_t, \
                                                          const D::storage*, const D::storage*, D::storage*);   \
  template __global__ void rms_norm_kernel<D>(int64_t, const D::storage*, const D::storage*, float, float,      \
                                              D::storage*, float*);                                             \
  template __global__ void rms_norm_backward_kernel<D>(int64_t, const D::storage*, const D::storage*,           \
                                                       const D::storage*, const float*, float, D::storage*);    \
  template __global__ void rms_norm_weight_grad_kernel<D>(int64_t, int64_t, const D::storage*, const D::storage*, \
                                                          const float*, D::storage*);                           \
  template __global__ void rotary_kernel<D>(int64_t, int64_t, int64_t, const D::storage*, const float*,         \
                                            const float*, D::storage*);                                         \
  template __global__ void silu_mul_kernel<D>(int64_t, const D::storage*, const D::storage*, D::storage*);      \
  template __global__ void silu_mul_backward_kernel<D>(int64_t, const D::storage*, const D::storage*,           \
                                                       const D::storage*, D::storage*, D::storage*);            \
  template __global__ void attention_kernel<D>(int64_t, int64_t, int64_t, int64_t, int64_t, int, int,           \
                                               const D::storage*, const D::storage*, const D::storage*,         \
                                               const int64_t*, const int64_t*, float, int64_t, const float*,    \
                                               D::storage*, float*);                                            \
  template __global__ void attention_row_grad_kernel<D>(int64_t, int64_t, int64_t, const float*, const D::storage*, \
                                                        const D::storage*, float*);                             \
  template __global__ void attention_sink_terms_kernel<D>(int64_t, int64_t, int64_t, const float*,               \
                                                          const D::storage*, const D::storage*, const float*,   \
                                                          float*);                                              \
  template __global__ void attention_dq_kernel<D>(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,          \
                                                  const D::storage*,                                            \
                                                  const D::storage*, const D::storage*, const D::storage*,      \
                                                  const int64_t*, const int64_t*, const float*, float, int64_t,  \
                                                  D::storage*);                                                 \
  template __global__ void attention_dkv_kernel<D>(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,         \
                                                   const D::storage*,                                           \
                                                   const D::storage*, const D::storage*, const D::storage*,     \
                                                   const int64_t*, const int64_t*, const float*, float, int64_t, \
                                                   D::storage*, D::storage*);

RL_INSTANTIATE_DECODER(F32)
RL_INSTANTIATE_DECODER(BF16)
RL_INSTANTIATE_DECODER(F16)

}  // namespace rl
