// The CUDA / HIP executor of the softmax family: one block of RL_LANES threads
// per row. On ROCm, torch's build hipifies this file; the kernels themselves
// (softmax.cuh) are portable.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "softmax_ops.h"

namespace rl {
namespace {

template <class Kernel, class... Args>
void launch(Kernel kernel, int64_t rows, Args... args) {
  if (rows == 0) return;
  TORCH_CHECK(rows <= 2147483647, "rl_kernel: too many rows for one launch: ", rows);
  kernel<<<dim3(static_cast<unsigned>(rows)), RL_BLOCK, 0, at::cuda::getCurrentCUDAStream()>>>(args...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

struct GpuExec {
  struct Guard {
    explicit Guard(const at::Tensor& t) : g(t.device()) {}
    c10::cuda::CUDAGuard g;
  };

  template <class D>
  static void row_stats(const typename D::storage* x, const Rows& r, float* stats) {
    launch(row_stats_kernel<D>, r.n, x, r.stride, r.v, stats);
  }

  template <class D>
  static void log_softmax(const typename D::storage* x, const Rows& r, float* out) {
    launch(log_softmax_kernel<D>, r.n, x, r.stride, r.v, out);
  }

  template <class O>
  static void log_softmax_backward(const float* g, const float* out, int64_t n, int64_t v,
                                   typename O::storage* gin) {
    launch(log_softmax_backward_kernel<O>, n, g, out, v, gin);
  }

  template <class D>
  static void token_logprobs(const typename D::storage* x, const Rows& r, const int64_t* tok, int64_t ignore,
                             float* out, float* stats) {
    launch(token_logprobs_kernel<D>, r.n, x, r.stride, r.v, tok, ignore, out, stats);
  }

  template <class D>
  static void token_logprobs_backward(const float* g, const typename D::storage* x, const Rows& r,
                                      const int64_t* tok, const float* stats, int64_t ignore,
                                      typename D::storage* gin) {
    launch(token_logprobs_backward_kernel<D>, r.n, g, x, r.stride, r.v, tok, stats, ignore, gin);
  }

  template <class D>
  static void entropy(const typename D::storage* x, const Rows& r, float* out, float* stats) {
    launch(entropy_kernel<D>, r.n, x, r.stride, r.v, out, stats);
  }

  template <class D>
  static void entropy_backward(const float* g, const typename D::storage* x, const Rows& r, const float* stats,
                               const float* H, typename D::storage* gin) {
    launch(entropy_backward_kernel<D>, r.n, g, x, r.stride, r.v, stats, H, gin);
  }
};

}  // namespace
}  // namespace rl

TORCH_LIBRARY_IMPL(rl_kernel, CUDA, m) { rl::impl_softmax<rl::GpuExec>(m); }
