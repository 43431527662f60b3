// The decoder family's causal grouped-query attention (docs/numerics.md section 11), forward and backward:
// the contract's per-row loop (the CPU executor's, decoder_cpu.cpp) and, beside it, the GPU kernels that run
// the same loop in the same order. No ATen: kernels-check compiles it through decoder_check.cu.
#pragma once

#include "scalar.cuh"

namespace rl {

// ---- attention --------------------------------------------------------------------------------
// A query row sees the keys j0 .. j1 (inclusive) of its sequence, in tiles of RL_ATTN_TILE keys
// counted from j0, its first key: k_start, or with a sliding window of w keys max(k_start, j1 - w + 1)
// (attn_first_key). Per tile: s_u = dot(q, k_u) * scale (one fma_rn chain over d from +0.0);
// mt = max(m, s_0, s_1, ...); alpha = exp_fold(m - mt); l = l * alpha; acc_d = acc_d * alpha; then for
// u in order: p = exp_fold(s_u - mt); l = l + p; acc_d = fma_rn(p, v_u[d], acc_d). Start m = -FLT_MAX,
// l = 0 (with a sink, m = sink, l = 1: attn_start), acc = 0; the output is acc_d * rcp_pos(l), the canonical
// NaN when m is NaN or +inf, and +0.0
// for a row that sees no key.
constexpr int RL_ATTN_TILE = 32;
constexpr int RL_ATTN_MAX_DIM = 256;  // head_dim limit of both executors (a GPU lane holds 8 accumulators)

template <class D>
RL_HD float attn_score(const typename D::storage* q, const typename D::storage* k, int64_t Dh, float scale) {
  float acc = 0.0f;
  for (int64_t d = 0; d < Dh; ++d) acc = fma_rn(D::load(q, d), D::load(k, d), acc);
  return acc * scale;
}

RL_HD bool attn_bad(float m) { return !(m <= RL_FLT_MAX); }

// A row's first key: the sequence's (k_start), or with a window of w > 0 keys the w-th before its last (j1).
// Its tiles are counted from it, so a row's bits do not depend on keys it does not see: a prefill row, a
// decode step over a full cache and one over a cache that keeps only the window all walk the same tiles.
RL_HD int64_t attn_first_key(int64_t k_start, int64_t j1, int64_t window) {
  const int64_t w0 = j1 - window + 1;
  return window > 0 && w0 > k_start ? w0 : k_start;
}

// The statistics a row leaves (for diagnostics and a backward): m with a zero's sign cleared, and l.
RL_HD float attn_stat_m(float m) { return canonical(no_neg_zero(m)); }

// A row's state before its first tile: m = -FLT_MAX, l = 0; with an attention sink (a per-head logit, GPT-OSS) the
// sink joins the row's softmax first, as a key before the row's first with a zero value: m = sink, l =
// exp_fold(sink - sink) = 1. Every row of a head starts alike, so a row's bits still depend on its own keys alone.
struct AttnStart {
  float m, l;
};

RL_HD AttnStart attn_start(const float* sinks, int64_t h) {
  return sinks != nullptr ? AttnStart{sinks[h], 1.0f} : AttnStart{-RL_FLT_MAX, 0.0f};
}

template <class D>
inline void attention_row(const typename D::storage* q, const typename D::storage* k, const typename D::storage* v,
                          int64_t Dh, int64_t j0, int64_t j1, float scale, AttnStart start, typename D::storage* o,
                          float* stats, float* acc) {
  float m = start.m, l = start.l;
  for (int64_t d = 0; d < Dh; ++d) acc[d] = 0.0f;
  for (int64_t t0 = j0; t0 <= j1; t0 += RL_ATTN_TILE) {
    const int n = int(j1 - t0 + 1 < RL_ATTN_TILE ? j1 - t0 + 1 : RL_ATTN_TILE);
    float s[RL_ATTN_TILE];
    float mt = m;
    for (int u = 0; u < n; ++u) {
      s[u] = attn_score<D>(q, k + (t0 + u) * Dh, Dh, scale);
      mt = max_nan(mt, s[u]);
    }
    const float alpha = exp_fold(m - mt);
    l = l * alpha;
    for (int64_t d = 0; d < Dh; ++d) acc[d] = acc[d] * alpha;
    for (int u = 0; u < n; ++u) {
      const float p = exp_fold(s[u] - mt);
      l = l + p;
      const typename D::storage* vu = v + (t0 + u) * Dh;
      for (int64_t d = 0; d < Dh; ++d) acc[d] = fma_rn(p, D::load(vu, d), acc[d]);
    }
    m = mt;
  }
  const bool empty = j1 < j0;
  const float r = (empty || attn_bad(m)) ? 0.0f : rcp_pos(l);
  for (int64_t d = 0; d < Dh; ++d)
    o[d] = empty ? store_out<D>(0.0f) : store_out<D>(attn_bad(m) ? canonical_nan() : acc[d] * r);
  stats[0] = attn_stat_m(m);
  stats[1] = canonical(l);
}

// ---- attention backward (section 11) ----------------------------------------------------------
// Per query row, from the forward's statistics and output: m, r = rcp_pos(l), Dr = dot(dO, O) (one fma_rn
// chain over d). For each key j the row sees, p = exp_fold(s - m) * r and dS = p * (dot(dO, v_j) - Dr);
// a bad row (m NaN or +inf) has p = dS = NaN. dq_i = scale * sum_j dS_ij k_j (j ascending); dk_j = scale
// * sum dS_ij q_i and dv_j = sum p_ij dO_i over the query heads of j's KV head in order, then the rows i
// that see j in order (one fma_rn chain each, from +0). The pair (i, j) gives the same (p, dS) wherever
// it is computed: attn_grad_terms below.
struct RowGrad {
  float m, r, dr;
  bool bad;
};

template <class D>
RL_HD RowGrad attn_row_grad(const float* stats, const typename D::storage* o, const typename D::storage* go,
                            int64_t Dh) {
  const float m = stats[0];
  const bool bad = attn_bad(m);
  float dr = 0.0f;
  for (int64_t d = 0; d < Dh; ++d) dr = fma_rn(D::load(go, d), D::load(o, d), dr);
  return RowGrad{m, bad ? 0.0f : rcp_pos(stats[1]), dr, bad};
}

RL_HD Pair attn_grad_terms(float s, float dp, const RowGrad& g) {
  if (g.bad) return Pair{canonical_nan(), canonical_nan()};
  const float p = exp_fold(s - g.m) * g.r;
  return Pair{p, p * (dp - g.dr)};
}

// A row's term of its sink's gradient: the sink is a pair whose score is the sink and whose value is zero (dp = +0),
// so dS = p * (0 - Dr). The sink's gradient is the section 2 tree over its head's rows (b, then t, in order).
RL_HD float attn_sink_term(float sink, const RowGrad& g) { return attn_grad_terms(sink, 0.0f, g).b; }

template <class D>
RL_HD Pair attn_pair_grad(const typename D::storage* q, const typename D::storage* go, const typename D::storage* k,
                          const typename D::storage* v, int64_t Dh, float scale, const RowGrad& g) {
  const float s = attn_score<D>(q, k, Dh, scale);
  float dp = 0.0f;
  for (int64_t d = 0; d < Dh; ++d) dp = fma_rn(D::load(go, d), D::load(v, d), dp);
  return attn_grad_terms(s, dp, g);
}

// ============================ GPU kernels ====================================
#if defined(RL_GPU_COMPILE)

// ---- attention: one logical warp (32 lanes) per query row, a block per group of rows that share keys --
// Block (blockIdx.x, y, z) = (query chunk, KV head, batch) holds qc query positions x the `group` query
// heads of that KV head, a warp each, so all its rows read the same keys. Per tile the block stages the
// 32 keys and values in shared memory (widened to fp32; key rows padded by 4 floats so that lane u's
// 16-byte reads of row u hit distinct banks). Lane u computes the score of key u (its fma_rn chain over
// d in order); the tile's max is a shuffle max (exact, order-free up to a zero's sign, which no output
// shows); every lane adds the tile's p in order to l (the same bits in every lane), and lane d owns
// acc[d], acc[d + 32], ...: per key in order, one fma_rn each. So every row runs section 11's loop.
constexpr int RL_ATTN_PER_LANE = RL_ATTN_MAX_DIM / RL_WARP;
constexpr int RL_ATTN_MAX_WARPS = 32;

__device__ __forceinline__ float warp_max(float v) {
  RL_UNROLL(unroll)
  for (int m = 1; m < RL_WARP; m <<= 1) v = max_nan(v, shfl_xor(v, m));
  return v;
}

// The score of one key row kr (shared, fp32) against q (shared, fp32): 16-byte reads when Dh % 4 == 0.
__device__ __forceinline__ float attn_score_shared(const float* qs, const float* kr, int64_t Dh, float scale) {
  float acc = 0.0f;
  if ((Dh & 3) == 0) {
    for (int64_t d = 0; d < Dh; d += 4) {
      const float4 a = *reinterpret_cast<const float4*>(qs + d);
      const float4 b = *reinterpret_cast<const float4*>(kr + d);
      acc = fma_rn(a.x, b.x, acc);
      acc = fma_rn(a.y, b.y, acc);
      acc = fma_rn(a.z, b.z, acc);
      acc = fma_rn(a.w, b.w, acc);
    }
  } else {
    for (int64_t d = 0; d < Dh; ++d) acc = fma_rn(qs[d], kr[d], acc);
  }
  return acc * scale;
}

// Shared memory of a block: the key tile [32][Dh + 4], the value tile [32][Dh], one q row per warp.
RL_HD int64_t attn_shared_floats(int64_t Dh, int warps) { return RL_ATTN_TILE * (Dh + 4) + RL_ATTN_TILE * Dh + warps * Dh; }

// q [B, Hq, Tq, Dh], k/v [B, Hkv, Tk, Dh], q_pos [B, Tq], k_start [B]; o like q, stats [B, Hq, Tq, 2].
template <class D>
__global__ void __launch_bounds__(RL_ATTN_MAX_WARPS* RL_WARP) attention_kernel(
    int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t Dh, int group, int qc, const typename D::storage* q,
    const typename D::storage* k, const typename D::storage* v, const int64_t* q_pos, const int64_t* k_start,
    float scale, int64_t window, const float* sinks, typename D::storage* o, float* stats) {
  // With a window every row has its own first key: the host gives the block one query position (qc = 1), whose
  // query heads share it.
  extern __shared__ float sm[];
  __shared__ int64_t last_key[RL_ATTN_MAX_WARPS];
  const int warps = group * qc, threads = warps * RL_WARP, w = warp_id(), lane = lane_id();
  float* kt = sm;
  float* vt = kt + RL_ATTN_TILE * (Dh + 4);
  float* qs = vt + RL_ATTN_TILE * Dh + w * Dh;
  int tw = 0, gw = w;  // warp -> (query position in the chunk, head in the group), without a division
  while (gw >= group) {
    gw -= group;
    ++tw;
  }
  const int64_t b = RL_BLOCK_Z, kvh = RL_BLOCK_Y, t = RL_ROW * qc + tw;
  const bool active = t < Tq;
  const int64_t row = (b * Hq + kvh * group + gw) * Tq + t;
  const typename D::storage* kb = k + (b * Hkv + kvh) * Tk * Dh;
  const typename D::storage* vb = v + (b * Hkv + kvh) * Tk * Dh;
  const int64_t j1 = active ? q_pos[b * Tq + t] : k_start[b] - 1;
  const int64_t j0 = active ? attn_first_key(k_start[b], j1, window) : k_start[b];
  if (active)
    for (int64_t d = lane; d < Dh; d += RL_WARP) qs[d] = D::load(q, row * Dh + d);
  if (lane == 0) last_key[w] = j1;
  RL_SYNC();
  int64_t jend = j0 - 1;
  for (int i = 0; i < warps; ++i) jend = last_key[i] > jend ? last_key[i] : jend;
  float acc[RL_ATTN_PER_LANE];
  RL_UNROLL(unroll)
  for (int i = 0; i < RL_ATTN_PER_LANE; ++i) acc[i] = 0.0f;
  const AttnStart start = attn_start(sinks, kvh * group + gw);
  float m = start.m, l = start.l;
  for (int64_t t0 = j0; t0 <= jend; t0 += RL_ATTN_TILE) {
    const int nt = int(jend - t0 + 1 < RL_ATTN_TILE ? jend - t0 + 1 : RL_ATTN_TILE);
    RL_SYNC();  // the previous tile is consumed
    for (int u = 0; u < nt; ++u) {
      for (int64_t d = RL_TID; d < Dh; d += threads) {
        kt[u * (Dh + 4) + d] = D::load(kb, (t0 + u) * Dh + d);
        vt[u * Dh + d] = D::load(vb, (t0 + u) * Dh + d);
      }
    }
    RL_SYNC();
    const int n = int(j1 - t0 + 1 < RL_ATTN_TILE ? j1 - t0 + 1 : RL_ATTN_TILE);
    if (n <= 0) continue;  // this row's keys ended before the tile (warp-uniform)
    const float s = lane < n ? attn_score_shared(qs, kt + lane * (Dh + 4), Dh, scale) : -RL_FLT_MAX;
    const float mt = max_nan(m, warp_max(s));
    const float alpha = exp_fold(m - mt);
    const float p = exp_fold(s - mt);
    l = l * alpha;
    RL_UNROLL(unroll)
    for (int i = 0; i < RL_ATTN_PER_LANE; ++i) acc[i] = acc[i] * alpha;
    for (int u = 0; u < n; ++u) {
      const float pu = shfl_from(p, u);
      l = l + pu;
      RL_UNROLL(unroll)
      for (int i = 0; i < RL_ATTN_PER_LANE; ++i) {
        const int64_t d = lane + RL_WARP * i;
        if (d < Dh) acc[i] = fma_rn(pu, vt[u * Dh + d], acc[i]);
      }
    }
    m = mt;
  }
  if (!active) return;
  const bool empty = j1 < j0;
  const float r = (empty || attn_bad(m)) ? 0.0f : rcp_pos(l);
  RL_UNROLL(unroll)
  for (int i = 0; i < RL_ATTN_PER_LANE; ++i) {
    const int64_t d = lane + RL_WARP * i;
    if (d < Dh)
      o[row * Dh + d] = empty ? store_out<D>(0.0f) : store_out<D>(attn_bad(m) ? canonical_nan() : acc[i] * r);
  }
  if (lane == 0) {
    stats[2 * row] = attn_stat_m(m);
    stats[2 * row + 1] = canonical(l);
  }
}

// ---- attention backward on the GPU: a warp per query row (dq), a warp per key row (dk, dv) -----------
// Lane u takes key u (dq) or query u (dk, dv) of a tile of 32 and computes that pair's (p, dS); then lane
// d owns the outputs' d, d + 32, ...: per pair in order, one fma_rn each. Grids are (rows of a head,
// head, sequence) and the group size comes from the host, so no index is divided.
constexpr int RL_ATTN_BWD_WARPS = 4;

__device__ __forceinline__ int64_t kv_head_of(int64_t h, int64_t group) {
  int64_t kvh = 0;
  for (int64_t left = h; left >= group; left -= group) ++kvh;
  return kvh;
}

// rowg [B, Hq, Tq, 4]: m, r, Dr, bad (as 0/1), a thread per query row.
template <class D>
__global__ void __launch_bounds__(128) attention_row_grad_kernel(int64_t Hq, int64_t Tq, int64_t Dh,
                                                                  const float* stats, const typename D::storage* o,
                                                                  const typename D::storage* go, float* rowg) {
  const int64_t t = RL_ROW * 128 + RL_TID, h = RL_BLOCK_Y, b = RL_BLOCK_Z;
  if (t >= Tq) return;
  const int64_t row = (b * Hq + h) * Tq + t;
  const RowGrad g = attn_row_grad<D>(stats + 2 * row, o + row * Dh, go + row * Dh, Dh);
  rowg[4 * row] = g.m;
  rowg[4 * row + 1] = g.r;
  rowg[4 * row + 2] = g.dr;
  rowg[4 * row + 3] = g.bad ? 1.0f : 0.0f;
}

__device__ __forceinline__ RowGrad row_grad_at(const float* rowg, int64_t row) {
  return RowGrad{rowg[4 * row], rowg[4 * row + 1], rowg[4 * row + 2], rowg[4 * row + 3] != 0.0f};
}

// terms [B, Hq, Tq]: each row's attn_sink_term, a thread per row (the sum over a head's rows is the host's tree).
template <class D>
__global__ void __launch_bounds__(128) attention_sink_terms_kernel(int64_t Hq, int64_t Tq, int64_t Dh,
                                                                    const float* stats, const typename D::storage* o,
                                                                    const typename D::storage* go, const float* sinks,
                                                                    float* terms) {
  const int64_t t = RL_ROW * 128 + RL_TID, h = RL_BLOCK_Y, b = RL_BLOCK_Z;
  if (t >= Tq) return;
  const int64_t row = (b * Hq + h) * Tq + t;
  terms[row] = attn_sink_term(sinks[h], attn_row_grad<D>(stats + 2 * row, o + row * Dh, go + row * Dh, Dh));
}

template <class D>
__global__ void __launch_bounds__(RL_ATTN_BWD_WARPS* RL_WARP) attention_dq_kernel(
    int64_t Hq, int64_t Hkv, int64_t group, int64_t Tq, int64_t Tk, int64_t Dh, const typename D::storage* q,
    const typename D::storage* k, const typename D::storage* v, const typename D::storage* go, const int64_t* q_pos,
    const int64_t* k_start, const float* rowg, float scale, int64_t window, typename D::storage* dq) {
  const int64_t t = RL_ROW * RL_ATTN_BWD_WARPS + warp_id(), h = RL_BLOCK_Y, b = RL_BLOCK_Z;
  if (t >= Tq) return;
  const int lane = lane_id();
  const int64_t row = (b * Hq + h) * Tq + t, kvh = kv_head_of(h, group);
  const typename D::storage* kb = k + (b * Hkv + kvh) * Tk * Dh;
  const typename D::storage* vb = v + (b * Hkv + kvh) * Tk * Dh;
  const RowGrad g = row_grad_at(rowg, row);
  const int64_t j1 = q_pos[b * Tq + t], j0 = attn_first_key(k_start[b], j1, window);
  float acc[RL_ATTN_PER_LANE];
  RL_UNROLL(unroll)
  for (int i = 0; i < RL_ATTN_PER_LANE; ++i) acc[i] = 0.0f;
  for (int64_t t0 = j0; t0 <= j1; t0 += RL_WARP) {
    const int n = int(j1 - t0 + 1 < RL_WARP ? j1 - t0 + 1 : RL_WARP);
    const float ds = lane < n ? attn_pair_grad<D>(q + row * Dh, go + row * Dh, kb + (t0 + lane) * Dh,
                                                  vb + (t0 + lane) * Dh, Dh, scale, g).b
                              : 0.0f;
    for (int u = 0; u < n; ++u) {
      const float du = shfl_from(ds, u);
      RL_UNROLL(unroll)
      for (int i = 0; i < RL_ATTN_PER_LANE; ++i) {
        const int64_t d = lane + RL_WARP * i;
        if (d < Dh) acc[i] = fma_rn(du, D::load(kb, (t0 + u) * Dh + d), acc[i]);
      }
    }
  }
  RL_UNROLL(unroll)
  for (int i = 0; i < RL_ATTN_PER_LANE; ++i) {
    const int64_t d = lane + RL_WARP * i;
    if (d < Dh) dq[row * Dh + d] = store_out<D>(acc[i] * scale);
  }
}

template <class D>
__global__ void __launch_bounds__(RL_ATTN_BWD_WARPS* RL_WARP) attention_dkv_kernel(
    int64_t Hq, int64_t Hkv, int64_t group, int64_t Tq, int64_t Tk, int64_t Dh, const typename D::storage* q,
    const typename D::storage* k, const typename D::storage* v, const typename D::storage* go, const int64_t* q_pos,
    const int64_t* k_start, const float* rowg, float scale, int64_t window, typename D::storage* dk,
    typename D::storage* dv) {
  const int64_t j = RL_ROW * RL_ATTN_BWD_WARPS + warp_id(), kvh = RL_BLOCK_Y, b = RL_BLOCK_Z;
  if (j >= Tk) return;
  const int lane = lane_id();
  const int64_t kvrow = (b * Hkv + kvh) * Tk + j;
  const typename D::storage* kj = k + kvrow * Dh;
  const typename D::storage* vj = v + kvrow * Dh;
  const bool seen = j >= k_start[b];
  float ak[RL_ATTN_PER_LANE], av[RL_ATTN_PER_LANE];
  RL_UNROLL(unroll)
  for (int i = 0; i < RL_ATTN_PER_LANE; ++i) ak[i] = av[i] = 0.0f;
  for (int64_t g = 0; g < group && seen; ++g) {
    const int64_t h = kvh * group + g;
    for (int64_t i0 = 0; i0 < Tq; i0 += RL_WARP) {
      const int64_t i = i0 + lane;
      const int64_t qp = q_pos[b * Tq + (i < Tq ? i : 0)];
      const bool mine = i < Tq && j <= qp && j >= attn_first_key(k_start[b], qp, window);
      const int64_t row = (b * Hq + h) * Tq + i;
      Pair pg{0.0f, 0.0f};
      if (mine) pg = attn_pair_grad<D>(q + row * Dh, go + row * Dh, kj, vj, Dh, scale, row_grad_at(rowg, row));
      const float flag = mine ? 1.0f : 0.0f;
      const int n = int(Tq - i0 < RL_WARP ? Tq - i0 : RL_WARP);
      for (int u = 0; u < n; ++u) {
        const float pu = shfl_from(pg.a, u), du = shfl_from(pg.b, u);
        if (shfl_from(flag, u) == 0.0f) continue;  // the pair is not seen: no term (the same in every lane)
        const int64_t ru = ((b * Hq + h) * Tq + i0 + u) * Dh;
        RL_UNROLL(unroll)
        for (int c = 0; c < RL_ATTN_PER_LANE; ++c) {
          const int64_t d = lane + RL_WARP * c;
          if (d < Dh) {
            ak[c] = fma_rn(du, D::load(q, ru + d), ak[c]);
            av[c] = fma_rn(pu, D::load(go, ru + d), av[c]);
          }
        }
      }
    }
  }
  RL_UNROLL(unroll)
  for (int c = 0; c < RL_ATTN_PER_LANE; ++c) {
    const int64_t d = lane + RL_WARP * c;
    if (d < Dh) {
      dk[kvrow * Dh + d] = store_out<D>(ak[c] * scale);
      dv[kvrow * Dh + d] = store_out<D>(av[c]);
    }
  }
}

#endif  // RL_GPU_COMPILE

}  // namespace rl
