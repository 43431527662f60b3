// Instantiates every kernel of the softmax family without ATen, so that
// `make kernels-check` can compile the device code alone for each GPU target
// (as CUDA with nvcc, or as HIP with clang -x hip) and scan its assembly.
// kernels_check.py finds this file by its name (csrc/*/*_check.cu).
#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#else
#include <cuda_runtime.h>
#endif

#include "softmax.cuh"

namespace rl {

#define RL_INSTANTIATE_SOFTMAX(D)                                                                                \
  template __global__ void row_stats_kernel<D>(int64_t, const D::storage*, int64_t, int64_t, float*);            \
  template __global__ void log_softmax_kernel<D>(int64_t, const D::storage*, int64_t, int64_t, float*);          \
  template __global__ void token_logprobs_kernel<D>(int64_t, const D::storage*, int64_t, int64_t, const int64_t*, \
                                                    int64_t, float*, float*);                            \
  template __global__ void entropy_kernel<D>(int64_t, const D::storage*, int64_t, int64_t, float*, float*);      \
  template __global__ void token_logprobs_backward_kernel<D>(int64_t, const float*, const D::storage*, int64_t,   \
                                                             int64_t, const int64_t*, const float*,     \
                                                             int64_t, D::storage*);                     \
  template __global__ void entropy_backward_kernel<D>(int64_t, const float*, const D::storage*, int64_t, int64_t, \
                                                      const float*, const float*, D::storage*);     \
  template __global__ void log_softmax_backward_kernel<D>(int64_t, const float*, const float*, int64_t, D::storage*); \
  template __global__ void node_stats_kernel<D>(int64_t, const D::storage*, int64_t, int64_t, int64_t, NodeList, \
                                                float*);                                                        \
  template __global__ void node_entropy_kernel<D>(int64_t, const D::storage*, int64_t, int64_t, int64_t,         \
                                                  NodeList, const float*, float*);                              \
  template __global__ void slice_stats_kernel<D>(int64_t, const D::storage*, int64_t, int64_t, int64_t, int64_t,  \
                                                 float*);                                                       \
  template __global__ void slice_entropy_kernel<D>(int64_t, const D::storage*, int64_t, int64_t, int64_t,        \
                                                   int64_t, const float*, float*);                              \
  template __global__ void slice_stats_warp_kernel<D>(int64_t, int64_t, const D::storage*, int64_t, int64_t,    \
                                                      int64_t, int64_t, float*);                                 \
  template __global__ void slice_entropy_warp_kernel<D>(int64_t, int64_t, const D::storage*, int64_t, int64_t,  \
                                                        int64_t, int64_t, const float*, float*);                 \
  template __global__ void join_parts_token_kernel<D>(int64_t, const float*, int64_t, int, const D::storage*,     \
                                                      int64_t, int64_t, const int64_t*, int64_t, float*, float*);  \
  template __global__ void token_logprobs_backward_slice_kernel<D>(int64_t, const float*, const D::storage*,     \
                                                                   int64_t, int64_t, int64_t, const int64_t*,    \
                                                                   const float*, int64_t, D::storage*);          \
  template __global__ void entropy_backward_slice_kernel<D>(int64_t, const float*, const D::storage*, int64_t,   \
                                                            int64_t, int64_t, const float*, const float*,        \
                                                            D::storage*);                                        \
  template __global__ void logprobs_entropy_backward_slice_kernel<D>(                                             \
      int64_t, const float*, const float*, const D::storage*, int64_t, int64_t, int64_t, const int64_t*,          \
      const float*, const float*, int64_t, D::storage*);

RL_INSTANTIATE_SOFTMAX(F32)
RL_INSTANTIATE_SOFTMAX(BF16)
RL_INSTANTIATE_SOFTMAX(F16)

}  // namespace rl
