// The sampling family's operator for one executor (CpuExec in sampling_cpu.cpp, GpuExec in sampling_gpu.cu):
// argument checks with clear messages, the output and dtype dispatch. The arithmetic is sampling.cuh's.
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include <utility>

#include "../common/glue.h"
#include "sampling.cuh"

namespace rl {

template <class Exec>
at::Tensor gumbel_argmax_op(const at::Tensor& scores, const at::Tensor& keys, const at::Tensor& steps, int64_t seed) {
  check_logits(scores, "scores");
  for (const auto& [t, what] : {std::pair<const at::Tensor&, const char*>{keys, "keys"}, {steps, "steps"}}) {
    RL_CHECK(t.scalar_type() == at::kLong, "rl_kernel: ", what, " must be int64, got ", t.scalar_type());
    check_same_device(t, scores, what, "scores");
    RL_CHECK(t.sizes() == scores.sizes().slice(0, scores.dim() - 1), "rl_kernel: ", what, " shape ", t.sizes(),
                " must equal scores shape without the last dim ", scores.sizes().slice(0, scores.dim() - 1));
  }
  const typename Exec::Guard guard(scores);
  const Rows r = rows_of(scores);
  const at::Tensor k = keys.contiguous(), st = steps.contiguous();
  at::Tensor out = at::empty(lead_shape(scores), keys.options());
  dispatch_dtype(scores, [&](auto d) {
    using D = decltype(d);
    Exec::template gumbel_argmax<D>(r.n, r.v, data_of<D>(r.t), r.stride, seed, k.const_data_ptr<int64_t>(), st.const_data_ptr<int64_t>(),
                                    out.data_ptr<int64_t>());
  });
  return out;
}

template <class Exec>
void impl_sampling(torch::Library& m) {
  impl_ops(m, "gumbel_argmax", &gumbel_argmax_op<Exec>);
}

}  // namespace rl
