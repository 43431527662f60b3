// The rl_kernel library and the Python module _C. The namespace is declared
// here, once; each family declares its own schemas (TORCH_LIBRARY_FRAGMENT in
// csrc/<family>/<family>_cpu.cpp), so adding a family edits nothing here.
#include <torch/extension.h>

#include "glue.h"

namespace {

// Sets the cap on rows per GPU launch (n <= 0: the default) and returns the previous
// one. A no-op for the CPU executor, which has no launches.
int64_t set_max_rows_per_launch(int64_t n) {
  RL_CHECK(n <= rl::RL_LIMIT_MAX_ROWS_PER_LAUNCH, "rl_kernel: at most ", rl::RL_LIMIT_MAX_ROWS_PER_LAUNCH,
              " rows per launch, got ", n);
  return rl::max_rows_per_launch().exchange(n > 0 ? n : rl::RL_DEFAULT_MAX_ROWS_PER_LAUNCH);
}

// [first row, rows] of each launch for rows rows under the cap max_rows (launch.h).
std::vector<int64_t> launch_plan(int64_t rows, int64_t max_rows) {
  RL_CHECK(max_rows > 0, "rl_kernel: max_rows must be positive");
  std::vector<int64_t> plan;
  for (int64_t i = 0; i < rl::launch_count(rows, max_rows); ++i) {
    plan.push_back(rl::launch_first_row(i, max_rows));
    plan.push_back(rl::launch_rows(rows, max_rows, i));
  }
  return plan;
}

}  // namespace

// Private operators (a leading underscore), registered for every backend.
TORCH_LIBRARY(rl_kernel, m) {
  m.def("_set_max_rows_per_launch(int n) -> int", &set_max_rows_per_launch);
  m.def("_launch_plan(int rows, int max_rows) -> int[]", &launch_plan);
}

// Importing rl_kernel._C registers every family's operators (static initialisers).
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.attr("__doc__") = "rl_kernel operators (torch.ops.rl_kernel)"; }
