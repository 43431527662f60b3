// Host side of every family's GPU executor (a .cu file includes it once): the mutation build's selector
// copied to the device. The device variable is static in numerics.h, so each .cu file has its own copy
// and its own sync; this header is included inside no namespace and defines everything file-local.
#pragma once

#include <ATen/cuda/CUDAContext.h>

#include <atomic>

#include "numerics.h"

namespace rl {
namespace {

#if defined(RL_MUTATIONS)
#if defined(USE_ROCM)
#define RL_SYMBOL(x) HIP_SYMBOL(x)
#else
#define RL_SYMBOL(x) x
#endif
// The mutation build (rl_kernel.contract.mutations) only: the selector, read once on the host,
// copied to each device before its first launch.
void sync_mutation() {
  static std::atomic<bool> done[64];  // static storage: all false
  int dev = 0;
  C10_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 0 || dev >= 64 || done[dev].load()) return;
  const int m = host_mutation();
  C10_CUDA_CHECK(cudaMemcpyToSymbol(RL_SYMBOL(rl_mutation_device), &m, sizeof m));
  done[dev] = true;
}
#endif

// Called before every launch: a no-op unless built with RL_MUTATIONS.
inline void before_launch() {
#if defined(RL_MUTATIONS)
  sync_mutation();
#endif
}

}  // namespace
}  // namespace rl
