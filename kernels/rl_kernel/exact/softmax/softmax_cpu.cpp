// The softmax family's schemas and its CPU executor (the golden reference), its rows
// on torch's threads in IEEE mode (common/cpu.h).
// torch/extension.h (not just torch/library.h): GCC's inlining budget depends on the size of the
// unit, and this keeps the CPU reference's generated code what it was before the family split.
#include <torch/extension.h>

#include "../common/cpu.h"
#include "softmax_ops.h"

namespace rl {
namespace {

void put_stats(float* p, RowStats st) {
  p[0] = st.m;
  p[1] = st.s;
  p[2] = st.log_s;
}

RowStats get_stats(const float* p) { return RowStats{p[0], p[1], p[2]}; }

NodeList host_list(const HostNodes& h) {
  return NodeList{h.levels.empty() ? nullptr : h.levels.data(), h.indices.empty() ? nullptr : h.indices.data(), h.n,
                  h.uniform_level};
}

struct CpuExec {
  struct Guard {
    explicit Guard(const at::Tensor&) {}
  };

  // Whole rows: one thread per row already keeps every core busy (the split is tested when forced).
  static int auto_split_level(int64_t, int64_t) { return RL_NO_SPLIT; }

  template <class D>
  static void row_stats(const typename D::storage* x, const Rows& r, float* stats) {
    for_rows(r.n, [&](int64_t i) { put_stats(stats + 3 * i, cpu_row_stats<D>(x + i * r.stride, r.v)); });
  }

  template <class D>
  static void log_softmax(const typename D::storage* x, const Rows& r, float* out) {
    for_rows(r.n, [&](int64_t i) { cpu_log_softmax_row<D>(x + i * r.stride, r.v, out + i * r.v); });
  }

  template <class O>
  static void log_softmax_backward(const float* g, const float* out, int64_t n, int64_t v,
                                   typename O::storage* gin) {
    for_rows(n, [&](int64_t i) { cpu_log_softmax_backward_row<O>(g + i * v, out + i * v, v, gin + i * v); });
  }

  template <class D>
  static void token_logprobs(const typename D::storage* x, const Rows& r, const int64_t* tok, int64_t ignore,
                             float* out, float* stats) {
    for_rows(r.n, [&](int64_t i) {
      const auto* row = x + i * r.stride;
      const RowStats st = cpu_row_stats<D>(row, r.v);
      put_stats(stats + 3 * i, st);
      out[i] = token_logprob<D>(row, r.v, tok[i], ignore, st);
    });
  }

  template <class D>
  static void token_logprobs_backward(const float* g, const typename D::storage* x, const Rows& r,
                                      const int64_t* tok, const float* stats, int64_t ignore,
                                      typename D::storage* gin) {
    for_rows(r.n, [&](int64_t i) {
      const auto* row = x + i * r.stride;
      const RowStats st = get_stats(stats + 3 * i);
      for (int64_t j = 0; j < r.v; ++j)
        gin[i * r.v + j] = D::store(token_logprob_grad(g[i], logprob(D::load(row, j), st), j, tok[i], r.v, ignore));
    });
  }

  template <class D>
  static void entropy(const typename D::storage* x, const Rows& r, float* out, float* stats) {
    for_rows(r.n, [&](int64_t i) {
      const auto* row = x + i * r.stride;
      const RowStats st = cpu_row_stats<D>(row, r.v);
      put_stats(stats + 3 * i, st);
      out[i] = cpu_entropy_row<D>(row, r.v, st);
    });
  }

  template <class D>
  static void entropy_backward(const float* g, const typename D::storage* x, const Rows& r, const float* stats,
                               const float* H, typename D::storage* gin) {
    for_rows(r.n, [&](int64_t i) {
      const auto* row = x + i * r.stride;
      const RowStats st = get_stats(stats + 3 * i);
      for (int64_t j = 0; j < r.v; ++j)
        gin[i * r.v + j] = D::store(entropy_grad(g[i], logprob(D::load(row, j), st), H[i]));
    });
  }

  template <class D>
  static void node_stats(const typename D::storage* x, const Rows& r, int64_t chunk0, int64_t valid,
                         const HostNodes& nodes, float* out) {
    const NodeList nl = host_list(nodes);
    for_rows(r.n, [&](int64_t i) {
      for (int64_t j = 0; j < nl.n; ++j) {
        const Acc a = cpu_node_stats<D>(x + i * r.stride, valid, chunk0, nl.level(j), nl.index(j));
        out[2 * (i * nl.n + j)] = a.m;
        out[2 * (i * nl.n + j) + 1] = a.s;
      }
    });
  }

  template <class D>
  static void node_entropy(const typename D::storage* x, const Rows& r, int64_t chunk0, int64_t valid,
                           const HostNodes& nodes, const float* stats, float* out) {
    const NodeList nl = host_list(nodes);
    for_rows(r.n, [&](int64_t i) {
      const EntropyTerms<D> terms{x + i * r.stride, valid, get_stats(stats + 3 * i)};
      for (int64_t j = 0; j < nl.n; ++j) out[i * nl.n + j] = cpu_node_sum(terms, valid, chunk0, nl.level(j), nl.index(j));
    });
  }

  template <class D>
  static void join_token(const float* part, const HostNodes& nodes, const typename D::storage* x, const Rows& r,
                         const int64_t* tok, int64_t ignore, float* out, float* stats) {
    join_stats(part, r.n, nodes, stats);
    for_rows(r.n, [&](int64_t i) {
      out[i] = token_logprob<D>(x + i * r.stride, r.v, tok[i], ignore, get_stats(stats + 3 * i));
    });
  }

  template <class D>
  static void token_logprobs_backward_slice(const float* g, const typename D::storage* x, const Rows& r,
                                            int64_t valid, const int64_t* tok, const float* stats, int64_t ignore,
                                            typename D::storage* gin) {
    for_rows(r.n, [&](int64_t i) {
      const auto* row = x + i * r.stride;
      const RowStats st = get_stats(stats + 3 * i);
      for (int64_t j = 0; j < r.v; ++j)
        gin[i * r.v + j] = D::store(
            j < valid ? token_logprob_grad_slice(g[i], logprob(D::load(row, j), st), j, tok[i], ignore) : 0.0f);
    });
  }

  template <class D>
  static void entropy_backward_slice(const float* g, const typename D::storage* x, const Rows& r, int64_t valid,
                                     const float* stats, const float* H, typename D::storage* gin) {
    for_rows(r.n, [&](int64_t i) {
      const auto* row = x + i * r.stride;
      const RowStats st = get_stats(stats + 3 * i);
      for (int64_t j = 0; j < r.v; ++j)
        gin[i * r.v + j] = D::store(j < valid ? entropy_grad(g[i], logprob(D::load(row, j), st), H[i]) : 0.0f);
    });
  }

  template <class D>
  static void logprobs_entropy_backward_slice(const float* g, const float* ge, const typename D::storage* x,
                                              const Rows& r, int64_t valid, const int64_t* tok, const float* stats,
                                              const float* H, int64_t ignore, typename D::storage* gin) {
    for_rows(r.n, [&](int64_t i) {
      const auto* row = x + i * r.stride;
      const RowStats st = get_stats(stats + 3 * i);
      for (int64_t j = 0; j < r.v; ++j)
        gin[i * r.v + j] = logprobs_entropy_grad_at<D>(row, j, valid, st, g[i], ge[i], tok[i], ignore, H[i]);
    });
  }

  static void join_stats(const float* part, int64_t rows, const HostNodes& nodes, float* stats) {
    const NodeList nl = host_list(nodes);
    for_rows(rows, [&](int64_t i) { put_stats(stats + 3 * i, finish(join_stats_nodes(part + 2 * i * nl.n, nl))); });
  }

  static void join_sum(const float* part, int64_t rows, const HostNodes& nodes, const float* stats, float* out) {
    const NodeList nl = host_list(nodes);
    for_rows(rows, [&](int64_t i) {
      const float h = join_sum_nodes(part + i * nl.n, nl);
      out[i] = (stats[3 * i + 1] >= 1.0f) ? h : canonical_nan();
    });
  }
};

}  // namespace
}  // namespace rl

// The family's schemas; module.cpp owns the rl_kernel namespace.
TORCH_LIBRARY_FRAGMENT(rl_kernel, m) {
  m.def("row_stats(Tensor logits) -> Tensor");
  m.def("log_softmax(Tensor logits) -> Tensor");
  m.def("log_softmax_backward(Tensor grad_output, Tensor output, ScalarType input_dtype) -> Tensor");
  m.def("token_logprobs(Tensor logits, Tensor tokens, int ignore_index) -> (Tensor, Tensor)");
  m.def(
      "token_logprobs_backward(Tensor grad, Tensor logits, Tensor tokens, Tensor stats, int ignore_index) -> "
      "Tensor");
  m.def("entropy(Tensor logits) -> (Tensor, Tensor)");
  m.def("entropy_backward(Tensor grad, Tensor logits, Tensor stats, Tensor entropy) -> Tensor");
  // Cutting the row (rl_kernel.parallel): node values of a slice, and the join of all slices' nodes.
  m.def("node_stats(Tensor logits, int chunk0, int valid, int[] levels, int[] indices) -> Tensor");
  m.def("node_entropy(Tensor logits, Tensor stats, int chunk0, int valid, int[] levels, int[] indices) -> Tensor");
  m.def("join_stats(Tensor partials, int[] levels, int[] indices) -> Tensor");
  m.def("join_sum(Tensor partials, Tensor stats, int[] levels, int[] indices) -> Tensor");
  m.def(
      "token_logprobs_backward_slice(Tensor grad, Tensor logits, Tensor tokens, Tensor stats, int ignore_index, "
      "int valid) -> Tensor");
  m.def("entropy_backward_slice(Tensor grad, Tensor logits, Tensor stats, Tensor entropy, int valid) -> Tensor");
  m.def(
      "logprobs_entropy_backward_slice(Tensor grad_logprobs, Tensor grad_entropy, Tensor logits, Tensor tokens, "
      "Tensor stats, Tensor entropy, int ignore_index, int valid) -> Tensor");
}

TORCH_LIBRARY_IMPL(rl_kernel, CPU, m) { rl::impl_softmax<rl::CpuExec>(m); }

// Host-only: the forced row split of every executor (a launch choice; tests force it).
TORCH_LIBRARY_FRAGMENT(rl_kernel, m) { m.def("_set_row_split(int level) -> int", &rl::set_row_split); }
