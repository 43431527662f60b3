// The CUDA / HIP executor of the softmax family: one block of RL_BLOCK threads
// per row. On ROCm, torch's build hipifies this file; the kernels themselves
// (softmax.cuh) are portable.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../common/gpu_host.h"
#include "softmax_ops.h"

namespace rl {
namespace {


// Rows in launches of at most max_rows_per_launch() rows (launch.h), `nodes` per row (the grid's y):
// issue(first, n, grid_y) launches rows first .. first + n - 1.
template <class Issue>
void for_each_launch(int64_t rows, int64_t nodes, Issue&& issue) {
  if (rows == 0 || nodes == 0) return;
  RL_CHECK(nodes <= 65535, "rl_kernel: ", nodes, " nodes per row (at most 65535)");
#if defined(RL_MUTATIONS)
  sync_mutation();
#endif
  const int64_t cap = max_rows_per_launch().load();
  for (int64_t i = 0; i < launch_count(rows, cap); ++i) {
    const int64_t first = launch_first_row(i, cap);
    issue(first, rows - first < cap ? rows - first : cap, static_cast<unsigned>(nodes));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
}

// One block per row (per node of a row: the grid's y); the kernel gets its launch's first row as row0.
template <class Kernel, class... Args>
void launch_nodes(Kernel kernel, int64_t rows, int64_t nodes, Args... args) {
  for_each_launch(rows, nodes, [&](int64_t first, int64_t n, unsigned y) {
    kernel<<<dim3(static_cast<unsigned>(n), y), RL_BLOCK, 0, at::cuda::getCurrentCUDAStream()>>>(first, args...);
  });
}

template <class Kernel, class... Args>
void launch(Kernel kernel, int64_t rows, Args... args) {
  launch_nodes(kernel, rows, 1, args...);
}

// The node lists, copied to the device (a few dozen int64 each) from pinned memory on the current stream:
// a copy from pageable memory would make the host wait for the GPU at every join. The caching host
// allocator keeps the pinned block until the copy has run.
at::Tensor device_ints(at::IntArrayRef v, const at::Device& dev) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong)).pin_memory().to(at::TensorOptions().device(dev),
                                                                              /*non_blocking=*/true);
}

// One thread (rows_per_block = RL_BLOCK) or one warp (RL_WARPS) per row; the kernel gets the row count.
template <class Kernel, class... Args>
void launch_rows(Kernel kernel, int64_t rows, int64_t rows_per_block, Args... args) {
  if (rows == 0) return;
#if defined(RL_MUTATIONS)
  sync_mutation();
#endif
  const unsigned blocks = static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
  kernel<<<dim3(blocks), RL_BLOCK, 0, at::cuda::getCurrentCUDAStream()>>>(rows, args...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

template <class Kernel, class... Args>
void launch_per_row(Kernel kernel, int64_t rows, Args... args) {
  launch_rows(kernel, rows, RL_BLOCK, args...);
}

// Warp w of block (x, y) is row 8x + w's node y; the kernel gets its launch's rows [row0, row_end).
template <class Kernel, class... Args>
void launch_warp_rows(Kernel kernel, int64_t rows, int64_t nodes, Args... args) {
  for_each_launch(rows, nodes, [&](int64_t first, int64_t n, unsigned y) {
    const unsigned blocks = static_cast<unsigned>((n + RL_WARPS - 1) / RL_WARPS);
    kernel<<<dim3(blocks, y), RL_BLOCK, 0, at::cuda::getCurrentCUDAStream()>>>(first, first + n, args...);
  });
}

// One warp per row (a row's equal parts joined).
template <class Kernel, class... Args>
void launch_per_warp(Kernel kernel, int64_t rows, Args... args) {
  launch_rows(kernel, rows, RL_WARPS, args...);
}

// Blocks of RL_WARPS warps that hold one warp per node.
int64_t warp_groups(int64_t nodes) { return (nodes + RL_WARPS - 1) / RL_WARPS; }

at::Device current_device() { return at::Device(at::kCUDA, c10::cuda::current_device()); }

// The node list on the device: arrays copied (a few dozen int64), or one level (nothing to copy).
struct DeviceNodes {
  at::Tensor levels, indices;
  NodeList list;
  explicit DeviceNodes(const HostNodes& h) {
    list = NodeList{nullptr, nullptr, h.n, h.uniform_level};
    if (h.levels.empty()) return;
    levels = device_ints(h.levels, current_device());
    indices = device_ints(h.indices, current_device());
    list.levels = levels.const_data_ptr<int64_t>();
    list.indices = indices.const_data_ptr<int64_t>();
  }
};

int multiprocessors() {
  static const int n = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
  return n;
}

struct GpuExec {
  struct Guard {
    explicit Guard(const at::Tensor& t) : g(t.device()) {}
    c10::cuda::CUDAGuard g;
  };

  // Few rows: cut each into parts, one warp each, so that about 32 warps per multiprocessor run (at
  // least a warp tile, 256 chunks, a part); many rows: one block per row.
  static int auto_split_level(int64_t rows, int64_t V) {
    const int64_t want = 32 * int64_t(multiprocessors());
    if (rows * RL_WARPS >= want) return RL_NO_SPLIT;
    const int64_t per_part = chunks_of(V) * rows / want;
    int L = RL_WARP_TILE_LEVEL;
    while (L < 40 && (int64_t(1) << L) < per_part) ++L;
    return L;
  }

  template <class D>
  static void row_stats(const typename D::storage* x, const Rows& r, float* stats) {
    launch(row_stats_kernel<D>, r.n, x, r.stride, r.v, stats);
  }

  template <class D>
  static void log_softmax(const typename D::storage* x, const Rows& r, float* out) {
    launch(log_softmax_kernel<D>, r.n, x, r.stride, r.v, out);
  }

  template <class O>
  static void log_softmax_backward(const float* g, const float* out, int64_t n, int64_t v,
                                   typename O::storage* gin) {
    launch(log_softmax_backward_kernel<O>, n, g, out, v, gin);
  }

  template <class D>
  static void token_logprobs(const typename D::storage* x, const Rows& r, const int64_t* tok, int64_t ignore,
                             float* out, float* stats) {
    launch(token_logprobs_kernel<D>, r.n, x, r.stride, r.v, tok, ignore, out, stats);
  }

  template <class D>
  static void token_logprobs_backward(const float* g, const typename D::storage* x, const Rows& r,
                                      const int64_t* tok, const float* stats, int64_t ignore,
                                      typename D::storage* gin) {
    launch(token_logprobs_backward_kernel<D>, r.n, g, x, r.stride, r.v, tok, stats, ignore, gin);
  }

  template <class D>
  static void entropy(const typename D::storage* x, const Rows& r, float* out, float* stats) {
    launch(entropy_kernel<D>, r.n, x, r.stride, r.v, out, stats);
  }

  template <class D>
  static void entropy_backward(const float* g, const typename D::storage* x, const Rows& r, const float* stats,
                               const float* H, typename D::storage* gin) {
    launch(entropy_backward_kernel<D>, r.n, g, x, r.stride, r.v, stats, H, gin);
  }

  // A rank's slice (its canonical decomposition), no node list to copy to the device: for many rows (a fused
  // head's vocabulary chunk over a training batch) one warp per (row, node), every warp busy; for few rows
  // (decode) one block per row, balanced over its warps. The same nodes either way, so the same bits.
  static bool warp_per_node(int64_t rows) { return rows >= int64_t(RL_WARPS) * multiprocessors(); }

  // A rank's slice (its canonical decomposition): one block per row, balanced over its warps, and no node
  // list to copy to the device. Any other list (a row's equal parts, or nodes given by hand): one warp each.
  template <class D>
  static void node_stats(const typename D::storage* x, const Rows& r, int64_t chunk0, int64_t valid,
                         const HostNodes& nodes, float* out) {
    if (canonical_nodes(nodes, chunk0, chunk0 + chunks_of(valid))) {
      if (warp_per_node(r.n))
        return launch_warp_rows(slice_stats_warp_kernel<D>, r.n, nodes.n, x, r.stride, valid, chunk0, nodes.n, out);
      return launch(slice_stats_kernel<D>, r.n, x, r.stride, valid, chunk0, nodes.n, out);
    }
    const DeviceNodes dn(nodes);
    launch_nodes(node_stats_kernel<D>, r.n, warp_groups(nodes.n), x, r.stride, valid, chunk0, dn.list, out);
  }

  template <class D>
  static void node_entropy(const typename D::storage* x, const Rows& r, int64_t chunk0, int64_t valid,
                           const HostNodes& nodes, const float* stats, float* out) {
    if (canonical_nodes(nodes, chunk0, chunk0 + chunks_of(valid))) {
      if (warp_per_node(r.n))
        return launch_warp_rows(slice_entropy_warp_kernel<D>, r.n, nodes.n, x, r.stride, valid, chunk0, nodes.n,
                                stats, out);
      return launch(slice_entropy_kernel<D>, r.n, x, r.stride, valid, chunk0, nodes.n, stats, out);
    }
    const DeviceNodes dn(nodes);
    launch_nodes(node_entropy_kernel<D>, r.n, warp_groups(nodes.n), x, r.stride, valid, chunk0, dn.list, stats, out);
  }

  // Only ever the equal parts of a row cut for few rows (token_logprobs_op): one warp per row joins them.
  template <class D>
  static void join_token(const float* part, const HostNodes& nodes, const typename D::storage* x, const Rows& r,
                         const int64_t* tok, int64_t ignore, float* out, float* stats) {
    RL_CHECK(nodes.levels.empty(), "rl_kernel: join_token takes a row's equal parts (one level)");
    launch_per_warp(join_parts_token_kernel<D>, r.n, part, nodes.n, nodes.uniform_level, x, r.stride, r.v, tok,
                    ignore, out, stats);
  }

  template <class D>
  static void token_logprobs_backward_slice(const float* g, const typename D::storage* x, const Rows& r,
                                            int64_t valid, const int64_t* tok, const float* stats, int64_t ignore,
                                            typename D::storage* gin) {
    launch(token_logprobs_backward_slice_kernel<D>, r.n, g, x, r.stride, r.v, valid, tok, stats, ignore, gin);
  }

  template <class D>
  static void entropy_backward_slice(const float* g, const typename D::storage* x, const Rows& r, int64_t valid,
                                     const float* stats, const float* H, typename D::storage* gin) {
    launch(entropy_backward_slice_kernel<D>, r.n, g, x, r.stride, r.v, valid, stats, H, gin);
  }

  template <class D>
  static void logprobs_entropy_backward_slice(const float* g, const float* ge, const typename D::storage* x,
                                              const Rows& r, int64_t valid, const int64_t* tok, const float* stats,
                                              const float* H, int64_t ignore, typename D::storage* gin) {
    launch(logprobs_entropy_backward_slice_kernel<D>, r.n, g, ge, x, r.stride, r.v, valid, tok, stats, H, ignore,
           gin);
  }

  static void join_stats(const float* part, int64_t rows, const HostNodes& nodes, float* stats) {
    if (nodes.levels.empty())
      return launch_per_warp(join_parts_stats_kernel, rows, part, nodes.n, nodes.uniform_level, stats);
    const DeviceNodes dn(nodes);
    launch_per_row(join_stats_kernel, rows, part, dn.list, stats);
  }

  static void join_sum(const float* part, int64_t rows, const HostNodes& nodes, const float* stats, float* out) {
    if (nodes.levels.empty())
      return launch_per_warp(join_parts_sum_kernel, rows, part, nodes.n, nodes.uniform_level, stats, out);
    const DeviceNodes dn(nodes);
    launch_per_row(join_sum_kernel, rows, part, dn.list, stats, out);
  }
};

}  // namespace
}  // namespace rl

TORCH_LIBRARY_IMPL(rl_kernel, CUDA, m) { rl::impl_softmax<rl::GpuExec>(m); }
