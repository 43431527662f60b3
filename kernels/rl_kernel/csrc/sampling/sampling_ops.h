// The sampling family's operator for one executor (CpuExec in sampling_cpu.cpp, GpuExec in sampling_gpu.cu):
// argument checks with clear messages, the output and dtype dispatch. The arithmetic is sampling.cuh's.
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include "../common/glue.h"
#include "sampling.cuh"

namespace rl {

template <class Exec>
at::Tensor gumbel_argmax_op(const at::Tensor& scores, const at::Tensor& keys, int64_t seed, int64_t step) {
  check_logits(scores, "scores");
  TORCH_CHECK(keys.scalar_type() == at::kLong, "rl_kernel: keys must be int64, got ", keys.scalar_type());
  check_same_device(keys, scores, "keys", "scores");
  TORCH_CHECK(keys.sizes() == scores.sizes().slice(0, scores.dim() - 1), "rl_kernel: keys shape ", keys.sizes(),
              " must equal scores shape without the last dim ", scores.sizes().slice(0, scores.dim() - 1));
  const typename Exec::Guard guard(scores);
  const Rows r = rows_of(scores);
  const at::Tensor k = keys.contiguous();
  at::Tensor out = at::empty(lead_shape(scores), keys.options());
  dispatch_dtype(scores, [&](auto d) {
    using D = decltype(d);
    Exec::template gumbel_argmax<D>(r.n, r.v, data_of<D>(r.t), r.stride, seed, k.const_data_ptr<int64_t>(), step,
                                    out.data_ptr<int64_t>());
  });
  return out;
}

template <class Exec>
void impl_sampling(torch::Library& m) {
  impl_ops(m, "gumbel_argmax", &gumbel_argmax_op<Exec>);
}

}  // namespace rl
