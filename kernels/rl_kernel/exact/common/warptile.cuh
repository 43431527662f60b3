// The row tree inside one warp (docs/numerics.md section 2: the tree of reduce.h, evaluated in another
// order): a warp tile of a row's chunks, staged through shared memory, each lane's subtree of its chunks
// and the shuffle levels over the lanes. Generic: any family that reduces a row by the contract's tree
// builds on it (through rowtree.cuh). No ATen: kernels-check compiles it in each family's *_check.cu.
#pragma once

#include "gpu.h"
#include "reduce.h"

namespace rl {

#if defined(RL_GPU_COMPILE)

constexpr int RL_BLOCK = 256;  // threads of a block, one row (or one node of a row) per block

// Blocks per multiprocessor the compiler must fit (caps registers: 64 per thread at 4, measured best on
// the H200 of 1, 4; bench/gpu_round.sh tune); tuning only.
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

#endif  // RL_GPU_COMPILE

}  // namespace rl
