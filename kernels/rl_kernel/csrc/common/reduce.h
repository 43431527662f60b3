// The fixed order of every row reduction (docs/numerics.md section 2): chunks of
// RL_CHUNK, RL_LANES lanes each folding its chunks in increasing order, then a
// binary tree over the lanes. The same code runs on the host and on every GPU.
#pragma once

#include "numerics.h"

// How many chunks of a lane loop are unrolled (loads issued ahead); tuning only.
#ifndef RL_LANE_UNROLL
#define RL_LANE_UNROLL 2
#endif

namespace rl {

// ---- fixed shape of every row reduction -----------------------------------
// A row of V elements is cut into chunks of RL_CHUNK consecutive elements.
// Lane t (0 <= t < RL_LANES) owns chunks t, t + RL_LANES, t + 2*RL_LANES, ...
// and folds them in increasing order; the RL_LANES lane partials are then
// combined by a binary tree: for stride = 128, 64, ..., 1, partial[t] =
// combine(partial[t], partial[t + stride]) for t < stride.
constexpr int RL_LANES = 256;
constexpr int RL_CHUNK = 8;

// ---- the row fold: (running max, sum of exp(x - max)) ----------------------
struct Acc {
  float m;  // running maximum (NaN once a NaN was seen); starts at -FLT_MAX
  float s;  // sum of exp_fold(x - m) over the elements seen
};

RL_HD Acc acc_init() { return Acc{-RL_FLT_MAX, 0.0f}; }

// Pairwise sum of one chunk: ((v0+v1)+(v2+v3)) + ((v4+v5)+(v6+v7)).
RL_HD float chunk_sum(const float v[RL_CHUNK]) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// Fold one chunk into a lane's accumulator. Elements past the row end are -inf.
RL_HD void fold_chunk(Acc& a, const float x[RL_CHUNK]) {
  float cm = x[0];
  RL_UNROLL(unroll)
  for (int j = 1; j < RL_CHUNK; ++j) cm = max_nan(cm, x[j]);
  const float nm = max_nan(a.m, cm);
  if (!(nm == a.m)) {  // a larger maximum (or a NaN): rescale the sum
    a.s = a.s * exp_fold(a.m - nm);
    a.m = nm;
  }
  float e[RL_CHUNK];
  RL_UNROLL(unroll)
  for (int j = 0; j < RL_CHUNK; ++j) e[j] = exp_fold(x[j] - a.m);
  a.s = a.s + chunk_sum(e);
}

// Tree step: merge two lane partials (a from the lower lane index).
RL_HD Acc combine(Acc a, Acc b) {
  const float m = max_nan(a.m, b.m);
  const float sa = (a.m == m) ? a.s : a.s * exp_fold(a.m - m);
  const float sb = (b.m == m) ? b.s : b.s * exp_fold(b.m - m);
  return Acc{m, sa + sb};
}

// ---- generic row loops shared by every build --------------------------------
// Load(c, x, full) fills x[0..7] with elements 8c..8c+7 of the row; when full is
// false the chunk is the row's last, partial one and is padded with -inf.
// Term(c, v, full) likewise fills per-element terms of a sum, padded with 0.
// Chunk c belongs to lane c % RL_LANES, so the partial chunk (if any) is the
// last chunk of its lane: the loops below visit exactly the order stated above.
RL_HD int full_chunks(int64_t V) { return int(V / RL_CHUNK); }
RL_HD bool has_tail(int64_t V) { return V % RL_CHUNK != 0; }

template <class Load>
RL_HD Acc lane_stats(const Load& load, int64_t V, int t) {
  Acc a = acc_init();
  float x[RL_CHUNK];
  const int nfull = full_chunks(V);
  RL_UNROLL_N(RL_LANE_UNROLL)
  for (int c = t; c < nfull; c += RL_LANES) {
    load(c, x, true);
    fold_chunk(a, x);
  }
  if (has_tail(V) && nfull % RL_LANES == t) {
    load(nfull, x, false);
    fold_chunk(a, x);
  }
  return a;
}

template <class Term>
RL_HD float lane_sum(const Term& term, int64_t V, int t) {
  float s = 0.0f;
  float v[RL_CHUNK];
  const int nfull = full_chunks(V);
  RL_UNROLL_N(RL_LANE_UNROLL)
  for (int c = t; c < nfull; c += RL_LANES) {
    term(c, v, true);
    s = s + chunk_sum(v);
  }
  if (has_tail(V) && nfull % RL_LANES == t) {
    term(nfull, v, false);
    s = s + chunk_sum(v);
  }
  return s;
}

// One level of the lane tree, for lane t < stride.
RL_HD void tree_step(Acc* p, int t, int stride) { p[t] = combine(p[t], p[t + stride]); }
RL_HD void tree_step(float* p, int t, int stride) { p[t] = p[t] + p[t + stride]; }

// Host form of the tree (the GPU runs the same steps with a barrier per level).
template <class P>
inline P host_tree(P* partials) {
#if defined(RL_MUTATIONS)
  if (RL_MUTATED(RL_MUT_TREE_ORDER)) {  // neighbours first: a wrong order
    for (int stride = 1; stride < RL_LANES; stride <<= 1)
      for (int t = 0; t < RL_LANES; t += 2 * stride) tree_step(partials, t, stride);
    return partials[0];
  }
#endif
  for (int stride = RL_LANES / 2; stride > 0; stride >>= 1)
    for (int t = 0; t < stride; ++t) tree_step(partials, t, stride);
  return partials[0];
}

}  // namespace rl
