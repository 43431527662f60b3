// How a batch of rows is split into kernel launches (docs/numerics.md section 2: rows are
// independent, so the split changes no bit). One block per row; a launch has at most
// max_rows blocks, so that blocks x threads stays below 2^32 on HIP (at most 2^24 - 1
// blocks of 256 threads) and the grid below CUDA's 2^31 - 1. Host arithmetic only,
// compiled into the CPU build too (torch.ops.rl_kernel._launch_plan tests it).
#pragma once

#include <stdint.h>

namespace rl {

constexpr int64_t RL_DEFAULT_MAX_ROWS_PER_LAUNCH = int64_t(1) << 20;
// The largest allowed cap: (2^24 - 1) blocks of 256 threads is below 2^32 threads.
constexpr int64_t RL_LIMIT_MAX_ROWS_PER_LAUNCH = (int64_t(1) << 24) - 1;

// Number of launches for rows rows (0 for none).
inline int64_t launch_count(int64_t rows, int64_t max_rows) {
  return rows <= 0 ? 0 : 1 + (rows - 1) / max_rows;
}

// Launch i (0 <= i < launch_count) covers rows [launch_first_row(i), + launch_rows(i)).
inline int64_t launch_first_row(int64_t i, int64_t max_rows) { return i * max_rows; }

inline int64_t launch_rows(int64_t rows, int64_t max_rows, int64_t i) {
  const int64_t left = rows - i * max_rows;
  return left < max_rows ? left : max_rows;
}

}  // namespace rl
