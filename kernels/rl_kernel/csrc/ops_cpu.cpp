// Operator schemas of rl_kernel and their CPU implementations (the golden
// reference). Rows are independent, so running them on several threads does
// not change any bit.
#include <ATen/Parallel.h>
#include <torch/extension.h>

#include "glue.h"

namespace rl {
namespace {

template <class F>
void for_rows(int64_t n, F&& f) {
  at::parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) f(r);
  });
}

inline void put_stats(float* p, RowStats st) {
  p[0] = st.m;
  p[1] = st.s;
  p[2] = st.log_s;
}

inline RowStats get_stats(const float* p) { return RowStats{p[0], p[1], p[2]}; }

at::Tensor row_stats_cpu(const at::Tensor& logits) {
  check_logits(logits, "logits");
  const Rows x = rows_of(logits);
  at::Tensor stats = at::empty({x.n, 3}, logits.options().dtype(at::kFloat));
  float* sp = stats.data_ptr<float>();
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    const auto* base = data_of<D>(x.t);
    for_rows(x.n, [&](int64_t r) { put_stats(sp + 3 * r, cpu_row_stats<D>(base + r * x.stride, x.v)); });
  });
  return stats.view(stats_shape(logits));
}

at::Tensor log_softmax_cpu(const at::Tensor& logits) {
  check_logits(logits, "logits");
  const Rows x = rows_of(logits);
  at::Tensor out = at::empty({x.n, x.v}, logits.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    const auto* base = data_of<D>(x.t);
    for_rows(x.n, [&](int64_t r) { cpu_log_softmax_row<D>(base + r * x.stride, x.v, op + r * x.v); });
  });
  return out.view(logits.sizes());
}

at::Tensor log_softmax_backward_cpu(const at::Tensor& grad_output, const at::Tensor& output) {
  TORCH_CHECK(grad_output.sizes() == output.sizes(), "rl_kernel: grad_output shape ", grad_output.sizes(),
              " must equal output shape ", output.sizes());
  check_same_device(grad_output, output, "grad_output", "output");
  const int64_t v = output.size(-1);
  const at::Tensor g = grad_output.to(at::kFloat).reshape({-1, v}).contiguous();
  const at::Tensor o = output.to(at::kFloat).reshape({-1, v}).contiguous();
  at::Tensor gin = at::empty_like(o);
  const float* gp = g.const_data_ptr<float>();
  const float* opp = o.const_data_ptr<float>();
  float* ip = gin.data_ptr<float>();
  for_rows(o.size(0), [&](int64_t r) { cpu_log_softmax_backward_row(gp + r * v, opp + r * v, v, ip + r * v); });
  return gin.view(output.sizes());
}

std::tuple<at::Tensor, at::Tensor> token_logprobs_cpu(const at::Tensor& logits, const at::Tensor& tokens,
                                                      int64_t ignore_index) {
  check_logits(logits, "logits");
  check_tokens(logits, tokens);
  const Rows x = rows_of(logits);
  const at::Tensor tok = tokens.reshape({-1}).contiguous();
  at::Tensor out = at::empty({x.n}, logits.options().dtype(at::kFloat));
  at::Tensor stats = at::empty({x.n, 3}, logits.options().dtype(at::kFloat));
  const int64_t* tp = tok.const_data_ptr<int64_t>();
  float* op = out.data_ptr<float>();
  float* sp = stats.data_ptr<float>();
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    const auto* base = data_of<D>(x.t);
    for_rows(x.n, [&](int64_t r) {
      const auto* row = base + r * x.stride;
      const RowStats st = cpu_row_stats<D>(row, x.v);
      put_stats(sp + 3 * r, st);
      op[r] = token_logprob<D>(row, x.v, tp[r], ignore_index, st);
    });
  });
  return {out.view(lead_shape(logits)), stats.view(stats_shape(logits))};
}

at::Tensor token_logprobs_backward_cpu(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& tokens,
                                       const at::Tensor& stats, int64_t ignore_index) {
  check_logits(logits, "logits");
  check_tokens(logits, tokens);
  const Rows x = rows_of(logits);
  const at::Tensor g = grad.to(at::kFloat).reshape({-1}).contiguous();
  const at::Tensor tok = tokens.reshape({-1}).contiguous();
  const at::Tensor st = stats.reshape({-1, 3}).contiguous();
  at::Tensor gin = at::empty({x.n, x.v}, logits.options().dtype(at::kFloat));
  const float* gp = g.const_data_ptr<float>();
  const int64_t* tp = tok.const_data_ptr<int64_t>();
  const float* sp = st.const_data_ptr<float>();
  float* ip = gin.data_ptr<float>();
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    const auto* base = data_of<D>(x.t);
    for_rows(x.n, [&](int64_t r) {
      const auto* row = base + r * x.stride;
      const RowStats rs = get_stats(sp + 3 * r);
      const bool ignored = tp[r] == ignore_index;
      for (int64_t i = 0; i < x.v; ++i)
        ip[r * x.v + i] = ignored ? 0.0f : token_logprob_grad(gp[r], logprob(D::load(row, i), rs), i == tp[r]);
    });
  });
  return gin.view(logits.sizes());
}

std::tuple<at::Tensor, at::Tensor> entropy_cpu(const at::Tensor& logits) {
  check_logits(logits, "logits");
  const Rows x = rows_of(logits);
  at::Tensor out = at::empty({x.n}, logits.options().dtype(at::kFloat));
  at::Tensor stats = at::empty({x.n, 3}, logits.options().dtype(at::kFloat));
  float* op = out.data_ptr<float>();
  float* sp = stats.data_ptr<float>();
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    const auto* base = data_of<D>(x.t);
    for_rows(x.n, [&](int64_t r) {
      const auto* row = base + r * x.stride;
      const RowStats st = cpu_row_stats<D>(row, x.v);
      put_stats(sp + 3 * r, st);
      op[r] = cpu_entropy_row<D>(row, x.v, st);
    });
  });
  return {out.view(lead_shape(logits)), stats.view(stats_shape(logits))};
}

at::Tensor entropy_backward_cpu(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& stats,
                                const at::Tensor& entropy) {
  check_logits(logits, "logits");
  const Rows x = rows_of(logits);
  const at::Tensor g = grad.to(at::kFloat).reshape({-1}).contiguous();
  const at::Tensor st = stats.reshape({-1, 3}).contiguous();
  const at::Tensor h = entropy.reshape({-1}).contiguous();
  at::Tensor gin = at::empty({x.n, x.v}, logits.options().dtype(at::kFloat));
  const float* gp = g.const_data_ptr<float>();
  const float* sp = st.const_data_ptr<float>();
  const float* hp = h.const_data_ptr<float>();
  float* ip = gin.data_ptr<float>();
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    const auto* base = data_of<D>(x.t);
    for_rows(x.n, [&](int64_t r) {
      const auto* row = base + r * x.stride;
      const RowStats rs = get_stats(sp + 3 * r);
      for (int64_t i = 0; i < x.v; ++i)
        ip[r * x.v + i] = entropy_grad(gp[r], logprob(D::load(row, i), rs), hp[r]);
    });
  });
  return gin.view(logits.sizes());
}

}  // namespace
}  // namespace rl

TORCH_LIBRARY(rl_kernel, m) {
  m.def("row_stats(Tensor logits) -> Tensor");
  m.def("log_softmax(Tensor logits) -> Tensor");
  m.def("log_softmax_backward(Tensor grad_output, Tensor output) -> Tensor");
  m.def("token_logprobs(Tensor logits, Tensor tokens, int ignore_index) -> (Tensor, Tensor)");
  m.def(
      "token_logprobs_backward(Tensor grad, Tensor logits, Tensor tokens, Tensor stats, int ignore_index) -> "
      "Tensor");
  m.def("entropy(Tensor logits) -> (Tensor, Tensor)");
  m.def("entropy_backward(Tensor grad, Tensor logits, Tensor stats, Tensor entropy) -> Tensor");
}

TORCH_LIBRARY_IMPL(rl_kernel, CPU, m) {
  m.impl("row_stats", &rl::row_stats_cpu);
  m.impl("log_softmax", &rl::log_softmax_cpu);
  m.impl("log_softmax_backward", &rl::log_softmax_backward_cpu);
  m.impl("token_logprobs", &rl::token_logprobs_cpu);
  m.impl("token_logprobs_backward", &rl::token_logprobs_backward_cpu);
  m.impl("entropy", &rl::entropy_cpu);
  m.impl("entropy_backward", &rl::entropy_backward_cpu);
}

// Importing rl_kernel._C registers the operators above.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.attr("__doc__") = "rl_kernel operators (torch.ops.rl_kernel)"; }
