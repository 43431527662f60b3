// The softmax family: row statistics, log_softmax, token log-probs and entropy,
// forward and backward. Each GPU kernel has its CPU reference beside it (as
// llm.c does); both call the same contract functions of common/, so the CPU
// build is the golden reference for the CUDA and HIP builds. The row tree they
// reduce by (its CPU and GPU schedules) is common/rowtree.cuh's.
// This file needs no ATen: it is also compiled alone by `make kernels-check`.
#pragma once

#include "../common/dtypes.h"
#include "../common/reduce.h"
#include "../common/rowtree.cuh"

namespace rl {

// ---- row statistics and the per-element terms of the contract ---------------
// A row is well defined iff its maximum is finite (not NaN, not +inf) and s >= 1
// (s < 1 means every element was -inf). Bad rows output the canonical NaN.
RL_HD bool row_ok(Acc a) { return a.m <= RL_FLT_MAX && a.s >= 1.0f; }

// Row statistics handed from the forward to the backward and to users.
struct RowStats {
  float m;      // row maximum, flushed (so +0.0 for any zero), or NaN for a bad row
  float s;      // sum of exp(x - m), or NaN for a bad row
  float log_s;  // log(s), or NaN for a bad row
};

RL_HD RowStats finish(Acc a) {
  if (!row_ok(a)) return RowStats{canonical_nan(), canonical_nan(), canonical_nan()};
  return RowStats{flush(a.m), a.s, log_pos(a.s)};
}

// log p(x_i) = (x_i - m) - log(s), flushed; NaN for a bad row.
RL_HD float logprob(float x, RowStats st) {
  return (st.s >= 1.0f) ? flush((x - st.m) - st.log_s) : canonical_nan();
}

// Entropy term -p*log p of one element, with p = exp(lp); 0 where p == 0.
RL_HD float entropy_term(float lp) {
  const float p = exp_flushed(lp);
  return (p == 0.0f) ? 0.0f : flush(p * (0.0f - lp));
}

// A row's token log-prob epilogue shared by CPU and GPU: 0 for ignore_index,
// NaN for an id outside [0, V) (the Python API raises before it gets here).
template <class D>
RL_HD float token_logprob(const typename D::storage* row, int64_t V, int64_t tok,
                          int64_t ignore_index, RowStats st) {
  if (tok == ignore_index) return 0.0f;
  if (tok < 0 || tok >= V) return canonical_nan();
  return logprob(D::load(row, tok), st);
}

// d log_softmax: g_j - p_j * sum(g), p_j = exp(out_j).
RL_HD float log_softmax_grad(float g, float out, float gsum) {
  return canonical(flush(flush(g) - flush(exp_flushed(out) * gsum)));
}

// d token_logprob: g * ([j == tok] - p_j); 0 for ignore_index, NaN for an id
// outside [0, V) (whose forward value is NaN too).
RL_HD float token_logprob_grad_slice(float g, float lp, int64_t j, int64_t tok, int64_t ignore_index);

RL_HD float token_logprob_grad(float g, float lp, int64_t j, int64_t tok, int64_t V, int64_t ignore_index) {
  if (tok == ignore_index) return 0.0f;
  if (tok < 0 || tok >= V) return canonical_nan();
  return token_logprob_grad_slice(g, lp, j, tok, ignore_index);
}

// The same on a vocab-parallel rank's slice: tok is the slice's own index of the token, and one
// outside the slice belongs to another rank (the one-hot term is 0 here).
RL_HD float token_logprob_grad_slice(float g, float lp, int64_t j, int64_t tok, int64_t ignore_index) {
  if (tok == ignore_index) return 0.0f;
  return canonical(flush(g * ((j == tok ? 1.0f : 0.0f) - exp_flushed(lp))));
}

// d entropy: g * (-p_j * (lp_j + H)), 0 where p_j == 0.
RL_HD float entropy_grad(float g, float lp, float H) {
  const float p = exp_flushed(lp);
  const float w = (p == 0.0f) ? 0.0f : flush(p * (0.0f - (lp + H)));
  return canonical(flush(g * w));
}

// A logit's gradient when both log-probs and entropy are used, as autograd sums the two: each slice gradient
// stored in D, then torch's add of two D tensors (in float, rounded once to D: D::store's rounding for fp32 and
// bf16; fp16 is refused by the op, as torch rounds half its own way). Only a NaN's payload may differ from torch's
// (bf16: always the canonical NaN, where torch's vectorised CPU add writes 0xffff; fp32: the device's add's NaN, as
// torch's): every consumer of the head's gradient canonicalises or propagates it.
template <class D>
RL_HD typename D::storage autograd_sum(float a, float b) {
  const typename D::storage sa = D::store(a), sb = D::store(b);
  return D::store(D::load(&sa, 0) + D::load(&sb, 0));
}

// Column j of a slice row's logit gradient for log-probs (g, tok) and entropy (ge, H) together; columns at or past
// valid are padding (the sum of two zeros). The CPU executor and the GPU kernel both call it.
template <class D>
RL_HD typename D::storage logprobs_entropy_grad_at(const typename D::storage* row, int64_t j, int64_t valid,
                                                   RowStats st, float g, float ge, int64_t tok, int64_t ignore,
                                                   float H) {
  if (j >= valid) return autograd_sum<D>(0.0f, 0.0f);
  const float lp = logprob(D::load(row, j), st);
  return autograd_sum<D>(token_logprob_grad_slice(g, lp, j, tok, ignore), entropy_grad(ge, lp, H));
}

// ============================ CPU reference ==================================
// One row at a time: its leaves pushed left to right into a TreeStack (reduce.h),
// then the fold. The GPU evaluates the same tree in another order (common/rowtree.cuh).

template <class D>
inline RowStats cpu_row_stats(const typename D::storage* row, int64_t V) {
  TreeStack<Acc> st;
  push_range_stats(st, ScalarChunks<D>{row, V}, 0, chunks_of(V), V);
  return finish(st.fold());
}

template <class D>
inline void cpu_log_softmax_row(const typename D::storage* row, int64_t V, float* out) {
  const RowStats st = cpu_row_stats<D>(row, V);
  for (int64_t i = 0; i < V; ++i) out[i] = logprob(D::load(row, i), st);
}

template <class D>
struct EntropyTerms {
  using Elem = D;
  const typename D::storage* row;
  int64_t V;
  RowStats st;
  RL_HD static float pad() { return neg_inf(); }  // a term of 0 past the row's end
  RL_HD void from_x(float v[RL_CHUNK]) const {  // a chunk's values -> its terms
    RL_UNROLL(unroll)
    for (int j = 0; j < RL_CHUNK; ++j) v[j] = entropy_term(logprob(v[j], st));
  }
  RL_HD EntropyTerms shifted(int64_t chunks) const {
    return EntropyTerms{row + chunks * RL_CHUNK, V - chunks * RL_CHUNK, st};
  }
  RL_HD void operator()(int64_t c, float v[RL_CHUNK], bool full) const {
    const int64_t base = int64_t(c) * RL_CHUNK;
    RL_UNROLL(unroll)
    for (int j = 0; j < RL_CHUNK; ++j)
      v[j] = (full || base + j < V) ? entropy_term(logprob(D::load(row, base + j), st)) : 0.0f;
  }
};

template <class D>
inline float cpu_entropy_row(const typename D::storage* row, int64_t V, RowStats st) {
  if (!(st.s >= 1.0f)) return canonical_nan();
  return cpu_row_sum(EntropyTerms<D>{row, V, st}, V);
}

struct FlushedTerms {  // sum of a fp32 row (gradients), flushed per element
  using Elem = F32;
  const float* row;
  int64_t V;
  RL_HD static float pad() { return 0.0f; }
  RL_HD void from_x(float v[RL_CHUNK]) const {
    RL_UNROLL(unroll)
    for (int j = 0; j < RL_CHUNK; ++j) v[j] = flush(v[j]);
  }
  RL_HD FlushedTerms shifted(int64_t chunks) const { return FlushedTerms{row + chunks * RL_CHUNK, V - chunks * RL_CHUNK}; }
  RL_HD void operator()(int64_t c, float v[RL_CHUNK], bool full) const {
    const int64_t base = int64_t(c) * RL_CHUNK;
    RL_UNROLL(unroll)
    for (int j = 0; j < RL_CHUNK; ++j) v[j] = (full || base + j < V) ? flush(row[base + j]) : 0.0f;
  }
};

template <class O>
inline void cpu_log_softmax_backward_row(const float* g, const float* out, int64_t V, typename O::storage* gin) {
  const float gsum = cpu_row_sum(FlushedTerms{g, V}, V);
  for (int64_t i = 0; i < V; ++i) gin[i] = O::store(log_softmax_grad(g[i], out[i], gsum));
}

// ============================ GPU kernels ====================================
#if defined(RL_GPU_COMPILE)

// Every thread returns the row's statistics.
template <class D>
__device__ __forceinline__ RowStats block_stats(const typename D::storage* row, int64_t V) {
  return finish(block_acc<D>(row, V, chunks_of(V)));
}

__device__ __forceinline__ void store_stats(float* stats, int64_t r, RowStats st) {
  if (stats != nullptr && RL_TID == 0) {
    stats[3 * r] = st.m;
    stats[3 * r + 1] = st.s;
    stats[3 * r + 2] = st.log_s;
  }
}

template <class D>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    row_stats_kernel(int64_t row0, const typename D::storage* x, int64_t row_stride, int64_t V, float* stats) {
  const int64_t r = row0 + RL_ROW;
  store_stats(stats, r, block_stats<D>(x + r * row_stride, V));
}

template <class D>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    log_softmax_kernel(int64_t row0, const typename D::storage* x, int64_t row_stride, int64_t V, float* out) {
  const int64_t r = row0 + RL_ROW;
  const typename D::storage* row = x + r * row_stride;
  const RowStats st = block_stats<D>(row, V);
  float* orow = out + r * V;
  int64_t i = RL_TID;
  if (aligned16<D>(row) && (reinterpret_cast<uintptr_t>(orow) & 15u) == 0) {
    // 16-byte loads and stores, a chunk per thread (the same values, the same arithmetic per element).
    constexpr int W = Tile<D>::words;
    for (int64_t c = RL_TID; c < V / RL_CHUNK; c += RL_BLOCK) {
      uint4 w[W];
      RL_UNROLL(unroll)
      for (int q = 0; q < W; ++q) w[q] = reinterpret_cast<const uint4*>(row + c * RL_CHUNK)[q];
      float x[RL_CHUNK];
      decode_chunk<D>(w, x);
      float4* o = reinterpret_cast<float4*>(orow + c * RL_CHUNK);
      o[0] = make_float4(logprob(x[0], st), logprob(x[1], st), logprob(x[2], st), logprob(x[3], st));
      o[1] = make_float4(logprob(x[4], st), logprob(x[5], st), logprob(x[6], st), logprob(x[7], st));
    }
    i = V / RL_CHUNK * RL_CHUNK + RL_TID;
  }
  for (; i < V; i += RL_BLOCK) orow[i] = logprob(D::load(row, i), st);
}

template <class D>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    token_logprobs_kernel(int64_t row0, const typename D::storage* x, int64_t row_stride, int64_t V,
                          const int64_t* tokens, int64_t ignore_index, float* out, float* stats) {
  const int64_t r = row0 + RL_ROW;
  const typename D::storage* row = x + r * row_stride;
  const RowStats st = block_stats<D>(row, V);
  store_stats(stats, r, st);
  if (RL_TID == 0) out[r] = token_logprob<D>(row, V, tokens[r], ignore_index, st);
}

template <class D>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    entropy_kernel(int64_t row0, const typename D::storage* x, int64_t row_stride, int64_t V, float* out,
                   float* stats) {
  const int64_t r = row0 + RL_ROW;
  const typename D::storage* row = x + r * row_stride;
  const RowStats st = block_stats<D>(row, V);
  store_stats(stats, r, st);
  const float h = block_sum(EntropyTerms<D>{row, V, st}, V);
  if (RL_TID == 0) out[r] = (st.s >= 1.0f) ? h : canonical_nan();
}

template <class O>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    log_softmax_backward_kernel(int64_t row0, const float* g, const float* out, int64_t V, typename O::storage* gin) {
  const int64_t r = row0 + RL_ROW;
  const float* grow = g + r * V;
  const float* orow = out + r * V;
  const float gsum = block_sum(FlushedTerms{grow, V}, V);
  for (int64_t i = RL_TID; i < V; i += RL_BLOCK)
    gin[r * V + i] = O::store(log_softmax_grad(grow[i], orow[i], gsum));
}

template <class D>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    token_logprobs_backward_kernel(int64_t row0, const float* g, const typename D::storage* x, int64_t row_stride,
                                   int64_t V, const int64_t* tokens, const float* stats,
                                   int64_t ignore_index, typename D::storage* gin) {
  const int64_t r = row0 + RL_ROW;
  const typename D::storage* row = x + r * row_stride;
  const RowStats st{stats[3 * r], stats[3 * r + 1], stats[3 * r + 2]};
  const int64_t tok = tokens[r];
  for (int64_t i = RL_TID; i < V; i += RL_BLOCK)
    gin[r * V + i] = D::store(token_logprob_grad(g[r], logprob(D::load(row, i), st), i, tok, V, ignore_index));
}

template <class D>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    entropy_backward_kernel(int64_t row0, const float* g, const typename D::storage* x, int64_t row_stride,
                            int64_t V, const float* stats, const float* H, typename D::storage* gin) {
  const int64_t r = row0 + RL_ROW;
  const typename D::storage* row = x + r * row_stride;
  const RowStats st{stats[3 * r], stats[3 * r + 1], stats[3 * r + 2]};
  for (int64_t i = RL_TID; i < V; i += RL_BLOCK)
    gin[r * V + i] = D::store(entropy_grad(g[r], logprob(D::load(row, i), st), H[r]));
}

// Backward on a vocab-parallel rank's slice: columns at or past `valid` are padding (zero gradient).
template <class D>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    token_logprobs_backward_slice_kernel(int64_t row0, const float* g, const typename D::storage* x,
                                         int64_t row_stride, int64_t V, int64_t valid, const int64_t* tokens,
                                         const float* stats, int64_t ignore_index, typename D::storage* gin) {
  const int64_t r = row0 + RL_ROW;
  const typename D::storage* row = x + r * row_stride;
  const RowStats st{stats[3 * r], stats[3 * r + 1], stats[3 * r + 2]};
  const int64_t tok = tokens[r];
  for (int64_t i = RL_TID; i < V; i += RL_BLOCK)
    gin[r * V + i] = D::store(
        i < valid ? token_logprob_grad_slice(g[r], logprob(D::load(row, i), st), i, tok, ignore_index) : 0.0f);
}

template <class D>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    entropy_backward_slice_kernel(int64_t row0, const float* g, const typename D::storage* x, int64_t row_stride,
                                  int64_t V, int64_t valid, const float* stats, const float* H,
                                  typename D::storage* gin) {
  const int64_t r = row0 + RL_ROW;
  const typename D::storage* row = x + r * row_stride;
  const RowStats st{stats[3 * r], stats[3 * r + 1], stats[3 * r + 2]};
  for (int64_t i = RL_TID; i < V; i += RL_BLOCK)
    gin[r * V + i] = D::store(i < valid ? entropy_grad(g[r], logprob(D::load(row, i), st), H[r]) : 0.0f);
}

// Both slice backwards in one pass (the fused head's chunks when log-probs and entropy are both used): the bits of
// token_logprobs_backward_slice + entropy_backward_slice as autograd adds them (autograd_sum).
template <class D>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    logprobs_entropy_backward_slice_kernel(int64_t row0, const float* g, const float* ge,
                                           const typename D::storage* x, int64_t row_stride, int64_t V,
                                           int64_t valid, const int64_t* tokens, const float* stats, const float* H,
                                           int64_t ignore_index, typename D::storage* gin) {
  const int64_t r = row0 + RL_ROW;
  const typename D::storage* row = x + r * row_stride;
  const RowStats st{stats[3 * r], stats[3 * r + 1], stats[3 * r + 2]};
  for (int64_t i = RL_TID; i < V; i += RL_BLOCK)
    gin[r * V + i] = logprobs_entropy_grad_at<D>(row, i, valid, st, g[r], ge[r], tokens[r], ignore_index, H[r]);
}

// ---- node kernels of the family: one warp per (row, node) (common/rowtree.cuh's node_stats_kernel
// computes the statistics); then one thread per row joins the nodes -----------------------------------
template <class D>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    node_entropy_kernel(int64_t row0, const typename D::storage* x, int64_t row_stride, int64_t valid,
                        int64_t chunk0, NodeList nl, const float* stats, float* out) {
  const int64_t r = row0 + RL_ROW, j = node_of_warp();
  if (j >= nl.n) return;
  const NodeRange nr = node_range(chunk0, valid, nl.level(j), nl.index(j));
  const int64_t off = nr.first * RL_CHUNK;
  const RowStats st{stats[3 * r], stats[3 * r + 1], stats[3 * r + 2]};
  const int64_t V = valid - off;
  const float h = warp_any_node(leaf_sum(EntropyTerms<D>{x + r * row_stride + off, V, st}), nl.level(j), nr.n,
                                sum_empty());
  if (lane_id() == 0) out[r * nl.n + j] = h;
}

template <class D>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    slice_entropy_kernel(int64_t row0, const typename D::storage* x, int64_t row_stride, int64_t valid,
                         int64_t chunk0, int64_t nodes, const float* stats, float* out) {
  const int64_t r = row0 + RL_ROW;
  const RowStats st{stats[3 * r], stats[3 * r + 1], stats[3 * r + 2]};
  __shared__ float vals[RL_MAX_NODES];
  const int k = block_slice_nodes(leaf_sum(EntropyTerms<D>{x + r * row_stride, valid, st}), chunk0,
                                  chunks_of(valid), sum_empty(), vals);
  if (RL_TID == 0)
    for (int j = 0; j < k && j < nodes; ++j) out[r * nodes + j] = vals[j];
}

// slice_entropy_kernel over many rows: one warp per (row, node) (common/rowtree.cuh's slice_stats_warp_kernel).
template <class D>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    slice_entropy_warp_kernel(int64_t row0, int64_t row_end, const typename D::storage* x, int64_t row_stride,
                              int64_t valid, int64_t chunk0, int64_t nodes, const float* stats, float* out) {
  const int64_t r = row_of_warp_in(row0);
  if (r >= row_end) return;
  const SliceNode sn = slice_node(chunk0, chunk0 + chunks_of(valid), RL_NODE);
  const int64_t off = sn.first * RL_CHUNK;
  const RowStats st{stats[3 * r], stats[3 * r + 1], stats[3 * r + 2]};
  const float h = warp_any_node(leaf_sum(EntropyTerms<D>{x + r * row_stride + off, valid - off, st}), sn.L,
                                int64_t(1) << sn.L, sum_empty());
  if (lane_id() == 0) out[r * nodes + RL_NODE] = h;
}

__device__ __forceinline__ RowStats join_row_stats(int64_t r, const float* part, const NodeList& nl, float* stats) {
  const RowStats st = finish(join_stats_nodes(part + 2 * r * nl.n, nl));
  if (stats != nullptr) {
    stats[3 * r] = st.m;
    stats[3 * r + 1] = st.s;
    stats[3 * r + 2] = st.log_s;
  }
  return st;
}

__global__ void join_stats_kernel(int64_t rows, const float* part, NodeList nl, float* stats) {
  const int64_t r = RL_ROW * RL_BLOCK + RL_TID;
  if (r < rows) join_row_stats(r, part, nl, stats);
}

__global__ void join_sum_kernel(int64_t rows, const float* part, NodeList nl, const float* stats, float* out) {
  const int64_t r = RL_ROW * RL_BLOCK + RL_TID;
  if (r >= rows) return;
  const float h = join_sum_nodes(part + r * nl.n, nl);
  out[r] = (stats[3 * r + 1] >= 1.0f) ? h : canonical_nan();
}


__device__ __forceinline__ RowStats join_parts_stats(int64_t r, const float* part, int64_t n, int L, float* stats) {
  const float* p = part + 2 * r * n;
  const RowStats st = finish(warp_join_parts([&](int64_t k) { return Acc{p[2 * k], p[2 * k + 1]}; }, n, L,
                                             acc_empty()));
  if (stats != nullptr && lane_id() == 0) {
    stats[3 * r] = st.m;
    stats[3 * r + 1] = st.s;
    stats[3 * r + 2] = st.log_s;
  }
  return st;
}

__global__ void __launch_bounds__(RL_BLOCK)
    join_parts_stats_kernel(int64_t rows, const float* part, int64_t n, int L, float* stats) {
  const int64_t r = row_of_warp();
  if (r < rows) join_parts_stats(r, part, n, L, stats);
}

template <class D>
__global__ void __launch_bounds__(RL_BLOCK)
    join_parts_token_kernel(int64_t rows, const float* part, int64_t n, int L, const typename D::storage* x,
                            int64_t row_stride, int64_t V, const int64_t* tokens, int64_t ignore_index, float* out,
                            float* stats) {
  const int64_t r = row_of_warp();
  if (r >= rows) return;
  const RowStats st = join_parts_stats(r, part, n, L, stats);
  if (lane_id() == 0) out[r] = token_logprob<D>(x + r * row_stride, V, tokens[r], ignore_index, st);
}

__global__ void __launch_bounds__(RL_BLOCK)
    join_parts_sum_kernel(int64_t rows, const float* part, int64_t n, int L, const float* stats, float* out) {
  const int64_t r = row_of_warp();
  if (r >= rows) return;
  const float* p = part + r * n;
  const float h = warp_join_parts([&](int64_t k) { return p[k]; }, n, L, sum_empty());
  if (lane_id() == 0) out[r] = (stats[3 * r + 1] >= 1.0f) ? h : canonical_nan();
}

#endif  // RL_GPU_COMPILE

}  // namespace rl
