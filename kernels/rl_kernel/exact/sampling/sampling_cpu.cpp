// The sampling family's schema and its CPU executor (the golden reference): sampling.cuh's per-element
// functions, a row at a time on torch's threads in IEEE mode (common/cpu.h).
#include <torch/extension.h>

#include "../common/cpu.h"
#include "sampling_ops.h"

namespace rl {
namespace {

struct CpuExec {
  struct Guard {
    explicit Guard(const at::Tensor&) {}
  };

  template <class D>
  static void gumbel_argmax(int64_t N, int64_t V, const typename D::storage* x, int64_t ld, int64_t seed,
                            const int64_t* keys, const int64_t* steps, int64_t* out) {
    for_rows(N, [&](int64_t row) {
      const uint64_t base = gumbel_row_base(seed, keys[row], steps[row]);
      float bv = neg_inf();
      int64_t bi = V;
      for (int64_t i = 0; i < V; ++i) {
        const float z = gumbel_score(D::load(x, row * ld + i), base, i);
        if (gumbel_better(z, i, bv, bi)) bv = z, bi = i;
      }
      out[row] = bi;
    });
  }
};

}  // namespace
}  // namespace rl

TORCH_LIBRARY_FRAGMENT(rl_kernel, m) {
  m.def("gumbel_argmax(Tensor scores, Tensor keys, Tensor steps, int seed) -> Tensor");
}

TORCH_LIBRARY_IMPL(rl_kernel, CPU, m) { rl::impl_sampling<rl::CpuExec>(m); }
