// CUDA / HIP implementations of the rl_kernel operators. On ROCm, torch's
// build hipifies this file; the kernels themselves (rowops.cuh) are portable.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "glue.h"

namespace rl {
namespace {

constexpr int64_t kMaxGrid = 2147483647;

// One block of RL_LANES threads per row.
dim3 grid_for(int64_t n) {
  TORCH_CHECK(n <= kMaxGrid, "rl_kernel: too many rows for one launch: ", n);
  return dim3(static_cast<unsigned>(n));
}

#define RL_LAUNCH(kernel, n, ...)                                                                     \
  do {                                                                                                \
    if ((n) > 0) {                                                                                    \
      kernel<<<grid_for(n), RL_BLOCK, 0, at::cuda::getCurrentCUDAStream()>>>(__VA_ARGS__);           \
      C10_CUDA_KERNEL_LAUNCH_CHECK();                                                                 \
    }                                                                                                 \
  } while (0)

at::Tensor row_stats_gpu(const at::Tensor& logits) {
  check_logits(logits, "logits");
  const c10::cuda::CUDAGuard guard(logits.device());
  const Rows x = rows_of(logits);
  at::Tensor stats = at::empty({x.n, 3}, logits.options().dtype(at::kFloat));
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    RL_LAUNCH(row_stats_kernel<D>, x.n, data_of<D>(x.t), x.stride, x.v, stats.data_ptr<float>());
  });
  return stats.view(stats_shape(logits));
}

at::Tensor log_softmax_gpu(const at::Tensor& logits) {
  check_logits(logits, "logits");
  const c10::cuda::CUDAGuard guard(logits.device());
  const Rows x = rows_of(logits);
  at::Tensor out = at::empty({x.n, x.v}, logits.options().dtype(at::kFloat));
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    RL_LAUNCH(log_softmax_kernel<D>, x.n, data_of<D>(x.t), x.stride, x.v, out.data_ptr<float>());
  });
  return out.view(logits.sizes());
}

at::Tensor log_softmax_backward_gpu(const at::Tensor& grad_output, const at::Tensor& output) {
  TORCH_CHECK(grad_output.sizes() == output.sizes(), "rl_kernel: grad_output shape ", grad_output.sizes(),
              " must equal output shape ", output.sizes());
  check_same_device(grad_output, output, "grad_output", "output");
  const c10::cuda::CUDAGuard guard(output.device());
  const int64_t v = output.size(-1);
  const at::Tensor g = grad_output.to(at::kFloat).reshape({-1, v}).contiguous();
  const at::Tensor o = output.to(at::kFloat).reshape({-1, v}).contiguous();
  at::Tensor gin = at::empty_like(o);
  RL_LAUNCH(log_softmax_backward_kernel, o.size(0), g.const_data_ptr<float>(), o.const_data_ptr<float>(), v,
            gin.data_ptr<float>());
  return gin.view(output.sizes());
}

std::tuple<at::Tensor, at::Tensor> token_logprobs_gpu(const at::Tensor& logits, const at::Tensor& tokens,
                                                      int64_t ignore_index) {
  check_logits(logits, "logits");
  check_tokens(logits, tokens);
  const c10::cuda::CUDAGuard guard(logits.device());
  const Rows x = rows_of(logits);
  const at::Tensor tok = tokens.reshape({-1}).contiguous();
  at::Tensor out = at::empty({x.n}, logits.options().dtype(at::kFloat));
  at::Tensor stats = at::empty({x.n, 3}, logits.options().dtype(at::kFloat));
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    RL_LAUNCH(token_logprobs_kernel<D>, x.n, data_of<D>(x.t), x.stride, x.v, tok.const_data_ptr<int64_t>(),
              ignore_index, out.data_ptr<float>(), stats.data_ptr<float>());
  });
  return {out.view(lead_shape(logits)), stats.view(stats_shape(logits))};
}

at::Tensor token_logprobs_backward_gpu(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& tokens,
                                       const at::Tensor& stats, int64_t ignore_index) {
  check_logits(logits, "logits");
  check_tokens(logits, tokens);
  const c10::cuda::CUDAGuard guard(logits.device());
  const Rows x = rows_of(logits);
  const at::Tensor g = grad.to(at::kFloat).reshape({-1}).contiguous();
  const at::Tensor tok = tokens.reshape({-1}).contiguous();
  const at::Tensor st = stats.reshape({-1, 3}).contiguous();
  at::Tensor gin = at::empty({x.n, x.v}, logits.options().dtype(at::kFloat));
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    RL_LAUNCH(token_logprobs_backward_kernel<D>, x.n, g.const_data_ptr<float>(), data_of<D>(x.t), x.stride, x.v,
              tok.const_data_ptr<int64_t>(), st.const_data_ptr<float>(), ignore_index, gin.data_ptr<float>());
  });
  return gin.view(logits.sizes());
}

std::tuple<at::Tensor, at::Tensor> entropy_gpu(const at::Tensor& logits) {
  check_logits(logits, "logits");
  const c10::cuda::CUDAGuard guard(logits.device());
  const Rows x = rows_of(logits);
  at::Tensor out = at::empty({x.n}, logits.options().dtype(at::kFloat));
  at::Tensor stats = at::empty({x.n, 3}, logits.options().dtype(at::kFloat));
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    RL_LAUNCH(entropy_kernel<D>, x.n, data_of<D>(x.t), x.stride, x.v, out.data_ptr<float>(),
              stats.data_ptr<float>());
  });
  return {out.view(lead_shape(logits)), stats.view(stats_shape(logits))};
}

at::Tensor entropy_backward_gpu(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& stats,
                                const at::Tensor& entropy) {
  check_logits(logits, "logits");
  const c10::cuda::CUDAGuard guard(logits.device());
  const Rows x = rows_of(logits);
  const at::Tensor g = grad.to(at::kFloat).reshape({-1}).contiguous();
  const at::Tensor st = stats.reshape({-1, 3}).contiguous();
  const at::Tensor h = entropy.reshape({-1}).contiguous();
  at::Tensor gin = at::empty({x.n, x.v}, logits.options().dtype(at::kFloat));
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    RL_LAUNCH(entropy_backward_kernel<D>, x.n, g.const_data_ptr<float>(), data_of<D>(x.t), x.stride, x.v,
              st.const_data_ptr<float>(), h.const_data_ptr<float>(), gin.data_ptr<float>());
  });
  return gin.view(logits.sizes());
}

}  // namespace
}  // namespace rl

TORCH_LIBRARY_IMPL(rl_kernel, CUDA, m) {
  m.impl("row_stats", &rl::row_stats_gpu);
  m.impl("log_softmax", &rl::log_softmax_gpu);
  m.impl("log_softmax_backward", &rl::log_softmax_backward_gpu);
  m.impl("token_logprobs", &rl::token_logprobs_gpu);
  m.impl("token_logprobs_backward", &rl::token_logprobs_backward_gpu);
  m.impl("entropy", &rl::entropy_gpu);
  m.impl("entropy_backward", &rl::entropy_backward_gpu);
}
