// The softmax family: row statistics, log_softmax, token log-probs and entropy,
// forward and backward. Each GPU kernel has its CPU reference beside it (as
// llm.c does); both call the same contract functions of common/, so the CPU
// build is the golden reference for the CUDA and HIP builds.
// This file needs no ATen: it is also compiled alone by `make kernels-check`.
#pragma once

#include "../common/dtypes.h"
#include "../common/reduce.h"

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

// Element-by-element chunk loader; -inf past the row end.
template <class D>
struct ScalarChunks {
  const typename D::storage* row;
  int64_t V;
  RL_HD void operator()(int64_t c, float x[RL_CHUNK], bool full) const {
    const int64_t base = int64_t(c) * RL_CHUNK;
    RL_UNROLL(unroll)
    for (int j = 0; j < RL_CHUNK; ++j) x[j] = (full || base + j < V) ? D::load(row, base + j) : neg_inf();
  }
};

// A row's token log-prob epilogue shared by CPU and GPU: 0 for ignore_index,
// NaN for an id outside [0, V) (the Python API raises before it gets here).
template <class D>
RL_HD float token_logprob(const typename D::storage* row, int64_t V, int64_t tok,
                          int64_t ignore_index, RowStats st) {
  if (tok == ignore_index) return 0.0f;
  if (tok < 0 || tok >= V) return canonical_nan();
  return logprob(D::load(row, tok), st);
}

RL_HD float canonical(float x) { return (x != x) ? canonical_nan() : x; }

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

// ============================ CPU reference ==================================
// One row at a time: its leaves pushed left to right into a TreeStack (reduce.h),
// then the fold. The GPU evaluates the same tree in another order (block_tree).

template <class D>
inline RowStats cpu_row_stats(const typename D::storage* row, int64_t V) {
  TreeStack<Acc> st;
  push_range_stats(st, ScalarChunks<D>{row, V}, 0, chunks_of(V), V);
  return finish(st.fold());
}

template <class Term>
inline float cpu_row_sum(const Term& term, int64_t V) {
  TreeStack<float> st;
  push_range_sum(st, term, 0, chunks_of(V), V);
  return st.fold();
}

template <class D>
inline void cpu_log_softmax_row(const typename D::storage* row, int64_t V, float* out) {
  const RowStats st = cpu_row_stats<D>(row, V);
  for (int64_t i = 0; i < V; ++i) out[i] = logprob(D::load(row, i), st);
}

template <class D>
struct EntropyTerms {
  const typename D::storage* row;
  int64_t V;
  RowStats st;
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
  const float* row;
  int64_t V;
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

// ---- cutting the row (vocab-parallel ranks, several blocks per row) ---------------
// A slice of a row: `valid` elements from global element 8 * chunk0 (columns past the true
// vocabulary are not valid: they are the empty node, whatever they hold). Node (L, i) of the
// row's tree covers global chunks [i * 2^L, (i+1) * 2^L), local chunks from (i << L) - chunk0.
struct NodeRange {
  int64_t first;  // first local chunk
  int64_t n;      // chunks of the node inside the slice's valid chunks (2^L for a whole node)
};

RL_HD NodeRange node_range(int64_t chunk0, int64_t valid, int L, int64_t i) {
  const int64_t first = (i << L) - chunk0;
  const int64_t left = chunks_of(valid) - first;
  const int64_t size = int64_t(1) << L;
  return NodeRange{first, left < size ? left : size};
}

template <class D>
inline Acc cpu_node_stats(const typename D::storage* row, int64_t valid, int64_t chunk0, int L, int64_t i) {
  const NodeRange nr = node_range(chunk0, valid, L, i);
  const ScalarChunks<D> load{row, valid};
  TreeStack<Acc> st;
  for (int64_t c = nr.first; c < nr.first + nr.n; ++c) st.push(0, c + chunk0, leaf_of(load, c, valid));
  return nr.n > 0 ? st.fold() : acc_empty();
}

template <class Term>
inline float cpu_node_sum(const Term& term, int64_t valid, int64_t chunk0, int L, int64_t i) {
  const NodeRange nr = node_range(chunk0, valid, L, i);
  TreeStack<float> st;
  for (int64_t c = nr.first; c < nr.first + nr.n; ++c) st.push(0, c + chunk0, leaf_of_sum(term, c, valid));
  return nr.n > 0 ? st.fold() : sum_empty();
}

// Nodes of the row's tree, left to right: given as arrays (a vocab-parallel layout), or `n` nodes of
// one level (a row cut into equal aligned parts, the last one holding the row's end).
struct NodeList {
  const int64_t* levels;  // nullptr: node k is (uniform_level, k)
  const int64_t* indices;
  int64_t n;
  int uniform_level;
  RL_HD int level(int64_t k) const { return levels ? int(levels[k]) : uniform_level; }
  RL_HD int64_t index(int64_t k) const { return levels ? indices[k] : k; }
};

// The root of the row's tree from node values that tile it left to right (every rank's nodes).
RL_HD Acc join_stats_nodes(const float* part, const NodeList& nl) {
  TreeStack<Acc> st;
  for (int64_t k = 0; k < nl.n; ++k) st.push(nl.level(k), nl.index(k), Acc{part[2 * k], part[2 * k + 1]});
  return nl.n > 0 ? st.fold() : acc_empty();
}

RL_HD float join_sum_nodes(const float* part, const NodeList& nl) {
  TreeStack<float> st;
  for (int64_t k = 0; k < nl.n; ++k) st.push(nl.level(k), nl.index(k), part[k]);
  return nl.n > 0 ? st.fold() : sum_empty();
}

// ============================ GPU kernels ====================================
#if defined(RL_GPU_COMPILE)

constexpr int RL_BLOCK = 256;  // threads of a block, one row (or one node of a row) per block

// Blocks per multiprocessor the compiler must fit (caps registers); tuning only.
#ifndef RL_MIN_BLOCKS
#define RL_MIN_BLOCKS 1
#endif

// Thread and block index. On AMD the compiler builtins are used directly, so the
// device code calls no device-library function (the static check demands none).
#if defined(__HIP_DEVICE_COMPILE__)
#define RL_TID (int(__builtin_amdgcn_workitem_id_x()))
#define RL_ROW (int64_t(__builtin_amdgcn_workgroup_id_x()))
#define RL_NODE (int64_t(__builtin_amdgcn_workgroup_id_y()))
#define RL_SYNC()                                             \
  do {                                                        \
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");    \
    __builtin_amdgcn_s_barrier();                             \
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");    \
  } while (0)
#else
#define RL_TID (int(threadIdx.x))
#define RL_ROW (int64_t(blockIdx.x))
#define RL_NODE (int64_t(blockIdx.y))
#define RL_SYNC() __syncthreads()
#endif

// Chunk loader with 16-byte loads, for rows aligned to 16 bytes; the values (and
// so the arithmetic) are those of ScalarChunks.
template <class D>
struct VecChunks {
  const typename D::storage* row;
  int64_t V;
  __device__ __forceinline__ void operator()(int64_t c, float x[RL_CHUNK], bool full) const {
    if (full) {
      load_full(row + int64_t(c) * RL_CHUNK, x);
    } else {
      ScalarChunks<D>{row, V}(c, x, false);
    }
  }
  __device__ __forceinline__ static void load_full(const uint16_t* p, float x[RL_CHUNK]) {
    const uint4 w = *reinterpret_cast<const uint4*>(p);
    const uint32_t u[4] = {w.x, w.y, w.z, w.w};
    RL_UNROLL(unroll)
    for (int j = 0; j < 4; ++j) {  // little endian: element 2j is the low half
      x[2 * j] = D::from_bits(uint16_t(u[j] & 0xffffu));
      x[2 * j + 1] = D::from_bits(uint16_t(u[j] >> 16));
    }
  }
  __device__ __forceinline__ static void load_full(const float* p, float x[RL_CHUNK]) {
    const float4 a = *reinterpret_cast<const float4*>(p);
    const float4 b = *reinterpret_cast<const float4*>(p + 4);
    x[0] = a.x; x[1] = a.y; x[2] = a.z; x[3] = a.w;
    x[4] = b.x; x[5] = b.y; x[6] = b.z; x[7] = b.w;
  }
};

template <class D>
__device__ __forceinline__ bool aligned16(const typename D::storage* row) {
  return (reinterpret_cast<uintptr_t>(row) & 15u) == 0;
}

// ---- the row tree in one block ----------------------------------------------
// A block evaluates the tree over n chunks (a whole row from chunk 0, or one aligned node)
// tile by tile: a tile is RL_TILE = RL_BLOCK * RL_GROUP consecutive chunks, an aligned node
// of level RL_TILE_LEVEL. Thread t joins the RL_GROUP leaves of its chunks (an in-thread
// subtree), the block joins the RL_BLOCK group nodes pairwise in shared memory (neighbours,
// one level per barrier), and thread 0 pushes the tile's node into a TreeStack. Chunks at
// or past n are the empty node. RL_GROUP changes the schedule, never the tree.
#ifndef RL_GROUP
#define RL_GROUP 4
#endif
constexpr int RL_TILE = RL_BLOCK * RL_GROUP;
constexpr int log2_of(int n) { return n <= 1 ? 0 : 1 + log2_of(n / 2); }
constexpr int RL_TILE_LEVEL = log2_of(RL_TILE);
static_assert((RL_GROUP & (RL_GROUP - 1)) == 0 && (RL_BLOCK & (RL_BLOCK - 1)) == 0, "powers of two");
// Tiles of one block: a TreeStack of 40 holds any row below 2^40 tiles.
constexpr int RL_TILE_STACK = 40;

template <class P, class Leaf>
__device__ __forceinline__ P block_tree(const Leaf& leaf, int64_t n, P empty, P* sh) {
  const int t = RL_TID;
  TreeStack<P, RL_TILE_STACK> st;
  const int64_t ntiles = (n + RL_TILE - 1) / RL_TILE;
  for (int64_t k = 0; k < ntiles; ++k) {
    const int64_t c0 = k * RL_TILE + int64_t(t) * RL_GROUP;
    P g[RL_GROUP];
    RL_UNROLL(unroll)
    for (int j = 0; j < RL_GROUP; ++j) g[j] = (c0 + j < n) ? leaf(c0 + j) : empty;
    RL_UNROLL(unroll)
    for (int w = 1; w < RL_GROUP; w <<= 1) {
      RL_UNROLL(unroll)
      for (int j = 0; j < RL_GROUP; j += 2 * w) g[j] = join(g[j], g[j + w]);
    }
    sh[t] = g[0];
    RL_SYNC();
    for (int s = 1; s < RL_BLOCK; s <<= 1) {
      if (t < RL_BLOCK / (2 * s)) sh[2 * s * t] = join(sh[2 * s * t], sh[2 * s * t + s]);
      RL_SYNC();
    }
    if (t == 0) st.push(RL_TILE_LEVEL, k, sh[0]);
  }
  RL_SYNC();  // sh[0] is read by thread 0 above before anyone writes it below
  if (t == 0) sh[0] = (ntiles > 0) ? st.fold() : empty;
  RL_SYNC();
  const P r = sh[0];
  RL_SYNC();  // sh is reused by the next call
  return r;
}

template <class Load>
struct LeafStats {
  Load load;
  int64_t V;
  __device__ __forceinline__ Acc operator()(int64_t c) const { return leaf_of(load, c, V); }
};

template <class Term>
struct LeafSum {
  Term term;
  int64_t V;
  __device__ __forceinline__ float operator()(int64_t c) const { return leaf_of_sum(term, c, V); }
};

// The tree over the first n chunks of a row of V elements (every thread returns it).
template <class D>
__device__ __forceinline__ Acc block_acc(const typename D::storage* row, int64_t V, int64_t n) {
  __shared__ Acc sh[RL_BLOCK];
  return aligned16<D>(row) ? block_tree(LeafStats<VecChunks<D>>{{row, V}, V}, n, acc_empty(), sh)
                           : block_tree(LeafStats<ScalarChunks<D>>{{row, V}, V}, n, acc_empty(), sh);
}

// Every thread returns the row's statistics.
template <class D>
__device__ __forceinline__ RowStats block_stats(const typename D::storage* row, int64_t V) {
  return finish(block_acc<D>(row, V, chunks_of(V)));
}

__device__ __forceinline__ float* node_sum_shared() {
  __shared__ float sh[RL_BLOCK];
  return sh;
}

template <class Term>
__device__ __forceinline__ float block_sum(const Term& term, int64_t V) {
  return block_tree(LeafSum<Term>{term, V}, chunks_of(V), sum_empty(), node_sum_shared());
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
  for (int64_t i = RL_TID; i < V; i += RL_BLOCK) orow[i] = logprob(D::load(row, i), st);
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

// ---- node kernels: one block per (row, node); then one thread per row joins the nodes ----------
// Block (x, y) of the launch is node y of row row0 + x (no integer division on the device: AMD lowers
// it through v_rcp_f32). The node's chunks start a row of their own (row + 8 * first), so
// block_tree's alignment is the node's.
template <class D>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    node_stats_kernel(int64_t row0, const typename D::storage* x, int64_t row_stride, int64_t valid, int64_t chunk0,
                      NodeList nl, float* out) {
  const int64_t r = row0 + RL_ROW, j = RL_NODE, b = r * nl.n + j;
  const NodeRange nr = node_range(chunk0, valid, nl.level(j), nl.index(j));
  const int64_t off = nr.first * RL_CHUNK;
  const Acc a = block_acc<D>(x + r * row_stride + off, valid - off, nr.n);
  if (RL_TID == 0) {
    out[2 * b] = a.m;
    out[2 * b + 1] = a.s;
  }
}

template <class D>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    node_entropy_kernel(int64_t row0, const typename D::storage* x, int64_t row_stride, int64_t valid,
                        int64_t chunk0, NodeList nl, const float* stats, float* out) {
  const int64_t r = row0 + RL_ROW, j = RL_NODE, b = r * nl.n + j;
  const NodeRange nr = node_range(chunk0, valid, nl.level(j), nl.index(j));
  const int64_t off = nr.first * RL_CHUNK;
  const RowStats st{stats[3 * r], stats[3 * r + 1], stats[3 * r + 2]};
  const typename D::storage* row = x + r * row_stride + off;
  const float h = block_tree(LeafSum<EntropyTerms<D>>{{row, valid - off, st}, valid - off}, nr.n, sum_empty(),
                             node_sum_shared());
  if (RL_TID == 0) out[b] = h;
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

// The join, then the token's log-prob (a row cut into parts, token_logprobs).
template <class D>
__global__ void join_token_kernel(int64_t rows, const float* part, NodeList nl, const typename D::storage* x,
                                  int64_t row_stride, int64_t V, const int64_t* tokens, int64_t ignore_index,
                                  float* out, float* stats) {
  const int64_t r = RL_ROW * RL_BLOCK + RL_TID;
  if (r >= rows) return;
  const RowStats st = join_row_stats(r, part, nl, stats);
  out[r] = token_logprob<D>(x + r * row_stride, V, tokens[r], ignore_index, st);
}

__global__ void join_sum_kernel(int64_t rows, const float* part, NodeList nl, const float* stats, float* out) {
  const int64_t r = RL_ROW * RL_BLOCK + RL_TID;
  if (r >= rows) return;
  const float h = join_sum_nodes(part + r * nl.n, nl);
  out[r] = (stats[3 * r + 1] >= 1.0f) ? h : canonical_nan();
}

#endif  // RL_GPU_COMPILE

}  // namespace rl
