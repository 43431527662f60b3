// Instantiates every kernel of the sampling family without ATen, so that `make kernels-check` can compile
// the device code alone for each GPU target and scan its assembly (found by its name).
#if defined(__HIPCC__)
#include <hip/hip_runtime.h>
#else
#include <cuda_runtime.h>
#endif

#include "sampling.cuh"

namespace rl {

#define RL_INSTANTIATE_SAMPLING(D)                                                                         \
  template __global__ void gumbel_argmax_kernel<D>(int64_t, const D::storage*, int64_t, int64_t, const int64_t*, \
                                                   const int64_t*, int64_t*);

RL_INSTANTIATE_SAMPLING(F32)
RL_INSTANTIATE_SAMPLING(BF16)
RL_INSTANTIATE_SAMPLING(F16)

}  // namespace rl
