// The softmax family: row statistics, log_softmax, token log-probs and entropy,
// forward and backward. Each GPU kernel has its CPU reference beside it (as
// llm.c does); both call the same contract functions of common/, so the CPU
// build is the golden reference for the CUDA and HIP builds.
// This file needs no ATen: it is also compiled alone by `make kernels-check`.
#pragma once

#include "../common/dtypes.h"
#include "../common/reduce.h"
#include "../common/gpu.h"

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
  using Elem = D;
  const typename D::storage* row;
  int64_t V;
  RL_HD ScalarChunks shifted(int64_t chunks) const { return ScalarChunks{row + chunks * RL_CHUNK, V - chunks * RL_CHUNK}; }
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

// Blocks per multiprocessor the compiler must fit (caps registers: 64 per thread at 4, measured best on
// the H200 of 1, 4; bench/tune_h200.sh); tuning only.
#ifndef RL_MIN_BLOCKS
#define RL_MIN_BLOCKS 4
#endif

template <class D>
__device__ __forceinline__ bool aligned16(const typename D::storage* row) {
  return (reinterpret_cast<uintptr_t>(row) & 15u) == 0;
}

// ---- the row tree on the GPU: warps own whole nodes -------------------------------------------
// Every level below is a schedule of the same tree (reduce.h), never another tree:
//   * a warp tile: 32 lanes x 128 consecutive bytes (8 chunks of 16-bit values, 4 of fp32), an aligned
//     node of level 8 (7 for fp32). Each lane joins the leaves of its chunks as they come (an in-lane
//     subtree), then 5 shuffle levels join neighbouring lanes (xor 1, 2, ..., 16; the lower lane's
//     node on the left).
//   * a warp node: a node of any level evaluated by one warp, tile by tile.
//   * a row in one block: warps take the row's nodes of level RL_WARP_NODE_LEVEL round robin, the
//     node values go to shared memory, and warp 0 joins up to 256 of them (8 per lane, then the
//     shuffles: an aligned node 8 levels higher); longer rows push those into a TreeStack.
// Chunks at or past n are the empty node (the exact identity of join), so a node that holds the
// row's end is the tree with its empty right part, as the contract says.
constexpr int RL_LANE_CHUNKS = 8;                        // node values per lane in a block's row join
constexpr int RL_WARP_TILE = RL_WARP * RL_LANE_CHUNKS;   // node values joined at once (one level-8 group)
constexpr int RL_WARP_TILE_LEVEL = 8;
constexpr int RL_WARPS = RL_BLOCK / RL_WARP;
#ifndef RL_WARP_NODE_LEVEL
#define RL_WARP_NODE_LEVEL 9
#endif
constexpr int RL_ROW_GROUP = RL_WARP_TILE;  // node values warp 0 joins at once
static_assert(RL_WARP_TILE == (1 << RL_WARP_TILE_LEVEL) && RL_WARP_NODE_LEVEL >= RL_WARP_TILE_LEVEL, "shape");

__device__ __forceinline__ Acc shfl_xor(Acc a, int mask) { return Acc{shfl_xor(a.m, mask), shfl_xor(a.s, mask)}; }

// The tree over 32 lanes' values (lane l holding node l of one level): every lane gets the root.
template <class P>
__device__ __forceinline__ P warp_join(P v) {
  const int lane = lane_id();
#if defined(RL_MUTATIONS)
  if (RL_MUTATED(RL_MUT_TREE_ORDER)) {  // the shuffle levels in reverse: lanes l and l ^ 16 first, a wrong tree
    for (int m = RL_WARP >> 1; m > 0; m >>= 1) {
      const P o = shfl_xor(v, m);
      v = (lane & m) ? join(o, v) : join(v, o);
    }
    return v;
  }
#endif
  RL_UNROLL(unroll)
  for (int m = 1; m < RL_WARP; m <<= 1) {
    const P o = shfl_xor(v, m);
    v = (lane & m) ? join(o, v) : join(v, o);
  }
  return v;
}

// The in-lane subtree of 8 values, in place; g[0] is its root.
template <class P>
__device__ __forceinline__ P lane_join(P g[RL_LANE_CHUNKS]) {
  RL_UNROLL(unroll)
  for (int w = 1; w < RL_LANE_CHUNKS; w <<= 1) {
    RL_UNROLL(unroll)
    for (int j = 0; j < RL_LANE_CHUNKS; j += 2 * w) g[j] = join(g[j], g[j + w]);
  }
  return g[0];
}

// ---- loading a lane's chunks --------------------------------------------------------------------
// A lane's chunks are consecutive (128 bytes: 8 chunks of 16-bit values, 4 of fp32), so loading them
// directly would make every load instruction touch 32 cache lines. A full tile of an aligned row is
// instead loaded coalesced (16-byte words, lane l taking words l, l + 32, ...) into the warp's own
// shared memory, and each lane reads its chunks from there (one pad word per 8 words keeps both sides
// free of bank conflicts). Other tiles (the row's end, rows not aligned to 16 bytes) load element by
// element. Either way the values, and so the arithmetic, are the same.
constexpr int RL_TILE_WORDS = RL_WARP * 8;  // 16-byte words of one warp tile (4 KiB)
constexpr int RL_STAGE_WORDS = RL_TILE_WORDS + RL_TILE_WORDS / 8;

template <class D>
struct Tile {
  static constexpr int words = int(sizeof(typename D::storage)) * RL_CHUNK / 16;  // per chunk: 1 or 2
  static constexpr int lane_chunks = 8 / words;                                  // 8 or 4
  static constexpr int chunks = RL_WARP * lane_chunks;                           // 256 or 128
  static constexpr int level = lane_chunks == 8 ? 8 : 7;
  static_assert(chunks == (1 << level) && chunks * words == RL_TILE_WORDS, "tile shape");
};

__device__ __forceinline__ uint4* warp_stage() {
  __shared__ uint4 stage[RL_WARPS][RL_STAGE_WORDS];
  return stage[warp_id()];
}

template <class D>
__device__ __forceinline__ void decode_chunk(const uint4* w, float x[RL_CHUNK]) {
  if constexpr (Tile<D>::words == 2) {
    const uint32_t u[8] = {w[0].x, w[0].y, w[0].z, w[0].w, w[1].x, w[1].y, w[1].z, w[1].w};
    RL_UNROLL(unroll)
    for (int j = 0; j < RL_CHUNK; ++j) x[j] = float_of(u[j]);
  } else {
    const uint32_t u[4] = {w[0].x, w[0].y, w[0].z, w[0].w};
    RL_UNROLL(unroll)
    for (int j = 0; j < 4; ++j) {  // little endian: element 2j is the low half
      x[2 * j] = D::from_bits(uint16_t(u[j] & 0xffffu));
      x[2 * j + 1] = D::from_bits(uint16_t(u[j] >> 16));
    }
  }
}

__device__ __forceinline__ void stage_tile(uint4* my, const void* tile) {
  const uint4* src = reinterpret_cast<const uint4*>(tile);
  RL_UNROLL(unroll)
  for (int j = 0; j < RL_TILE_WORDS / RL_WARP; ++j) {
    const int k = j * RL_WARP + lane_id();
    my[k + k / 8] = src[k];
  }
}

template <class D>
__device__ __forceinline__ void staged_chunk(const uint4* my, int local, float x[RL_CHUNK]) {
  constexpr int W = Tile<D>::words;
  uint4 w[W];
  RL_UNROLL(unroll)
  for (int q = 0; q < W; ++q) {
    const int k = local * W + q;
    w[q] = my[k + k / 8];
  }
  decode_chunk<D>(w, x);
}

// Element by element, `pad` past the row's end (the leaf's own padding).
template <class D>
__device__ __forceinline__ void direct_chunk(const typename D::storage* row, int64_t V, int64_t c, float pad,
                                             float x[RL_CHUNK]) {
  const int64_t base = c * RL_CHUNK;
  RL_UNROLL(unroll)
  for (int j = 0; j < RL_CHUNK; ++j) x[j] = (base + j < V) ? D::load(row, base + j) : pad;
}

// Up to 8 aligned nodes of one level, left to right, joined as they come (a binary counter); result(k)
// after k of them is the tree over 8 with the missing ones empty (a right fold of what is pending).
template <class P>
struct Counter8 {
  P p0, p1, p2, all;
  __device__ __forceinline__ void push(int i, P v) {
    if (!(i & 1)) { p0 = v; return; }
    v = join(p0, v);
    if (!(i & 2)) { p1 = v; return; }
    v = join(p1, v);
    if (!(i & 4)) { p2 = v; return; }
    all = join(p2, v);
  }
  __device__ __forceinline__ P result(int k, P empty) const {
    if (k >= 8) return all;
    P r = empty;
    bool have = false;
    if (k & 1) { r = p0; have = true; }
    if (k & 2) { r = have ? join(p1, r) : p1; have = true; }
    if (k & 4) { r = have ? join(p2, r) : p2; have = true; }
    return r;
  }
};

// The warp tile of chunks [c0, c0 + Tile<D>::chunks), chunks at or past n empty: each lane's leaves
// joined as they come (the in-lane subtree), then the warp. Every lane gets it.
template <class P, class Leaf>
__device__ __forceinline__ P warp_tile(const Leaf& leaf, int64_t c0, int64_t n, P empty) {
  using D = typename Leaf::Elem;
  constexpr int LC = Tile<D>::lane_chunks;
  constexpr int W = Tile<D>::words;
  uint4* my = warp_stage();
  const int64_t base = c0 + int64_t(lane_id()) * LC;
  const bool aligned = aligned16<D>(leaf.row);
  const int64_t whole = leaf.V / RL_CHUNK < n ? leaf.V / RL_CHUNK : n;  // chunks with no element past the row
  Counter8<P> cnt;
  if (aligned && c0 + Tile<D>::chunks <= whole) {  // every chunk of the tile: unrolled, the counter's joins fixed
    stage_tile(my, leaf.row + c0 * RL_CHUNK);
    RL_WARP_SYNC();
    RL_UNROLL(unroll)
    for (int i = 0; i < LC; ++i) {
      float x[RL_CHUNK];
      staged_chunk<D>(my, lane_id() * LC + i, x);
      cnt.push(i, leaf.from_x(x));
    }
    RL_WARP_SYNC();  // the next tile overwrites the stage
    return warp_join(cnt.result(LC, empty));
  }
  // A tile that ends early (a node's or the row's end): its whole chunks staged as far as they go, the row's
  // partial last chunk element by element (padded), chunks at or past n empty.
  const int64_t staged = aligned && whole > c0 ? whole - c0 : 0;  // chunks of this tile that are staged
  if (staged > 0) {
    const uint4* src = reinterpret_cast<const uint4*>(leaf.row + c0 * RL_CHUNK);
    for (int k = lane_id(); k < staged * W && k < RL_TILE_WORDS; k += RL_WARP) my[k + k / 8] = src[k];
    RL_WARP_SYNC();
  }
#pragma unroll 1
  for (int i = 0; i < LC; ++i) {
    P v = empty;
    if (base + i < n) {
      float x[RL_CHUNK];
      if (base + i - c0 < staged)
        staged_chunk<D>(my, lane_id() * LC + i, x);
      else
        direct_chunk<D>(leaf.row, leaf.V, base + i, Leaf::pad(), x);
      v = leaf.from_x(x);
    }
    cnt.push(i, v);
  }
  if (staged > 0) RL_WARP_SYNC();
  return warp_join(cnt.result(LC, empty));
}

// Node of level L (>= the tile's) whose chunks are [0, 2^L) of leaf's row, chunks at or past n empty.
template <class P, class Leaf>
__device__ __forceinline__ P warp_node(const Leaf& leaf, int L, int64_t n, P empty) {
  using D = typename Leaf::Elem;
  constexpr int64_t TC = Tile<D>::chunks;
  const int64_t size = int64_t(1) << L;
  const int64_t tiles = ((n < size ? n : size) + TC - 1) / TC;
  if (tiles <= 8) {  // the common case (nodes of level 9: 2 or 4 tiles) without the stack
    Counter8<P> cnt;
#pragma unroll 1
    for (int k = 0; k < int(tiles); ++k) cnt.push(k, warp_tile(leaf, k * TC, n, empty));
    return cnt.result(int(tiles), empty);
  }
  TreeStack<P, 40> st;
#pragma unroll 1
  for (int64_t k = 0; k < tiles; ++k) st.push(Tile<D>::level, k, warp_tile(leaf, k * TC, n, empty));
  return st.fold();
}

// A node of any level L (>= 0) by one warp: below level 8 it is the subtree of its (empty-padded)
// warp tile, since it starts the tile.
template <class P, class Leaf>
__device__ __forceinline__ P warp_any_node(const Leaf& leaf, int L, int64_t n, P empty) {
  const int64_t size = int64_t(1) << L;
  return L < Tile<typename Leaf::Elem>::level ? warp_tile(leaf, 0, n < size ? n : size, empty)
                                             : warp_node(leaf, L, n, empty);
}

// The whole tree over chunks [0, n) by one block; every thread gets the root.
template <class P, class Leaf>
__device__ __forceinline__ P block_tree(const Leaf& leaf, int64_t n, P empty, P* sh) {
  constexpr int64_t node = int64_t(1) << RL_WARP_NODE_LEVEL;
  const int64_t nodes = (n + node - 1) / node;
  const int w = warp_id();
  TreeStack<P, 24> st;  // groups of 256 nodes (thread 0 only)
  for (int64_t g0 = 0; g0 < nodes; g0 += RL_ROW_GROUP) {
    for (int64_t j = g0 + w; j < g0 + RL_ROW_GROUP && j < nodes; j += RL_WARPS) {
      const int64_t off = j * node;
      const Leaf lj = leaf.shifted(off);
      const P v = warp_node(lj, RL_WARP_NODE_LEVEL, n - off, empty);
      if (lane_id() == 0) sh[j - g0] = v;
    }
    RL_SYNC();
    if (w == 0) {
      const int64_t have = (nodes - g0 < RL_ROW_GROUP) ? nodes - g0 : RL_ROW_GROUP;
      P g[RL_LANE_CHUNKS];
      RL_UNROLL(unroll)
      for (int j = 0; j < RL_LANE_CHUNKS; ++j) {
        const int64_t k = int64_t(lane_id()) * RL_LANE_CHUNKS + j;
        g[j] = k < have ? sh[k] : empty;
      }
      const P v = warp_join(lane_join(g));
      if (lane_id() == 0) st.push(RL_WARP_NODE_LEVEL + RL_WARP_TILE_LEVEL, g0 / RL_ROW_GROUP, v);
    }
    RL_SYNC();
  }
  if (RL_TID == 0) sh[0] = nodes > 0 ? st.fold() : empty;
  RL_SYNC();
  const P r = sh[0];
  RL_SYNC();  // sh is reused by the next call
  return r;
}

// The canonical decomposition of a rank's slice, chunks [c0, c0 + n) of the row (their maximal aligned
// nodes, left to right), by one block, into out[0..): the range is cut into items, maximal aligned nodes
// of at most one warp tile, which the warps take round robin; thread 0 pushes their values in
// order into a TreeStack, which joins siblings as they come, so that it ends holding exactly the slice's
// maximal nodes. (Work is balanced whatever the slice's nodes are: a slice of 9496 chunks has nodes of
// levels 13, 10, 8, 4 and 3, each of which one warp would otherwise walk alone.) leaf's row starts at
// global chunk c0. Returns the number of nodes written (thread 0).
template <class P, class Leaf>
__device__ __forceinline__ int block_slice_nodes(const Leaf& leaf, int64_t c0, int64_t n, P empty, P* out) {
  __shared__ int item_lv[RL_ROW_GROUP];
  __shared__ int64_t item_first[RL_ROW_GROUP];  // local chunk
  __shared__ int item_count;
  __shared__ P item_val[RL_ROW_GROUP];
  TreeStack<P> st;  // thread 0 only
  int64_t c = c0;
  const int64_t end = c0 + n;
  for (;;) {
    if (RL_TID == 0) {
      int k = 0;
      for (; k < RL_ROW_GROUP && c < end; ++k) {
        item_lv[k] = item_level(c, end, Tile<typename Leaf::Elem>::level);
        item_first[k] = c - c0;
        c += int64_t(1) << item_lv[k];
      }
      item_count = k;
    }
    RL_SYNC();
    const int count = item_count;
    if (count == 0) break;
    for (int j = warp_id(); j < count; j += RL_WARPS) {
      const int64_t f = item_first[j];
      const P v = warp_any_node(leaf.shifted(f), item_lv[j], n - f, empty);
      if (lane_id() == 0) item_val[j] = v;
    }
    RL_SYNC();
    if (RL_TID == 0)
      for (int j = 0; j < count; ++j) st.push(item_lv[j], (c0 + item_first[j]) >> item_lv[j], item_val[j]);
    RL_SYNC();
  }
  if (RL_TID == 0)
    for (int k = 0; k < st.n; ++k) out[k] = st.v[k];
  return st.n;
}

// What a warp tile needs of a row: its storage, its length, the value past its end, and the leaf of a
// full chunk's values (a partial chunk arrives padded).
template <class D>
struct LeafStats {
  using Elem = D;
  const typename D::storage* row;
  int64_t V;
  __device__ __forceinline__ static float pad() { return neg_inf(); }
  __device__ __forceinline__ Acc from_x(const float x[RL_CHUNK]) const { return leaf_stats(x); }
  __device__ __forceinline__ LeafStats shifted(int64_t chunks) const {
    return LeafStats{row + chunks * RL_CHUNK, V - chunks * RL_CHUNK};
  }
};

template <class Term>
struct LeafSum {
  using Elem = typename Term::Elem;
  Term term;
  const typename Elem::storage* row;
  int64_t V;
  __device__ __forceinline__ static float pad() { return Term::pad(); }
  __device__ __forceinline__ float from_x(const float x[RL_CHUNK]) const {
    float v[RL_CHUNK];
    RL_UNROLL(unroll)
    for (int j = 0; j < RL_CHUNK; ++j) v[j] = x[j];
    term.from_x(v);
    return chunk_sum(v);
  }
  __device__ __forceinline__ LeafSum shifted(int64_t chunks) const {
    return LeafSum{term, row + chunks * RL_CHUNK, V - chunks * RL_CHUNK};
  }
};

template <class Term>
__device__ __forceinline__ LeafSum<Term> leaf_sum(const Term& term) {
  return LeafSum<Term>{term, term.row, term.V};
}

// The tree over the first n chunks of a row of V elements (every thread returns it).
template <class D>
__device__ __forceinline__ Acc block_acc(const typename D::storage* row, int64_t V, int64_t n) {
  __shared__ Acc sh[RL_ROW_GROUP];
  return block_tree(LeafStats<D>{row, V}, n, acc_empty(), sh);
}

// Every thread returns the row's statistics.
template <class D>
__device__ __forceinline__ RowStats block_stats(const typename D::storage* row, int64_t V) {
  return finish(block_acc<D>(row, V, chunks_of(V)));
}

__device__ __forceinline__ float* node_sum_shared() {
  __shared__ float sh[RL_ROW_GROUP];
  return sh;
}

template <class Term>
__device__ __forceinline__ float block_sum(const Term& term, int64_t V) {
  return block_tree(leaf_sum(term), chunks_of(V), sum_empty(), node_sum_shared());
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

// ---- node kernels: one warp per (row, node); then one thread per row joins the nodes ----------
// Warp w of block (x, y) is node 8y + w of row row0 + x (no integer division on the device: AMD
// lowers it through v_rcp_f32). The node's chunks start a row of their own (row + 8 * first), so
// the warp's alignment is the node's.
__device__ __forceinline__ int64_t node_of_warp() { return RL_NODE * RL_WARPS + warp_id(); }

template <class D>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    node_stats_kernel(int64_t row0, const typename D::storage* x, int64_t row_stride, int64_t valid, int64_t chunk0,
                      NodeList nl, float* out) {
  const int64_t r = row0 + RL_ROW, j = node_of_warp();
  if (j >= nl.n) return;
  const NodeRange nr = node_range(chunk0, valid, nl.level(j), nl.index(j));
  const int64_t off = nr.first * RL_CHUNK;
  const typename D::storage* row = x + r * row_stride + off;
  const int64_t V = valid - off;
  const Acc a = warp_any_node(LeafStats<D>{row, V}, nl.level(j), nr.n, acc_empty());
  if (lane_id() == 0) {
    out[2 * (r * nl.n + j)] = a.m;
    out[2 * (r * nl.n + j) + 1] = a.s;
  }
}

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

// A rank's slice, whose nodes are its canonical decomposition (the host checks): one block per row,
// block_slice_nodes. The slice's chunks start at its row's column 0 (global chunk chunk0).
template <class D>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    slice_stats_kernel(int64_t row0, const typename D::storage* x, int64_t row_stride, int64_t valid, int64_t chunk0,
                       int64_t nodes, float* out) {
  const int64_t r = row0 + RL_ROW;
  __shared__ Acc vals[RL_MAX_NODES];
  const int k = block_slice_nodes(LeafStats<D>{x + r * row_stride, valid}, chunk0, chunks_of(valid), acc_empty(),
                                  vals);
  if (RL_TID == 0)
    for (int j = 0; j < k && j < nodes; ++j) {
      out[2 * (r * nodes + j)] = vals[j].m;
      out[2 * (r * nodes + j) + 1] = vals[j].s;
    }
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


// ---- a row's equal parts joined by one warp per row (a row cut for few rows: the parts are nodes
// (L, 0), (L, 1), ... of one level) -------------------------------------------------------------------
// 256 parts at a time as one node of level L + 8 (8 per lane, then the shuffles: block_tree's join), those
// through a TreeStack; every lane returns the root. (One thread per row walked ~75 parts of a decode row
// through its stack in 20 us; a warp takes about 2.)
template <class P, class Get>
__device__ __forceinline__ P warp_join_parts(const Get& get, int64_t n, int L, P empty) {
  TreeStack<P, 40> st;
#pragma unroll 1
  for (int64_t g0 = 0; g0 < n; g0 += RL_ROW_GROUP) {
    P g[RL_LANE_CHUNKS];
    RL_UNROLL(unroll)
    for (int j = 0; j < RL_LANE_CHUNKS; ++j) {
      const int64_t k = g0 + int64_t(lane_id()) * RL_LANE_CHUNKS + j;
      g[j] = k < n ? get(k) : empty;
    }
    st.push(L + RL_WARP_TILE_LEVEL, g0 >> RL_WARP_TILE_LEVEL, warp_join(lane_join(g)));
  }
  return st.fold();
}

__device__ __forceinline__ int64_t row_of_warp() { return RL_ROW * RL_WARPS + warp_id(); }

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
