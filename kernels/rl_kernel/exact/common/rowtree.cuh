// The row tree's schedules (docs/numerics.md section 2), each the one tree of reduce.h: on the host, a
// row's sum, the nodes of a cut row (vocab-parallel ranks, several blocks per row) and their join; beside
// them on the GPU, a node by one warp (warptile.cuh's tiles), the whole row by one block, a slice's
// canonical decomposition, the per-node statistics kernels and a row's equal parts joined by one warp.
// Generic: nothing here knows what a family computes from the tree (the softmax family uses it).
// No ATen: kernels-check compiles it in each family's *_check.cu.
#pragma once

#include "reduce.h"
#include "warptile.cuh"

namespace rl {

// ============================ CPU reference ==================================
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

template <class Term>
inline float cpu_row_sum(const Term& term, int64_t V) {
  TreeStack<float> st;
  push_range_sum(st, term, 0, chunks_of(V), V);
  return st.fold();
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

__device__ __forceinline__ float* node_sum_shared() {
  __shared__ float sh[RL_ROW_GROUP];
  return sh;
}

template <class Term>
__device__ __forceinline__ float block_sum(const Term& term, int64_t V) {
  return block_tree(leaf_sum(term), chunks_of(V), sum_empty(), node_sum_shared());
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

// A rank's slice over many rows: warp w of block (x, y) computes canonical node y of row 8x + w (by
// warp_any_node, as node_stats_kernel does), so that a slice of few, large nodes (a fused head's vocabulary
// chunk is one node) keeps every warp busy; slice_stats_kernel's one block per row leaves all but one of
// its warps idle then. Same nodes, same trees: the same bits.
struct SliceNode {
  int L;
  int64_t first;  // first local chunk
};

// Node y of the canonical decomposition of chunks [c0, end): walks the y nodes before it (a slice has few).
RL_HD SliceNode slice_node(int64_t c0, int64_t end, int64_t y) {
  int64_t c = c0;
  for (int64_t k = 0; k < y; ++k) c += int64_t(1) << item_level(c, end, 62);
  return SliceNode{item_level(c, end, 62), c - c0};
}

__device__ __forceinline__ int64_t row_of_warp_in(int64_t row0) { return row0 + RL_ROW * RL_WARPS + warp_id(); }

template <class D>
__global__ void __launch_bounds__(RL_BLOCK, RL_MIN_BLOCKS)
    slice_stats_warp_kernel(int64_t row0, int64_t row_end, const typename D::storage* x, int64_t row_stride,
                            int64_t valid, int64_t chunk0, int64_t nodes, float* out) {
  const int64_t r = row_of_warp_in(row0);
  if (r >= row_end) return;
  const SliceNode sn = slice_node(chunk0, chunk0 + chunks_of(valid), RL_NODE);
  const int64_t off = sn.first * RL_CHUNK;
  const Acc a = warp_any_node(LeafStats<D>{x + r * row_stride + off, valid - off}, sn.L, int64_t(1) << sn.L,
                              acc_empty());
  if (lane_id() == 0) {
    out[2 * (r * nodes + RL_NODE)] = a.m;
    out[2 * (r * nodes + RL_NODE) + 1] = a.s;
  }
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

#endif  // RL_GPU_COMPILE

}  // namespace rl
