// The decoder family's operators for one executor (CpuExec in decoder_cpu.cpp, GpuExec in
// decoder_gpu.cu): argument checks with clear messages, output allocation and dtype dispatch. The
// arithmetic is decoder.cuh's, the same for both executors.
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

#include "../common/glue.h"
#include "decoder.cuh"

namespace rl {

inline void check_float(const at::Tensor& t, const char* what) {
  const auto st = t.scalar_type();
  RL_CHECK(st == at::kFloat || st == at::kBFloat16 || st == at::kHalf, "rl_kernel: ", what,
              " must be float32, bfloat16 or float16, got ", st);
}

inline void check_like(const at::Tensor& t, const at::Tensor& ref, const char* what, const char* ref_what) {
  RL_CHECK(t.scalar_type() == ref.scalar_type(), "rl_kernel: ", what, " is ", t.scalar_type(), " but ", ref_what,
              " is ", ref.scalar_type(), " (they must have one dtype)");
  check_same_device(t, ref, what, ref_what);
}

inline void check_dim(const at::Tensor& t, int64_t dim, const char* what) {
  RL_CHECK(t.dim() == dim, "rl_kernel: ", what, " must have ", dim, " dimensions, got shape ", t.sizes());
}

// 1/n, the mean's factor (section 11): the double quotient rounded to binary32, on the host.
inline float inverse_of(int64_t n) { return float(1.0 / double(n)); }

template <class Exec>
at::Tensor linear_op(const at::Tensor& x, const at::Tensor& weight, const c10::optional<at::Tensor>& bias) {
  check_float(x, "x");
  RL_CHECK(x.dim() >= 1, "rl_kernel: x must have at least one dimension (the features)");
  check_dim(weight, 2, "weight");
  check_like(weight, x, "weight", "x");
  RL_CHECK(weight.size(1) == x.size(-1), "rl_kernel: weight is [N, K] = ", weight.sizes(), " but x has K = ",
              x.size(-1), " features");
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    b = bias->contiguous();
    check_like(b, x, "bias", "x");
    RL_CHECK(b.dim() == 1 && b.size(0) == weight.size(0), "rl_kernel: bias must be [N] = [", weight.size(0),
                "], got ", b.sizes());
  }
  const typename Exec::Guard guard(x);
  const Rows r = rows_of(x);
  const at::Tensor w = weight.contiguous();
  auto shape = lead_shape(x);
  shape.push_back(w.size(0));
  at::Tensor y = at::empty(shape, x.options());
  dispatch_dtype(x, [&](auto d) {
    using D = decltype(d);
    Exec::template linear<D>(r.n, w.size(0), r.v, data_of<D>(r.t), r.stride, data_of<D>(w),
                             b.defined() ? data_of<D>(b) : nullptr,
                             reinterpret_cast<typename D::storage*>(y.data_ptr()));
  });
  return y;
}

template <class Exec>
std::tuple<at::Tensor, at::Tensor> rms_norm_op(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_float(x, "x");
  RL_CHECK(x.dim() >= 1 && x.size(-1) >= 1, "rl_kernel: x must have a non-empty last dimension");
  check_like(weight, x, "weight", "x");
  RL_CHECK(weight.dim() == 1 && weight.size(0) == x.size(-1), "rl_kernel: weight must be [", x.size(-1),
              "], got ", weight.sizes());
  RL_CHECK(eps >= 0.0, "rl_kernel: eps must be >= 0, got ", eps);
  const typename Exec::Guard guard(x);
  const at::Tensor xc = x.contiguous(), w = weight.contiguous();
  const int64_t H = x.size(-1), rows = x.numel() / H;
  at::Tensor y = at::empty_like(xc);
  at::Tensor rstd = at::empty(lead_shape(x), f32_like(x));
  dispatch_dtype(x, [&](auto d) {
    using D = decltype(d);
    Exec::template rms_norm<D>(rows, H, data_of<D>(xc), data_of<D>(w), inverse_of(H), float(eps),
                               reinterpret_cast<typename D::storage*>(y.data_ptr()), rstd.data_ptr<float>());
  });
  return {y, rstd};
}

template <class Exec>
std::tuple<at::Tensor, at::Tensor> rms_norm_backward_op(const at::Tensor& grad, const at::Tensor& x,
                                                        const at::Tensor& weight, const at::Tensor& rstd) {
  check_like(grad, x, "grad", "x");
  RL_CHECK(grad.sizes() == x.sizes(), "rl_kernel: grad shape ", grad.sizes(), " must equal x shape ", x.sizes());
  RL_CHECK(rstd.scalar_type() == at::kFloat && rstd.numel() * x.size(-1) == x.numel(),
              "rl_kernel: rstd must be the float32 per-row values rms_norm returned");
  const typename Exec::Guard guard(x);
  const at::Tensor g = grad.contiguous(), xc = x.contiguous(), w = weight.contiguous(), r = rstd.contiguous();
  const int64_t H = x.size(-1), rows = x.numel() / H;
  at::Tensor dx = at::empty_like(xc), dw = at::empty_like(w);
  dispatch_dtype(x, [&](auto d) {
    using D = decltype(d);
    using S = typename D::storage;
    Exec::template rms_norm_backward<D>(rows, H, data_of<D>(g), data_of<D>(xc), data_of<D>(w),
                                        r.const_data_ptr<float>(), inverse_of(H), reinterpret_cast<S*>(dx.data_ptr()),
                                        reinterpret_cast<S*>(dw.data_ptr()));
  });
  return {dx, dw};
}

template <class Exec>
std::tuple<at::Tensor, at::Tensor> rope_table_op(const at::Tensor& positions, const at::Tensor& inv_freq) {
  RL_CHECK(positions.scalar_type() == at::kLong, "rl_kernel: positions must be int64, got ",
              positions.scalar_type());
  RL_CHECK(inv_freq.scalar_type() == at::kFloat && inv_freq.dim() == 1,
              "rl_kernel: inv_freq must be a 1-d float32 tensor, got ", inv_freq.scalar_type(), " ", inv_freq.sizes());
  check_same_device(inv_freq, positions, "inv_freq", "positions");
  const typename Exec::Guard guard(positions);
  const at::Tensor p = positions.contiguous(), f = inv_freq.contiguous();
  auto shape = positions.sizes().vec();
  shape.push_back(f.size(0));
  at::Tensor c = at::empty(shape, f.options()), s = at::empty(shape, f.options());
  Exec::rope_table(p.numel(), f.size(0), p.const_data_ptr<int64_t>(), f.const_data_ptr<float>(), c.data_ptr<float>(),
                   s.data_ptr<float>());
  return {c, s};
}

template <class Exec>
at::Tensor rotary_op(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  check_float(x, "x");
  check_dim(x, 4, "x ([batch, heads, seq, head_dim])");
  RL_CHECK(x.size(3) % 2 == 0, "rl_kernel: head_dim must be even, got ", x.size(3));
  for (const auto* t : {&cos, &sin}) {
    RL_CHECK(t->scalar_type() == at::kFloat, "rl_kernel: cos and sin must be float32 (rope_table's output)");
    RL_CHECK(t->sizes() == at::IntArrayRef({x.size(0), x.size(2), x.size(3) / 2}),
                "rl_kernel: cos and sin must be [batch, seq, head_dim / 2] = [", x.size(0), ", ", x.size(2), ", ",
                x.size(3) / 2, "], got ", t->sizes());
    check_same_device(*t, x, "cos/sin", "x");
  }
  const typename Exec::Guard guard(x);
  const at::Tensor xc = x.contiguous(), c = cos.contiguous(), s = sin.contiguous();
  at::Tensor out = at::empty_like(xc);
  dispatch_dtype(x, [&](auto d) {
    using D = decltype(d);
    Exec::template rotary<D>(x.size(0), x.size(1), x.size(2), x.size(3), data_of<D>(xc), c.const_data_ptr<float>(),
                             s.const_data_ptr<float>(), reinterpret_cast<typename D::storage*>(out.data_ptr()));
  });
  return out;
}

template <class Exec>
at::Tensor silu_mul_op(const at::Tensor& gate, const at::Tensor& up) {
  check_float(gate, "gate");
  check_like(up, gate, "up", "gate");
  RL_CHECK(up.sizes() == gate.sizes(), "rl_kernel: up shape ", up.sizes(), " must equal gate shape ", gate.sizes());
  const typename Exec::Guard guard(gate);
  const at::Tensor g = gate.contiguous(), u = up.contiguous();
  at::Tensor out = at::empty_like(g);
  dispatch_dtype(g, [&](auto d) {
    using D = decltype(d);
    Exec::template silu_mul<D>(g.numel(), data_of<D>(g), data_of<D>(u),
                               reinterpret_cast<typename D::storage*>(out.data_ptr()));
  });
  return out;
}

template <class Exec>
std::tuple<at::Tensor, at::Tensor> silu_mul_backward_op(const at::Tensor& grad, const at::Tensor& gate,
                                                        const at::Tensor& up) {
  check_float(gate, "gate");
  check_like(up, gate, "up", "gate");
  check_like(grad, gate, "grad", "gate");
  RL_CHECK(up.sizes() == gate.sizes() && grad.sizes() == gate.sizes(),
              "rl_kernel: grad, gate and up must have one shape");
  const typename Exec::Guard guard(gate);
  const at::Tensor dy = grad.contiguous(), g = gate.contiguous(), u = up.contiguous();
  at::Tensor dg = at::empty_like(g), du = at::empty_like(g);
  dispatch_dtype(g, [&](auto d) {
    using D = decltype(d);
    using S = typename D::storage;
    Exec::template silu_mul_backward<D>(g.numel(), data_of<D>(dy), data_of<D>(g), data_of<D>(u),
                                        reinterpret_cast<S*>(dg.data_ptr()), reinterpret_cast<S*>(du.data_ptr()));
  });
  return {dg, du};
}

// Attention sinks: float32 [heads of q] on q's device (one logit per query head), or none.
inline void check_sinks(const std::optional<at::Tensor>& sinks, const at::Tensor& q) {
  if (!sinks) return;
  RL_CHECK(sinks->scalar_type() == at::kFloat && sinks->dim() == 1 && sinks->size(0) == q.size(1),
           "rl_kernel: attention's sinks must be float32 [", q.size(1), "] (a logit per query head), got ",
           sinks->scalar_type(), " ", sinks->sizes());
  check_same_device(*sinks, q, "sinks", "q");
}

// Shapes only; the key ranges (0 <= k_start[b], q_pos[b, t] < Tk) are checked in Python (rl_kernel.exact.decoder.ops),
// where a GPU tensor's values can be read.
template <class Exec>
std::tuple<at::Tensor, at::Tensor> attention_op(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                                const at::Tensor& q_pos, const at::Tensor& k_start, double scale,
                                                int64_t window, const std::optional<at::Tensor>& sinks) {
  check_float(q, "q");
  RL_CHECK(window >= 0, "rl_kernel: attention's window must be >= 0 keys (0: none), got ", window);
  check_dim(q, 4, "q ([batch, heads, q_len, head_dim])");
  check_dim(k, 4, "k ([batch, kv_heads, kv_len, head_dim])");
  check_like(k, q, "k", "q");
  check_like(v, q, "v", "q");
  RL_CHECK(v.sizes() == k.sizes(), "rl_kernel: v shape ", v.sizes(), " must equal k shape ", k.sizes());
  const int64_t B = q.size(0), Hq = q.size(1), Tq = q.size(2), Dh = q.size(3), Hkv = k.size(1), Tk = k.size(2);
  RL_CHECK(k.size(0) == B && k.size(3) == Dh, "rl_kernel: k is ", k.sizes(), " but q is ", q.sizes(),
              " (batch and head_dim must agree)");
  RL_CHECK(Hkv >= 1 && Hq % Hkv == 0, "rl_kernel: q has ", Hq, " heads, not a multiple of k's ", Hkv);
  RL_CHECK(Dh >= 1 && Dh <= RL_ATTN_MAX_DIM, "rl_kernel: head_dim must be 1 .. ", RL_ATTN_MAX_DIM,
              ", got ", Dh);
  RL_CHECK(q_pos.scalar_type() == at::kLong && q_pos.sizes() == at::IntArrayRef({B, Tq}),
              "rl_kernel: q_pos must be int64 [batch, q_len] = [", B, ", ", Tq, "], got ", q_pos.scalar_type(), " ",
              q_pos.sizes());
  RL_CHECK(k_start.scalar_type() == at::kLong && k_start.sizes() == at::IntArrayRef({B}),
              "rl_kernel: k_start must be int64 [batch] = [", B, "], got ", k_start.scalar_type(), " ", k_start.sizes());
  check_same_device(q_pos, q, "q_pos", "q");
  check_same_device(k_start, q, "k_start", "q");
  check_sinks(sinks, q);
  const typename Exec::Guard guard(q);
  const at::Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  const at::Tensor qp = q_pos.contiguous(), ks = k_start.contiguous();
  const at::Tensor sk = sinks ? sinks->contiguous() : at::Tensor();
  at::Tensor o = at::empty_like(qc);
  at::Tensor stats = at::empty({B, Hq, Tq, 2}, f32_like(q));
  dispatch_dtype(q, [&](auto d) {
    using D = decltype(d);
    Exec::template attention<D>(B * Hq * Tq, Hq, Hkv, Tq, Tk, Dh, data_of<D>(qc), data_of<D>(kc), data_of<D>(vc),
                                qp.const_data_ptr<int64_t>(), ks.const_data_ptr<int64_t>(), float(scale), window,
                                sinks ? sk.const_data_ptr<float>() : nullptr,
                                reinterpret_cast<typename D::storage*>(o.data_ptr()), stats.data_ptr<float>());
  });
  return {o, stats};
}

// Backward of attention_op from its output and statistics: (dq, dk, dv) in q's dtype.
template <class Exec>
std::tuple<at::Tensor, at::Tensor, at::Tensor> attention_backward_op(const at::Tensor& grad, const at::Tensor& q,
                                                                     const at::Tensor& k, const at::Tensor& v,
                                                                     const at::Tensor& out, const at::Tensor& stats,
                                                                     const at::Tensor& q_pos,
                                                                     const at::Tensor& k_start, double scale,
                                                                     int64_t window) {
  check_like(grad, q, "grad", "q");
  RL_CHECK(window >= 0, "rl_kernel: attention's window must be >= 0 keys (0: none), got ", window);
  check_like(out, q, "out", "q");
  RL_CHECK(grad.sizes() == q.sizes() && out.sizes() == q.sizes(), "rl_kernel: grad and out must be shaped like q ",
              q.sizes());
  RL_CHECK(stats.scalar_type() == at::kFloat && stats.dim() == 4 && stats.size(3) == 2 &&
                  stats.numel() == 2 * q.numel() / q.size(3),
              "rl_kernel: stats must be the float32 [batch, heads, q_len, 2] statistics attention returned");
  const typename Exec::Guard guard(q);
  const at::Tensor g = grad.contiguous(), qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  const at::Tensor oc = out.contiguous(), st = stats.contiguous(), qp = q_pos.contiguous(), ks = k_start.contiguous();
  at::Tensor dq = at::empty_like(qc), dk = at::empty_like(kc), dv = at::empty_like(vc);
  const int64_t B = q.size(0), Hq = q.size(1), Tq = q.size(2), Dh = q.size(3), Hkv = k.size(1), Tk = k.size(2);
  dispatch_dtype(q, [&](auto d) {
    using D = decltype(d);
    using S = typename D::storage;
    Exec::template attention_backward<D>(B, Hq, Hkv, Tq, Tk, Dh, data_of<D>(g), data_of<D>(qc), data_of<D>(kc),
                                         data_of<D>(vc), data_of<D>(oc), st.const_data_ptr<float>(),
                                         qp.const_data_ptr<int64_t>(), ks.const_data_ptr<int64_t>(), float(scale),
                                         window, reinterpret_cast<S*>(dq.data_ptr()), reinterpret_cast<S*>(dk.data_ptr()),
                                         reinterpret_cast<S*>(dv.data_ptr()));
  });
  return {dq, dk, dv};
}

// The rows' terms of the sinks' gradient, [batch, heads, q_len] fp32 (attn_sink_term, from the forward's output and
// statistics); the gradient of a head's sink is their section 2 tree over its rows (rl_kernel.exact.decoder.ops).
template <class Exec>
at::Tensor attention_sink_terms_op(const at::Tensor& grad, const at::Tensor& out, const at::Tensor& stats,
                                   const at::Tensor& sinks) {
  check_float(out, "out");
  check_like(grad, out, "grad", "out");
  check_dim(out, 4, "out ([batch, heads, q_len, head_dim])");
  RL_CHECK(grad.sizes() == out.sizes(), "rl_kernel: grad must be shaped like out ", out.sizes());
  RL_CHECK(stats.scalar_type() == at::kFloat && stats.dim() == 4 && stats.size(3) == 2 &&
               stats.numel() == 2 * out.numel() / out.size(3),
           "rl_kernel: stats must be the float32 [batch, heads, q_len, 2] statistics attention returned");
  check_sinks(sinks, out);
  check_same_device(stats, out, "stats", "out");
  const typename Exec::Guard guard(out);
  const at::Tensor g = grad.contiguous(), oc = out.contiguous(), st = stats.contiguous(), sk = sinks.contiguous();
  const int64_t B = out.size(0), Hq = out.size(1), Tq = out.size(2), Dh = out.size(3);
  at::Tensor terms = at::empty({B, Hq, Tq}, f32_like(out));
  dispatch_dtype(out, [&](auto d) {
    using D = decltype(d);
    Exec::template attention_sink_terms<D>(B, Hq, Tq, Dh, st.const_data_ptr<float>(), data_of<D>(oc), data_of<D>(g),
                                           sk.const_data_ptr<float>(), terms.data_ptr<float>());
  });
  return terms;
}

// Registers one executor's decoder operators under the dispatch key of m.
template <class Exec>
void impl_decoder(torch::Library& m) {
  impl_ops(m, "linear", &linear_op<Exec>, "rms_norm", &rms_norm_op<Exec>, "rms_norm_backward",
           &rms_norm_backward_op<Exec>, "rope_table", &rope_table_op<Exec>, "rotary", &rotary_op<Exec>, "silu_mul",
           &silu_mul_op<Exec>, "silu_mul_backward", &silu_mul_backward_op<Exec>, "attention", &attention_op<Exec>,
           "attention_backward", &attention_backward_op<Exec>, "attention_sink_terms", &attention_sink_terms_op<Exec>);
}

}  // namespace rl
