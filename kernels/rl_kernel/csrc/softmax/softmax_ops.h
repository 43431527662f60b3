// The softmax family's ATen operators, written once for both executors; the
// CPU (softmax_cpu.cpp) and GPU (softmax_gpu.cu) bindings instantiate them.
#pragma once

#include "../common/glue.h"
#include "softmax.cuh"

namespace rl {

inline std::vector<int64_t> stats_shape(const at::Tensor& x) {
  auto s = lead_shape(x);
  s.push_back(3);
  return s;
}

// ---- the operators, written once for both executors -------------------------
// Exec (CpuExec in softmax_cpu.cpp, GpuExec in softmax_gpu.cu) supplies a device guard
// and, per operator, the row loop or kernel launch over raw pointers.

template <class Exec>
at::Tensor row_stats_op(const at::Tensor& logits) {
  check_logits(logits, "logits");
  const typename Exec::Guard guard(logits);
  const Rows x = rows_of(logits);
  at::Tensor stats = at::empty({x.n, 3}, f32_like(logits));
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    Exec::template row_stats<D>(data_of<D>(x.t), x, stats.data_ptr<float>());
  });
  return stats.view(stats_shape(logits));
}

template <class Exec>
at::Tensor log_softmax_op(const at::Tensor& logits) {
  check_logits(logits, "logits");
  const typename Exec::Guard guard(logits);
  const Rows x = rows_of(logits);
  at::Tensor out = at::empty({x.n, x.v}, f32_like(logits));
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    Exec::template log_softmax<D>(data_of<D>(x.t), x, out.data_ptr<float>());
  });
  return out.view(logits.sizes());
}

template <class Exec>
at::Tensor log_softmax_backward_op(const at::Tensor& grad_output, const at::Tensor& output,
                                   at::ScalarType input_dtype) {
  TORCH_CHECK(grad_output.sizes() == output.sizes(), "rl_kernel: grad_output shape ", grad_output.sizes(),
              " must equal output shape ", output.sizes());
  check_same_device(grad_output, output, "grad_output", "output");
  const typename Exec::Guard guard(output);
  const int64_t v = output.size(-1);
  const at::Tensor g = grad_output.to(at::kFloat).reshape({-1, v}).contiguous();
  const at::Tensor o = output.to(at::kFloat).reshape({-1, v}).contiguous();
  at::Tensor gin = at::empty(o.sizes(), o.options().dtype(input_dtype));
  dispatch_dtype(gin, [&](auto d) {
    using O = decltype(d);
    Exec::template log_softmax_backward<O>(g.const_data_ptr<float>(), o.const_data_ptr<float>(), o.size(0), v,
                                           reinterpret_cast<typename O::storage*>(gin.data_ptr()));
  });
  return gin.view(output.sizes());
}

template <class Exec>
std::tuple<at::Tensor, at::Tensor> token_logprobs_op(const at::Tensor& logits, const at::Tensor& tokens,
                                                     int64_t ignore_index) {
  check_logits(logits, "logits");
  check_tokens(logits, tokens);
  const typename Exec::Guard guard(logits);
  const Rows x = rows_of(logits);
  const at::Tensor tok = tokens.reshape({-1}).contiguous();
  at::Tensor out = at::empty({x.n}, f32_like(logits));
  at::Tensor stats = at::empty({x.n, 3}, f32_like(logits));
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    Exec::template token_logprobs<D>(data_of<D>(x.t), x, tok.const_data_ptr<int64_t>(), ignore_index,
                                     out.data_ptr<float>(), stats.data_ptr<float>());
  });
  return {out.view(lead_shape(logits)), stats.view(stats_shape(logits))};
}

template <class Exec>
at::Tensor token_logprobs_backward_op(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& tokens,
                                      const at::Tensor& stats, int64_t ignore_index) {
  check_logits(logits, "logits");
  check_tokens(logits, tokens);
  const typename Exec::Guard guard(logits);
  const Rows x = rows_of(logits);
  const at::Tensor g = grad.to(at::kFloat).reshape({-1}).contiguous();
  const at::Tensor tok = tokens.reshape({-1}).contiguous();
  const at::Tensor st = stats.reshape({-1, 3}).contiguous();
  at::Tensor gin = at::empty({x.n, x.v}, logits.options());
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    Exec::template token_logprobs_backward<D>(g.const_data_ptr<float>(), data_of<D>(x.t), x,
                                              tok.const_data_ptr<int64_t>(), st.const_data_ptr<float>(),
                                              ignore_index, reinterpret_cast<typename D::storage*>(gin.data_ptr()));
  });
  return gin.view(logits.sizes());
}

template <class Exec>
std::tuple<at::Tensor, at::Tensor> entropy_op(const at::Tensor& logits) {
  check_logits(logits, "logits");
  const typename Exec::Guard guard(logits);
  const Rows x = rows_of(logits);
  at::Tensor out = at::empty({x.n}, f32_like(logits));
  at::Tensor stats = at::empty({x.n, 3}, f32_like(logits));
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    Exec::template entropy<D>(data_of<D>(x.t), x, out.data_ptr<float>(), stats.data_ptr<float>());
  });
  return {out.view(lead_shape(logits)), stats.view(stats_shape(logits))};
}

template <class Exec>
at::Tensor entropy_backward_op(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& stats,
                               const at::Tensor& entropy) {
  check_logits(logits, "logits");
  const typename Exec::Guard guard(logits);
  const Rows x = rows_of(logits);
  const at::Tensor g = grad.to(at::kFloat).reshape({-1}).contiguous();
  const at::Tensor st = stats.reshape({-1, 3}).contiguous();
  const at::Tensor h = entropy.reshape({-1}).contiguous();
  at::Tensor gin = at::empty({x.n, x.v}, logits.options());
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    Exec::template entropy_backward<D>(g.const_data_ptr<float>(), data_of<D>(x.t), x, st.const_data_ptr<float>(),
                                       h.const_data_ptr<float>(), reinterpret_cast<typename D::storage*>(gin.data_ptr()));
  });
  return gin.view(logits.sizes());
}

// Registers the family's operators of one executor under m's dispatch key.
template <class Exec>
void impl_softmax(torch::Library& m) {
  impl_ops(m, "row_stats", &row_stats_op<Exec>, "log_softmax", &log_softmax_op<Exec>, "log_softmax_backward",
           &log_softmax_backward_op<Exec>, "token_logprobs", &token_logprobs_op<Exec>, "token_logprobs_backward",
           &token_logprobs_backward_op<Exec>, "entropy", &entropy_op<Exec>, "entropy_backward",
           &entropy_backward_op<Exec>);
}

}  // namespace rl
