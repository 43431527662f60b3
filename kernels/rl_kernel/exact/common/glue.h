// ATen glue shared by every family's CPU and GPU bindings: argument checks with
// clear messages, [..., V] -> [N, V] row views, dtype dispatch, registration.
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include <atomic>
#include <cstdlib>

#include "check.h"
#include "dtypes.h"
#include "launch.h"

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
  RL_CHECK(x.dim() >= 1, "rl_kernel: ", what, " must have at least one dimension (the vocabulary)");
  const auto st = x.scalar_type();
  RL_CHECK(st == at::kFloat || st == at::kBFloat16 || st == at::kHalf, "rl_kernel: ", what,
              " must be float32, bfloat16 or float16, got ", st);
  RL_CHECK(x.size(-1) >= 1, "rl_kernel: ", what, " has an empty vocabulary dimension (size 0)");
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

inline void check_tokens(const at::Tensor& logits, const at::Tensor& tokens) {
  RL_CHECK(tokens.scalar_type() == at::kLong, "rl_kernel: tokens must be int64, got ",
              tokens.scalar_type());
  RL_CHECK(tokens.device() == logits.device(), "rl_kernel: tokens are on ", tokens.device(),
              " but logits are on ", logits.device());
  RL_CHECK(tokens.sizes() == logits.sizes().slice(0, logits.dim() - 1),
              "rl_kernel: tokens shape ", tokens.sizes(), " must equal logits shape without the last dim ",
              logits.sizes().slice(0, logits.dim() - 1));
}

inline void check_same_device(const at::Tensor& a, const at::Tensor& b, const char* an, const char* bn) {
  RL_CHECK(a.device() == b.device(), "rl_kernel: ", an, " is on ", a.device(), " but ", bn, " is on ",
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
    default: RL_CHECK(false, "rl_kernel: unsupported dtype ", x.scalar_type());
  }
}

inline at::TensorOptions f32_like(const at::Tensor& t) { return t.options().dtype(at::kFloat); }

// Registers one executor's kernels under the dispatch key of m:
// impl_ops(m, "name", &fn<Exec>, "other", &other<Exec>, ...).
inline void impl_ops(torch::Library&) {}

template <class F, class... Rest>
void impl_ops(torch::Library& m, const char* name, F fn, Rest... rest) {
  m.impl(name, fn);
  impl_ops(m, rest...);
}

// The cap on rows per GPU launch (launch.h): RL_KERNEL_MAX_ROWS_PER_LAUNCH when the
// library loads, else the default; torch.ops.rl_kernel._set_max_rows_per_launch
// changes it (tests force small caps to prove the split changes no bit).
inline std::atomic<int64_t>& max_rows_per_launch() {
  static std::atomic<int64_t> cap([] {
    const char* s = std::getenv("RL_KERNEL_MAX_ROWS_PER_LAUNCH");
    const long long v = s ? std::atoll(s) : 0;
    return (v > 0 && v <= RL_LIMIT_MAX_ROWS_PER_LAUNCH) ? int64_t(v) : RL_DEFAULT_MAX_ROWS_PER_LAUNCH;
  }());
  return cap;
}

}  // namespace rl
