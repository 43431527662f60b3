// The CUDA / HIP executor of the sampling family: sampling.cuh's kernel, one block per row, on the current
// stream. On ROCm, torch's build hipifies this file; the kernel itself is portable.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../common/gpu_host.h"
#include "sampling_ops.h"

namespace rl {
namespace {

struct GpuExec {
  struct Guard {
    explicit Guard(const at::Tensor& t) : g(t.device()) {}
    c10::cuda::CUDAGuard g;
  };

  template <class D>
  static void gumbel_argmax(int64_t N, int64_t V, const typename D::storage* x, int64_t ld, int64_t seed,
                            const int64_t* keys, const int64_t* steps, int64_t* out) {
    for (int64_t i = 0; i < launch_count(N, max_rows_per_launch()); ++i) {
      const int64_t first = launch_first_row(i, max_rows_per_launch());
      const int64_t rows = launch_rows(N, max_rows_per_launch(), i);
      before_launch();
      gumbel_argmax_kernel<D><<<unsigned(rows), RL_SAMPLE_THREADS, 0, at::cuda::getCurrentCUDAStream()>>>(
          V, x + first * ld, ld, seed, keys + first, steps + first, out + first);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  }
};

}  // namespace
}  // namespace rl

TORCH_LIBRARY_IMPL(rl_kernel, CUDA, m) { rl::impl_sampling<rl::GpuExec>(m); }
