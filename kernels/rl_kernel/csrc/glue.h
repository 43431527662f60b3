// ATen glue shared by the CPU and GPU bindings: argument checks with clear
// messages, [..., V] -> [N, V] row views, dtype dispatch.
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include "rowops.cuh"

namespace rl {

// Rows of a [..., V] tensor as a [N, V] view whose last dimension has stride 1.
// Views that cannot be flattened are copied (a copy is exact).
struct Rows {
  at::Tensor t;
  int64_t n;
  int64_t v;
  int64_t stride;
};

inline void check_logits(const at::Tensor& x, const char* what) {
  TORCH_CHECK(x.dim() >= 1, "rl_kernel: ", what, " must have at least one dimension (the vocabulary)");
  const auto st = x.scalar_type();
  TORCH_CHECK(st == at::kFloat || st == at::kBFloat16 || st == at::kHalf, "rl_kernel: ", what,
              " must be float32, bfloat16 or float16, got ", st);
  TORCH_CHECK(x.size(-1) >= 1, "rl_kernel: ", what, " has an empty vocabulary dimension (size 0)");
}

inline Rows rows_of(const at::Tensor& x) {
  const int64_t v = x.size(-1);
  at::Tensor t = x.reshape({-1, v});
  if (t.stride(1) != 1 || (t.size(0) > 1 && t.stride(0) < v)) t = t.contiguous();
  return Rows{t, t.size(0), v, t.size(0) > 1 ? t.stride(0) : v};
}

// Leading shape of [..., V], for shaping per-row outputs.
inline std::vector<int64_t> lead_shape(const at::Tensor& x) {
  auto s = x.sizes().vec();
  s.pop_back();
  return s;
}

inline std::vector<int64_t> stats_shape(const at::Tensor& x) {
  auto s = lead_shape(x);
  s.push_back(3);
  return s;
}

inline void check_tokens(const at::Tensor& logits, const at::Tensor& tokens) {
  TORCH_CHECK(tokens.scalar_type() == at::kLong, "rl_kernel: tokens must be int64, got ",
              tokens.scalar_type());
  TORCH_CHECK(tokens.device() == logits.device(), "rl_kernel: tokens are on ", tokens.device(),
              " but logits are on ", logits.device());
  TORCH_CHECK(tokens.sizes() == logits.sizes().slice(0, logits.dim() - 1),
              "rl_kernel: tokens shape ", tokens.sizes(), " must equal logits shape without the last dim ",
              logits.sizes().slice(0, logits.dim() - 1));
}

inline void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* an, const char* bn) {
  TORCH_CHECK(a.device() == b.device(), "rl_kernel: ", an, " is on ", a.device(), " but ", bn, " is on ",
              b.device());
}

template <class D>
inline const typename D::storage* data_of(const at::Tensor& t) {
  return reinterpret_cast<const typename D::storage*>(t.const_data_ptr());
}

// Calls f(D{}) with D the element type of x (use: [&](auto d) { using D = decltype(d); }).
template <class F>
inline void dispatch_dtype(const at::Tensor& x, F&& f) {
  switch (x.scalar_type()) {
    case at::kFloat: f(F32{}); break;
    case at::kBFloat16: f(BF16{}); break;
    case at::kHalf: f(F16{}); break;
    default: TORCH_CHECK(false, "rl_kernel: unsupported dtype ", x.scalar_type());
  }
}

inline at::TensorOptions f32_like(const at::Tensor& t) { return t.options().dtype(at::kFloat); }

// ---- the operators, written once for both executors -------------------------
// Exec (CpuExec in ops_cpu.cpp, GpuExec in ops_gpu.cu) supplies a device guard
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

// Registers the operators of one executor under a dispatch key.
#define RL_REGISTER_OPS(m, Exec)                                        \
  m.impl("row_stats", &rl::row_stats_op<Exec>);                         \
  m.impl("log_softmax", &rl::log_softmax_op<Exec>);                     \
  m.impl("log_softmax_backward", &rl::log_softmax_backward_op<Exec>);   \
  m.impl("token_logprobs", &rl::token_logprobs_op<Exec>);               \
  m.impl("token_logprobs_backward", &rl::token_logprobs_backward_op<Exec>); \
  m.impl("entropy", &rl::entropy_op<Exec>);                             \
  m.impl("entropy_backward", &rl::entropy_backward_op<Exec>)

}  // namespace rl
