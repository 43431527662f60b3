// The fixed order of every row reduction (docs/numerics.md section 2, contract v2):
// chunks of RL_CHUNK elements are the leaves of ONE perfect binary tree laid over
// the chunk index of the whole row. Node (L, i) covers chunks [i * 2^L, (i+1) * 2^L);
// its value is join(node (L-1, 2i), node (L-1, 2i+1)); chunks past the row's end are
// the exact identity of join. Because every node is an aligned range of the row,
// any cut of the row on chunk boundaries (vocab-parallel ranks, several blocks per
// row, a block's tiles) evaluates whole subtrees locally and joins the few nodes
// that straddle the cuts afterwards: the bits never depend on the cut.
// The same code runs on the host and on every GPU.
#pragma once

#include "numerics.h"

namespace rl {

constexpr int RL_CHUNK = 8;
// Deepest decomposition a TreeStack holds: a range of chunks inside [0, 2^40) splits into
// at most 2 * 40 maximal aligned nodes.
constexpr int RL_MAX_NODES = 80;

// ---- the row statistics: (max, sum of exp(x - max)) ---------------------------
struct Acc {
  float m;  // maximum of the node's elements, at least -FLT_MAX (NaN once a NaN was seen)
  float s;  // sum of exp_fold(x - m) over the node's elements
};

// The identity of join for statistics: join(a, empty) == join(empty, a) == a, bit for bit
// (m = max(a.m, -FLT_MAX) = a.m since a.m >= -FLT_MAX; the empty side's s is 0, and a.s + 0 = a.s).
RL_HD Acc acc_empty() { return Acc{-RL_FLT_MAX, 0.0f}; }
RL_HD float sum_empty() { return 0.0f; }

// Pairwise sum of one chunk: ((v0+v1)+(v2+v3)) + ((v4+v5)+(v6+v7)).
RL_HD float chunk_sum(const float v[RL_CHUNK]) {
  return ((v[0] + v[1]) + (v[2] + v[3])) + ((v[4] + v[5]) + (v[6] + v[7]));
}

// A leaf: the statistics of one chunk on its own. cm = max(-FLT_MAX, x0, ..., x7) left to right,
// s = chunk_sum(exp_fold(x_j - cm)). Elements past the row end are -inf.
RL_HD Acc leaf_stats(const float x[RL_CHUNK]) {
  float cm = max_nan(-RL_FLT_MAX, x[0]);
  RL_UNROLL(unroll)
  for (int j = 1; j < RL_CHUNK; ++j) cm = max_nan(cm, x[j]);
  float e[RL_CHUNK];
  RL_UNROLL(unroll)
  for (int j = 0; j < RL_CHUNK; ++j) e[j] = exp_fold(x[j] - cm);
  return Acc{cm, chunk_sum(e)};
}

// Join of two sibling nodes, a the lower positions. The side that holds the maximum is kept as is and
// only the other one is scaled, by one exp. (When both hold it, e = exp_fold(0) = 1 exactly, so scaling
// b changes nothing; for a NaN or +inf maximum, whose rows are bad, s is unspecified.)
RL_HD Acc join(Acc a, Acc b) {
  const float m = max_nan(a.m, b.m);
  const bool a_top = a.m == m;
  const float e = exp_fold((a_top ? b.m : a.m) - m);
  return Acc{m, a_top ? a.s + b.s * e : a.s * e + b.s};
}
RL_HD float join(float a, float b) { return a + b; }

// ---- the tree over a range of aligned nodes -----------------------------------
// Nodes are pushed left to right, each with its level and index; two siblings on top are joined at
// once. After pushing every leaf of the range [c0, c1) (or any nodes that tile it), the stack holds
// the range's canonical decomposition: its maximal aligned nodes, left to right. fold() then gives
// the value of the tree over a whole row: the nodes past its end are empty, so each parent with an
// empty right half is its left half, which is a fold from the right.
template <class P, int N = RL_MAX_NODES>
struct TreeStack {
  P v[N];
  int level[N];
  int64_t index[N];
  int n = 0;

  RL_HD void push(int L, int64_t i, P x) {
    while (n > 0 && (i & 1) && level[n - 1] == L && index[n - 1] == i - 1) {
      x = join(v[n - 1], x);
      --n;
      ++L;
      i >>= 1;
    }
    v[n] = x;
    level[n] = L;
    index[n] = i;
    ++n;
  }

  RL_HD P fold() const {
    P a = v[n - 1];
#if defined(RL_MUTATIONS)
    if (RL_MUTATED(RL_MUT_TREE_ORDER)) {  // the top nodes joined left to right: a wrong order
      a = v[0];
      for (int k = 1; k < n; ++k) a = join(a, v[k]);
      return a;
    }
#endif
    for (int k = n - 2; k >= 0; --k) a = join(v[k], a);
    return a;
  }
};

// The level of the maximal aligned node that starts at chunk c inside [c, end), at most Lmax: pushing
// such nodes from c0 to end gives the canonical decomposition of [c0, end) (Lmax large), or finer parts.
RL_HD int item_level(int64_t c, int64_t end, int Lmax) {
  int L = 0;
  while (L < Lmax && (c & ((int64_t(2) << L) - 1)) == 0 && c + (int64_t(2) << L) <= end) ++L;
  return L;
}

// ---- generic row loops shared by every build --------------------------------
// Load(c, x, full) fills x[0..7] with elements 8c..8c+7 of the row; when full is
// false the chunk is the row's last, partial one and is padded with -inf.
// Term(c, v, full) likewise fills per-element terms of a sum, padded with 0.
RL_HD int64_t chunks_of(int64_t V) { return (V + RL_CHUNK - 1) / RL_CHUNK; }
RL_HD bool chunk_full(int64_t c, int64_t V) { return (c + 1) * RL_CHUNK <= V; }

template <class Load>
RL_HD Acc leaf_of(const Load& load, int64_t c, int64_t V) {
  float x[RL_CHUNK];
  load(c, x, chunk_full(c, V));
  return leaf_stats(x);
}

template <class Term>
RL_HD float leaf_of_sum(const Term& term, int64_t c, int64_t V) {
  float v[RL_CHUNK];
  term(c, v, chunk_full(c, V));
  return chunk_sum(v);
}

// The canonical decomposition of chunks [c0, c1) of a row of V elements (c1 <= chunks_of(V)),
// leaf by leaf: the stack form used by the CPU executor and by vocab-parallel ranks.
template <class Load>
inline void push_range_stats(TreeStack<Acc>& st, const Load& load, int64_t c0, int64_t c1, int64_t V) {
  for (int64_t c = c0; c < c1; ++c) st.push(0, c, leaf_of(load, c, V));
}

template <class Term>
inline void push_range_sum(TreeStack<float>& st, const Term& term, int64_t c0, int64_t c1, int64_t V) {
  for (int64_t c = c0; c < c1; ++c) st.push(0, c, leaf_of_sum(term, c, V));
}

}  // namespace rl
