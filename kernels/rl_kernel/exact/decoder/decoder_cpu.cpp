// The decoder family's schemas and its CPU executor (the golden reference): decoder.cuh's per-element
// and per-row functions, rows on torch's threads in IEEE mode (common/cpu.h).
#include <torch/extension.h>

#include <vector>

#include "../common/cpu.h"
#include "decoder_ops.h"

namespace rl {
namespace {

struct CpuExec {
  struct Guard {
    explicit Guard(const at::Tensor&) {}
  };

  template <class D>
  static void linear(int64_t M, int64_t N, int64_t K, const typename D::storage* x, int64_t ldx,
                     const typename D::storage* w, const typename D::storage* bias, typename D::storage* y) {
    for_rows(M, [&](int64_t m) {
      for (int64_t n = 0; n < N; ++n) {
        const float acc = linear_dot<D>(x + m * ldx, w + n * K, K);
        y[m * N + n] = store_out<D>(bias == nullptr ? acc : acc + D::load(bias, n));
      }
    });
  }

  // The row's tree sum of term(i), i < n (section 2): chunk pairwise sums pushed into a TreeStack.
  template <class Term>
  static float row_sum(const Term& term, int64_t n) {
    TreeStack<float> st;
    push_range_sum(st, [&](int64_t c, float v[RL_CHUNK], bool) {
      for (int j = 0; j < RL_CHUNK; ++j) v[j] = c * RL_CHUNK + j < n ? term(c * RL_CHUNK + j) : 0.0f;
    }, 0, chunks_of(n), n);
    return st.fold();
  }

  template <class D>
  static void rms_norm(int64_t rows, int64_t H, const typename D::storage* x, const typename D::storage* w,
                       float inv_n, float eps, typename D::storage* y, float* rstd) {
    for_rows(rows, [&](int64_t m) {
      const auto* row = x + m * H;
      const float ss = row_sum([&](int64_t i) {
        const float v = D::load(row, i);
        return v * v;
      }, H);
      const float r = rms_rstd(ss, inv_n, eps);
      for (int64_t i = 0; i < H; ++i) y[m * H + i] = rms_out<D>(D::load(row, i), r, D::load(w, i));
      rstd[m] = r;
    });
  }

  template <class D>
  static void rms_norm_backward(int64_t rows, int64_t H, const typename D::storage* dy, const typename D::storage* x,
                                const typename D::storage* w, const float* rstd, float inv_n, typename D::storage* dx,
                                typename D::storage* dw) {
    for_rows(rows, [&](int64_t m) {
      const int64_t base = m * H;
      const float dot = row_sum([&](int64_t i) {
        return no_neg_zero((D::load(dy, base + i) * D::load(w, i)) * D::load(x, base + i));
      }, H);
      const float r = rstd[m];
      const float c = rms_grad_coef(dot, inv_n, r);
      for (int64_t i = 0; i < H; ++i)
        dx[base + i] = store_out<D>(rms_grad_x(D::load(x, base + i), D::load(dy, base + i) * D::load(w, i), r, c));
    });
    for_rows(H, [&](int64_t j) {
      float acc = 0.0f;
      for (int64_t m = 0; m < rows; ++m)
        acc = fma_rn(D::load(dy, m * H + j), rounded<D>(D::load(x, m * H + j) * rstd[m]), acc);
      dw[j] = store_out<D>(acc);
    });
  }

  static void rope_table(int64_t P, int64_t half, const int64_t* pos, const float* inv_freq, float* c, float* s) {
    for_rows(P, [&](int64_t p) {
      for (int64_t i = 0; i < half; ++i) {
        const SinCos sc = rope_angle(pos[p], inv_freq[i]);
        c[p * half + i] = canonical(sc.c);
        s[p * half + i] = canonical(sc.s);
      }
    });
  }

  template <class D>
  static void rotary(int64_t B, int64_t H, int64_t T, int64_t Dh, const typename D::storage* x, const float* cosv,
                     const float* sinv, typename D::storage* out) {
    const int64_t half = Dh / 2;
    for_rows(B * H * T, [&](int64_t row) {
      const int64_t t = row % T, b = row / (H * T);
      const float* c = cosv + (b * T + t) * half;
      const float* s = sinv + (b * T + t) * half;
      for (int64_t i = 0; i < half; ++i) {
        const int64_t at = row * Dh + i;
        const Pair p = rotate(D::load(x, at), D::load(x, at + half), c[i], s[i]);
        out[at] = store_out<D>(p.a);
        out[at + half] = store_out<D>(p.b);
      }
    });
  }

  template <class D>
  static void silu_mul(int64_t n, const typename D::storage* g, const typename D::storage* u,
                       typename D::storage* out) {
    for_rows(n, [&](int64_t e) { out[e] = store_out<D>(rl::silu_mul(D::load(g, e), D::load(u, e))); });
  }

  template <class D>
  static void silu_mul_backward(int64_t n, const typename D::storage* dy, const typename D::storage* g,
                                const typename D::storage* u, typename D::storage* dg, typename D::storage* du) {
    for_rows(n, [&](int64_t e) {
      const Pair p = silu_mul_grad(D::load(dy, e), D::load(g, e), D::load(u, e));
      dg[e] = store_out<D>(p.a);
      du[e] = store_out<D>(p.b);
    });
  }

  template <class D>
  static void attention(int64_t rows, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t Dh,
                        const typename D::storage* q, const typename D::storage* k, const typename D::storage* v,
                        const int64_t* q_pos, const int64_t* k_start, float scale, int64_t window,
                        const float* sinks, typename D::storage* o, float* stats) {
    for_rows(rows, [&](int64_t row) {
      const int64_t t = row % Tq, h = (row / Tq) % Hq, b = row / (Tq * Hq);
      const int64_t kv = (b * Hkv + h / (Hq / Hkv)) * Tk * Dh, j1 = q_pos[b * Tq + t];
      std::vector<float> acc(static_cast<size_t>(Dh));
      attention_row<D>(q + row * Dh, k + kv, v + kv, Dh, attn_first_key(k_start[b], j1, window), j1, scale,
                       attn_start(sinks, h), o + row * Dh, stats + 2 * row, acc.data());
    });
  }

  template <class D>
  static void attention_sink_terms(int64_t B, int64_t Hq, int64_t Tq, int64_t Dh, const float* stats,
                                   const typename D::storage* o, const typename D::storage* go, const float* sinks,
                                   float* terms) {
    for_rows(B * Hq * Tq, [&](int64_t row) {
      const int64_t h = (row / Tq) % Hq;
      terms[row] = attn_sink_term(sinks[h], attn_row_grad<D>(stats + 2 * row, o + row * Dh, go + row * Dh, Dh));
    });
  }

  template <class D>
  static void attention_backward(int64_t B, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t Dh,
                                 const typename D::storage* go, const typename D::storage* q,
                                 const typename D::storage* k, const typename D::storage* v,
                                 const typename D::storage* o, const float* stats, const int64_t* q_pos,
                                 const int64_t* k_start, float scale, int64_t window, typename D::storage* dq,
                                 typename D::storage* dk, typename D::storage* dv) {
    const int64_t rows = B * Hq * Tq, group = Hq / Hkv;
    std::vector<RowGrad> rg(static_cast<size_t>(rows));
    for_rows(rows, [&](int64_t row) { rg[row] = attn_row_grad<D>(stats + 2 * row, o + row * Dh, go + row * Dh, Dh); });
    // dq: per query row, keys j0 .. j1 ascending.
    for_rows(rows, [&](int64_t row) {
      const int64_t t = row % Tq, h = (row / Tq) % Hq, b = row / (Tq * Hq);
      const int64_t kv = (b * Hkv + h / group) * Tk * Dh;
      std::vector<float> acc(static_cast<size_t>(Dh), 0.0f);
      const int64_t j1 = q_pos[b * Tq + t];
      for (int64_t j = attn_first_key(k_start[b], j1, window); j <= j1; ++j) {
        const float ds = attn_pair_grad<D>(q + row * Dh, go + row * Dh, k + kv + j * Dh, v + kv + j * Dh, Dh, scale,
                                           rg[row]).b;
        for (int64_t d = 0; d < Dh; ++d) acc[d] = fma_rn(ds, D::load(k, kv + j * Dh + d), acc[d]);
      }
      for (int64_t d = 0; d < Dh; ++d) dq[row * Dh + d] = store_out<D>(acc[d] * scale);
    });
    // dk, dv: per key row, the group's query heads in order, then the rows that see the key in order.
    for_rows(B * Hkv * Tk, [&](int64_t kvrow) {
      const int64_t j = kvrow % Tk, kvh = (kvrow / Tk) % Hkv, b = kvrow / (Tk * Hkv);
      std::vector<float> ak(static_cast<size_t>(Dh), 0.0f), av(static_cast<size_t>(Dh), 0.0f);
      for (int64_t g = 0; g < group && j >= k_start[b]; ++g) {
        for (int64_t i = 0; i < Tq; ++i) {
          const int64_t qp = q_pos[b * Tq + i];
          if (j > qp || j < attn_first_key(k_start[b], qp, window)) continue;
          const int64_t row = (b * Hq + kvh * group + g) * Tq + i;
          const Pair pg = attn_pair_grad<D>(q + row * Dh, go + row * Dh, k + kvrow * Dh, v + kvrow * Dh, Dh, scale,
                                            rg[row]);
          for (int64_t d = 0; d < Dh; ++d) {
            ak[d] = fma_rn(pg.b, D::load(q, row * Dh + d), ak[d]);
            av[d] = fma_rn(pg.a, D::load(go, row * Dh + d), av[d]);
          }
        }
      }
      for (int64_t d = 0; d < Dh; ++d) {
        dk[kvrow * Dh + d] = store_out<D>(ak[d] * scale);
        dv[kvrow * Dh + d] = store_out<D>(av[d]);
      }
    });
  }
};

}  // namespace
}  // namespace rl

TORCH_LIBRARY_FRAGMENT(rl_kernel, m) {
  m.def("linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> (Tensor, Tensor)");
  m.def("rms_norm_backward(Tensor grad, Tensor x, Tensor weight, Tensor rstd) -> (Tensor, Tensor)");
  m.def("rope_table(Tensor positions, Tensor inv_freq) -> (Tensor, Tensor)");
  m.def("rotary(Tensor x, Tensor cos, Tensor sin) -> Tensor");
  m.def("silu_mul(Tensor gate, Tensor up) -> Tensor");
  m.def("silu_mul_backward(Tensor grad, Tensor gate, Tensor up) -> (Tensor, Tensor)");
  m.def(
      "attention(Tensor q, Tensor k, Tensor v, Tensor q_pos, Tensor k_start, float scale, int window=0, "
      "Tensor? sinks=None) -> (Tensor, Tensor)");
  m.def(
      "attention_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor out, Tensor stats, Tensor q_pos, "
      "Tensor k_start, float scale, int window=0) -> (Tensor, Tensor, Tensor)");
  m.def("attention_sink_terms(Tensor grad, Tensor out, Tensor stats, Tensor sinks) -> Tensor");
}

TORCH_LIBRARY_IMPL(rl_kernel, CPU, m) { rl::impl_decoder<rl::CpuExec>(m); }
