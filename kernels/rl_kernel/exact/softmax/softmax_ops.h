// The softmax family's ATen operators, written once for both executors; the
// CPU (softmax_cpu.cpp) and GPU (softmax_gpu.cu) bindings instantiate them.
#pragma once

#include "../common/glue.h"
#include "softmax.cuh"

namespace rl {

// Nodes as the operators receive them (host arrays, or n nodes of one level); each executor
// turns them into a NodeList its kernels can read.
struct HostNodes {
  at::IntArrayRef levels;  // empty: n nodes of uniform_level
  at::IntArrayRef indices;
  int64_t n;
  int uniform_level;
};

inline HostNodes given_nodes(at::IntArrayRef levels, at::IntArrayRef indices) {
  return HostNodes{levels, indices, int64_t(levels.size()), 0};
}

// True when the nodes are the canonical decomposition of chunks [c0, c1): their maximal aligned nodes, left
// to right (what rl_kernel.parallel gives for a rank's slice; the GPU then takes a balanced path).
inline bool canonical_nodes(const HostNodes& h, int64_t c0, int64_t c1) {
  if (h.levels.empty() || c0 < 0) return false;
  int64_t c = c0, k = 0;
  for (; c < c1; ++k) {
    const int L = item_level(c, c1, 62);
    if (k >= h.n || h.levels[k] != L || h.indices[k] != (c >> L)) return false;
    c += int64_t(1) << L;
  }
  return k == h.n;
}

// ---- a row cut into equal aligned parts: several blocks per row -----------------------------
// The cut is a launch choice that never changes a bit (the row's tree is the same, docs/numerics.md
// section 2). -1: the executor chooses (Exec::auto_split_level); L >= 0: parts of 2^L chunks whenever
// the row has more; RL_NO_SPLIT: never. Set by torch.ops.rl_kernel._set_row_split (tests force it).
constexpr int RL_NO_SPLIT = 63;
inline std::atomic<int>& forced_split_level() {
  static std::atomic<int> level(-1);
  return level;
}

template <class Exec>
int split_level(int64_t rows, int64_t V) {
  const int forced = forced_split_level().load();
  const int L = forced >= 0 ? forced : Exec::auto_split_level(rows, V);
  return (L < RL_NO_SPLIT && chunks_of(V) > (int64_t(1) << L)) ? L : RL_NO_SPLIT;
}

inline HostNodes equal_parts(int64_t V, int L) {
  const int64_t size = int64_t(1) << L;
  return HostNodes{{}, {}, (chunks_of(V) + size - 1) / size, L};
}

// Row statistics of a row cut into parts: the parts' nodes, then their join.
template <class Exec, class D>
void split_stats(const Rows& x, const HostNodes& nodes, float* stats) {
  at::Tensor part = at::empty({x.n, nodes.n, 2}, f32_like(x.t));
  Exec::template node_stats<D>(data_of<D>(x.t), x, 0, x.v, nodes, part.data_ptr<float>());
  Exec::join_stats(part.const_data_ptr<float>(), x.n, nodes, stats);
}

inline std::vector<int64_t> stats_shape(const at::Tensor& x) {
  auto s = lead_shape(x);
  s.push_back(3);
  return s;
}

// ---- the operators, written once for both executors -------------------------
// Exec (CpuExec in softmax_cpu.cpp, GpuExec in softmax_gpu.cu) supplies a device guard
// and, per operator, the row loop or kernel launch over raw pointers.

template <class Exec>
at::Tensor row_stats_op(const at::Tensor& logits) {
  check_logits(logits, "logits");
  const typename Exec::Guard guard(logits);
  const Rows x = rows_of(logits);
  at::Tensor stats = at::empty({x.n, 3}, f32_like(logits));
  const int L = split_level<Exec>(x.n, x.v);
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    if (L != RL_NO_SPLIT)
      split_stats<Exec, D>(x, equal_parts(x.v, L), stats.data_ptr<float>());
    else
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
  RL_CHECK(grad_output.sizes() == output.sizes(), "rl_kernel: grad_output shape ", grad_output.sizes(),
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
  const int L = split_level<Exec>(x.n, x.v);
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    if (L != RL_NO_SPLIT) {
      const HostNodes nodes = equal_parts(x.v, L);
      at::Tensor part = at::empty({x.n, nodes.n, 2}, f32_like(logits));
      Exec::template node_stats<D>(data_of<D>(x.t), x, 0, x.v, nodes, part.data_ptr<float>());
      Exec::template join_token<D>(part.const_data_ptr<float>(), nodes, data_of<D>(x.t), x,
                                   tok.const_data_ptr<int64_t>(), ignore_index, out.data_ptr<float>(),
                                   stats.data_ptr<float>());
    } else {
      Exec::template token_logprobs<D>(data_of<D>(x.t), x, tok.const_data_ptr<int64_t>(), ignore_index,
                                       out.data_ptr<float>(), stats.data_ptr<float>());
    }
  });
  return {out.view(lead_shape(logits)), stats.view(stats_shape(logits))};
}

// The common frame of the per-row backward operators: the upstream gradient per row, the saved row
// statistics, and a gradient shaped and typed like the logits; f(D, rows, g, stats, gin) fills it.
template <class Exec, class F>
at::Tensor row_backward(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& stats, F&& f) {
  const typename Exec::Guard guard(logits);
  const Rows x = rows_of(logits);
  const at::Tensor g = grad.to(at::kFloat).reshape({-1}).contiguous();
  const at::Tensor st = stats.reshape({-1, 3}).contiguous();
  at::Tensor gin = at::empty({x.n, x.v}, logits.options());
  dispatch_dtype(x.t, [&](auto d) {
    f(d, x, g.const_data_ptr<float>(), st.const_data_ptr<float>(),
      reinterpret_cast<typename decltype(d)::storage*>(gin.data_ptr()));
  });
  return gin.view(logits.sizes());
}

inline void check_valid(int64_t valid, const at::Tensor& logits) {
  RL_CHECK(valid >= 0 && valid <= logits.size(-1), "rl_kernel: valid must be in [0, ", logits.size(-1),
              "], got ", valid);
}

template <class Exec>
at::Tensor token_logprobs_backward_op(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& tokens,
                                      const at::Tensor& stats, int64_t ignore_index) {
  check_logits(logits, "logits");
  check_tokens(logits, tokens);
  const at::Tensor tok = tokens.reshape({-1}).contiguous();
  return row_backward<Exec>(grad, logits, stats, [&](auto d, const Rows& x, const float* g, const float* st, auto* gin) {
    using D = decltype(d);
    Exec::template token_logprobs_backward<D>(g, data_of<D>(x.t), x, tok.const_data_ptr<int64_t>(), st, ignore_index,
                                              gin);
  });
}

template <class Exec>
std::tuple<at::Tensor, at::Tensor> entropy_op(const at::Tensor& logits) {
  check_logits(logits, "logits");
  const typename Exec::Guard guard(logits);
  const Rows x = rows_of(logits);
  at::Tensor out = at::empty({x.n}, f32_like(logits));
  at::Tensor stats = at::empty({x.n, 3}, f32_like(logits));
  const int L = split_level<Exec>(x.n, x.v);
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    if (L != RL_NO_SPLIT) {
      const HostNodes nodes = equal_parts(x.v, L);
      split_stats<Exec, D>(x, nodes, stats.data_ptr<float>());
      at::Tensor part = at::empty({x.n, nodes.n}, f32_like(logits));
      Exec::template node_entropy<D>(data_of<D>(x.t), x, 0, x.v, nodes, stats.const_data_ptr<float>(),
                                     part.data_ptr<float>());
      Exec::join_sum(part.const_data_ptr<float>(), x.n, nodes, stats.const_data_ptr<float>(), out.data_ptr<float>());
    } else {
      Exec::template entropy<D>(data_of<D>(x.t), x, out.data_ptr<float>(), stats.data_ptr<float>());
    }
  });
  return {out.view(lead_shape(logits)), stats.view(stats_shape(logits))};
}

template <class Exec>
at::Tensor entropy_backward_op(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& stats,
                               const at::Tensor& entropy) {
  check_logits(logits, "logits");
  const at::Tensor h = entropy.reshape({-1}).contiguous();
  return row_backward<Exec>(grad, logits, stats, [&](auto d, const Rows& x, const float* g, const float* st, auto* gin) {
    using D = decltype(d);
    Exec::template entropy_backward<D>(g, data_of<D>(x.t), x, st, h.const_data_ptr<float>(), gin);
  });
}

// ---- backward on a vocab-parallel rank's slice (rl_kernel.parallel) -------------------------------
// tokens are the slice's own indices (another slice's token: any index outside [0, valid)); columns at
// or past valid are padding and get a zero gradient.
template <class Exec>
at::Tensor token_logprobs_backward_slice_op(const at::Tensor& grad, const at::Tensor& logits,
                                            const at::Tensor& tokens, const at::Tensor& stats, int64_t ignore_index,
                                            int64_t valid) {
  check_logits(logits, "logits");
  check_tokens(logits, tokens);
  check_valid(valid, logits);
  const at::Tensor tok = tokens.reshape({-1}).contiguous();
  return row_backward<Exec>(grad, logits, stats, [&](auto d, const Rows& x, const float* g, const float* st, auto* gin) {
    using D = decltype(d);
    Exec::template token_logprobs_backward_slice<D>(g, data_of<D>(x.t), x, valid, tok.const_data_ptr<int64_t>(), st,
                                                    ignore_index, gin);
  });
}

template <class Exec>
at::Tensor entropy_backward_slice_op(const at::Tensor& grad, const at::Tensor& logits, const at::Tensor& stats,
                                     const at::Tensor& entropy, int64_t valid) {
  check_logits(logits, "logits");
  check_valid(valid, logits);
  const at::Tensor h = entropy.reshape({-1}).contiguous();
  return row_backward<Exec>(grad, logits, stats, [&](auto d, const Rows& x, const float* g, const float* st, auto* gin) {
    using D = decltype(d);
    Exec::template entropy_backward_slice<D>(g, data_of<D>(x.t), x, valid, st, h.const_data_ptr<float>(), gin);
  });
}

// Both slice backwards summed as autograd sums them (softmax.cuh's autograd_sum): fp32 and bf16 logits only.
template <class Exec>
at::Tensor logprobs_entropy_backward_slice_op(const at::Tensor& grad_logprobs, const at::Tensor& grad_entropy,
                                              const at::Tensor& logits, const at::Tensor& tokens,
                                              const at::Tensor& stats, const at::Tensor& entropy,
                                              int64_t ignore_index, int64_t valid) {
  check_logits(logits, "logits");
  RL_CHECK(logits.scalar_type() != at::kHalf,
           "rl_kernel: logprobs_entropy_backward_slice takes fp32 or bf16 logits, got fp16 (torch rounds a half add "
           "its own way): use token_logprobs_backward_slice + entropy_backward_slice");
  check_tokens(logits, tokens);
  check_valid(valid, logits);
  const at::Tensor tok = tokens.reshape({-1}).contiguous();
  const at::Tensor h = entropy.reshape({-1}).contiguous();
  const at::Tensor ge = grad_entropy.to(at::kFloat).reshape({-1}).contiguous();
  RL_CHECK(ge.numel() == tok.numel(), "rl_kernel: grad_entropy must have one value per row (", tok.numel(),
           "), got ", ge.numel());
  return row_backward<Exec>(grad_logprobs, logits, stats,
                            [&](auto d, const Rows& x, const float* g, const float* st, auto* gin) {
                              using D = decltype(d);
                              Exec::template logprobs_entropy_backward_slice<D>(
                                  g, ge.const_data_ptr<float>(), data_of<D>(x.t), x, valid,
                                  tok.const_data_ptr<int64_t>(), st, h.const_data_ptr<float>(), ignore_index, gin);
                            });
}

// ---- cutting the row: node values of a slice, and the join of every slice's nodes -------------
// Nodes (levels[k], indices[k]) of the row's tree (reduce.h); the slice holds `valid` elements of
// the row from global element 8 * chunk0. Each node must start inside the slice's valid chunks.
inline void check_nodes(at::IntArrayRef levels, at::IntArrayRef indices, int64_t chunk0, int64_t valid,
                        int64_t width) {
  RL_CHECK(levels.size() == indices.size(), "rl_kernel: ", levels.size(), " node levels but ", indices.size(),
              " node indices");
  RL_CHECK(chunk0 >= 0, "rl_kernel: chunk0 must be >= 0, got ", chunk0);
  RL_CHECK(valid >= 0 && valid <= width, "rl_kernel: valid must be in [0, ", width, "], got ", valid);
  for (size_t k = 0; k < levels.size(); ++k) {
    RL_CHECK(levels[k] >= 0 && levels[k] <= 40 && indices[k] >= 0, "rl_kernel: bad node (level ", levels[k],
                ", index ", indices[k], ")");
    const NodeRange nr = node_range(chunk0, valid, int(levels[k]), indices[k]);
    RL_CHECK(nr.first >= 0 && nr.n > 0, "rl_kernel: node (level ", levels[k], ", index ", indices[k],
                ") does not start inside the slice's chunks [", chunk0, ", ", chunk0 + chunks_of(valid), ")");
  }
}

inline void check_join(at::IntArrayRef levels, at::IntArrayRef indices, int64_t nodes) {
  RL_CHECK(levels.size() == indices.size() && int64_t(levels.size()) == nodes, "rl_kernel: ", nodes,
              " node values but ", levels.size(), " levels and ", indices.size(), " indices");
  for (size_t k = 0; k < levels.size(); ++k)
    RL_CHECK(levels[k] >= 0 && levels[k] <= 40 && indices[k] >= 0, "rl_kernel: bad node (level ", levels[k],
                ", index ", indices[k], ")");
}

inline std::vector<int64_t> with_tail(std::vector<int64_t> s, std::initializer_list<int64_t> tail) {
  s.insert(s.end(), tail.begin(), tail.end());
  return s;
}

template <class Exec>
at::Tensor node_stats_op(const at::Tensor& logits, int64_t chunk0, int64_t valid, at::IntArrayRef levels,
                         at::IntArrayRef indices) {
  check_logits(logits, "logits");
  check_nodes(levels, indices, chunk0, valid, logits.size(-1));
  const typename Exec::Guard guard(logits);
  const Rows x = rows_of(logits);
  const int64_t nodes = int64_t(levels.size());
  at::Tensor out = at::empty({x.n, nodes, 2}, f32_like(logits));
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    Exec::template node_stats<D>(data_of<D>(x.t), x, chunk0, valid, given_nodes(levels, indices),
                                 out.data_ptr<float>());
  });
  return out.view(with_tail(lead_shape(logits), {nodes, 2}));
}

template <class Exec>
at::Tensor node_entropy_op(const at::Tensor& logits, const at::Tensor& stats, int64_t chunk0, int64_t valid,
                           at::IntArrayRef levels, at::IntArrayRef indices) {
  check_logits(logits, "logits");
  check_nodes(levels, indices, chunk0, valid, logits.size(-1));
  check_same_device(logits, stats, "logits", "stats");
  const typename Exec::Guard guard(logits);
  const Rows x = rows_of(logits);
  const at::Tensor st = stats.to(at::kFloat).reshape({-1, 3}).contiguous();
  RL_CHECK(st.size(0) == x.n, "rl_kernel: stats has ", st.size(0), " rows, logits ", x.n);
  const int64_t nodes = int64_t(levels.size());
  at::Tensor out = at::empty({x.n, nodes}, f32_like(logits));
  dispatch_dtype(x.t, [&](auto d) {
    using D = decltype(d);
    Exec::template node_entropy<D>(data_of<D>(x.t), x, chunk0, valid, given_nodes(levels, indices),
                                   st.const_data_ptr<float>(), out.data_ptr<float>());
  });
  return out.view(with_tail(lead_shape(logits), {nodes}));
}

template <class Exec>
at::Tensor join_stats_op(const at::Tensor& partials, at::IntArrayRef levels, at::IntArrayRef indices) {
  RL_CHECK(partials.dim() >= 2 && partials.size(-1) == 2 && partials.scalar_type() == at::kFloat,
              "rl_kernel: partials must be float32 [..., nodes, 2], got ", partials.scalar_type(), " ",
              partials.sizes());
  check_join(levels, indices, partials.size(-2));
  const typename Exec::Guard guard(partials);
  const at::Tensor p = partials.reshape({-1, partials.size(-2), 2}).contiguous();
  at::Tensor stats = at::empty({p.size(0), 3}, p.options());
  Exec::join_stats(p.const_data_ptr<float>(), p.size(0), given_nodes(levels, indices), stats.data_ptr<float>());
  auto shape = partials.sizes().vec();
  shape.pop_back();
  shape.back() = 3;
  return stats.view(shape);
}

template <class Exec>
at::Tensor join_sum_op(const at::Tensor& partials, const at::Tensor& stats, at::IntArrayRef levels,
                       at::IntArrayRef indices) {
  RL_CHECK(partials.dim() >= 1 && partials.scalar_type() == at::kFloat,
              "rl_kernel: partials must be float32 [..., nodes], got ", partials.scalar_type());
  check_join(levels, indices, partials.size(-1));
  check_same_device(partials, stats, "partials", "stats");
  const typename Exec::Guard guard(partials);
  const at::Tensor p = partials.reshape({-1, partials.size(-1)}).contiguous();
  const at::Tensor st = stats.to(at::kFloat).reshape({-1, 3}).contiguous();
  RL_CHECK(st.size(0) == p.size(0), "rl_kernel: stats has ", st.size(0), " rows, partials ", p.size(0));
  at::Tensor out = at::empty({p.size(0)}, p.options());
  Exec::join_sum(p.const_data_ptr<float>(), p.size(0), given_nodes(levels, indices), st.const_data_ptr<float>(),
                 out.data_ptr<float>());
  auto shape = partials.sizes().vec();
  shape.pop_back();
  return out.view(shape);
}

// The previous forced level (-1: the executor's choice); see forced_split_level.
inline int64_t set_row_split(int64_t level) {
  RL_CHECK(level >= -1 && level <= RL_NO_SPLIT, "rl_kernel: row split level must be in [-1, ", RL_NO_SPLIT,
              "], got ", level);
  return forced_split_level().exchange(int(level));
}

// Registers the family's operators of one executor under m's dispatch key.
template <class Exec>
void impl_softmax(torch::Library& m) {
  impl_ops(m, "row_stats", &row_stats_op<Exec>, "log_softmax", &log_softmax_op<Exec>, "log_softmax_backward",
           &log_softmax_backward_op<Exec>, "token_logprobs", &token_logprobs_op<Exec>, "token_logprobs_backward",
           &token_logprobs_backward_op<Exec>, "entropy", &entropy_op<Exec>, "entropy_backward",
           &entropy_backward_op<Exec>, "node_stats", &node_stats_op<Exec>, "node_entropy",
           &node_entropy_op<Exec>, "join_stats", &join_stats_op<Exec>, "join_sum", &join_sum_op<Exec>, "token_logprobs_backward_slice",
           &token_logprobs_backward_slice_op<Exec>, "entropy_backward_slice", &entropy_backward_slice_op<Exec>,
           "logprobs_entropy_backward_slice", &logprobs_entropy_backward_slice_op<Exec>);
}

}  // namespace rl
