// The rl_kernel library and the Python module _C. The namespace is declared
// here, once; each family declares its own schemas (TORCH_LIBRARY_FRAGMENT in
// csrc/<family>/<family>_cpu.cpp), so adding a family edits nothing here.
#include <torch/extension.h>

TORCH_LIBRARY(rl_kernel, m) {}

// Importing rl_kernel._C registers every family's operators (static initialisers).
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.attr("__doc__") = "rl_kernel operators (torch.ops.rl_kernel)"; }
