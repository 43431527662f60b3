// The CUDA / HIP executor of the decoder family: decoder.cuh's kernels, on the current stream. On ROCm,
// torch's build hipifies this file; the kernels themselves are portable.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "../common/gpu_host.h"
#include "decoder_ops.h"

namespace rl {
namespace {

unsigned blocks_for(int64_t n, int64_t per_block, const char* what) {
  const int64_t b = (n + per_block - 1) / per_block;
  RL_CHECK(b <= int64_t(0x7fffffff), "rl_kernel: ", what, ": ", n, " items are more than one launch takes");
  return static_cast<unsigned>(b);
}

template <class Kernel, class... Args>
void launch_grid(Kernel kernel, dim3 grid, int threads, size_t shared, Args... args) {
  if (grid.x == 0 || grid.y == 0) return;
  before_launch();
  kernel<<<grid, threads, shared, at::cuda::getCurrentCUDAStream()>>>(args...);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Shared memory of a norm row: its chunk sums, padded to a power of two.
size_t norm_shared(int64_t H) {
  const int64_t chunks = chunks_of(H);
  RL_CHECK(chunks <= RL_NORM_MAX_CHUNKS, "rl_kernel: rms_norm rows of at most ", RL_NORM_MAX_CHUNKS * RL_CHUNK,
              " elements on the GPU, got ", H);
  int64_t width = 1;
  while (width < chunks) width <<= 1;
  return size_t(width) * sizeof(float);
}

// Rows up to which one thread per column (linear_skinny_kernel) beats the 128 x 128 tiles (measured on
// the H200: docs/benchmarks.md).
constexpr int64_t RL_SKINNY_MAX_M = 4;

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

template <class D>
void linear_skinny(int64_t M, int64_t N, int64_t K, const typename D::storage* x, int64_t ldx,
                   const typename D::storage* w, const typename D::storage* bias, typename D::storage* y) {
  const int64_t size = int64_t(sizeof(typename D::storage));
  const bool vec = K % 8 == 0 && (ldx * size) % 16 == 0 && aligned16(x) && aligned16(w);
  const dim3 grid(blocks_for(N, RL_WARP, "linear"), static_cast<unsigned>((M + RL_SKINNY_ROWS - 1) / RL_SKINNY_ROWS));
  if (vec)
    launch_grid(linear_skinny_kernel<D, true>, grid, RL_WARP, 0, M, N, K, x, ldx, w, bias, y);
  else
    launch_grid(linear_skinny_kernel<D, false>, grid, RL_WARP, 0, M, N, K, x, ldx, w, bias, y);
}

struct GpuExec {
  struct Guard {
    explicit Guard(const at::Tensor& t) : g(t.device()) {}
    c10::cuda::CUDAGuard g;
  };

  template <class D>
  static void linear(int64_t M, int64_t N, int64_t K, const typename D::storage* x, int64_t ldx,
                     const typename D::storage* w, const typename D::storage* bias, typename D::storage* y) {
    if (M <= RL_SKINNY_MAX_M) return linear_skinny<D>(M, N, K, x, ldx, w, bias, y);
    const int64_t mt = (M + RL_GEMM_BM - 1) / RL_GEMM_BM;
    RL_CHECK(mt <= 65535, "rl_kernel: linear takes at most ", 65535 * RL_GEMM_BM, " rows per call, got ", M);
    const dim3 grid(blocks_for(N, RL_GEMM_BN, "linear"), static_cast<unsigned>(mt));
    launch_grid(linear_kernel<D>, grid, RL_GEMM_THREADS, 0, M, N, K, x, ldx, w, bias, y);
  }

  template <class D>
  static void rms_norm(int64_t rows, int64_t H, const typename D::storage* x, const typename D::storage* w,
                       float inv_n, float eps, typename D::storage* y, float* rstd) {
    launch_grid(rms_norm_kernel<D>, dim3(blocks_for(rows, 1, "rms_norm")), RL_NORM_THREADS, norm_shared(H), H, x, w,
                inv_n, eps, y, rstd);
  }

  template <class D>
  static void rms_norm_backward(int64_t rows, int64_t H, const typename D::storage* dy, const typename D::storage* x,
                                const typename D::storage* w, const float* rstd, float inv_n, typename D::storage* dx,
                                typename D::storage* dw) {
    launch_grid(rms_norm_backward_kernel<D>, dim3(blocks_for(rows, 1, "rms_norm_backward")), RL_NORM_THREADS,
                norm_shared(H), H, dy, x, w, rstd, inv_n, dx);
    launch_grid(rms_norm_weight_grad_kernel<D>, dim3(blocks_for(H, RL_NORM_THREADS, "rms_norm_backward")),
                RL_NORM_THREADS, 0, rows, H, dy, x, rstd, dw);
  }

  static void rope_table(int64_t P, int64_t half, const int64_t* pos, const float* inv_freq, float* c, float* s) {
    launch_grid(rope_table_kernel, dim3(blocks_for(P, 1, "rope_table")), RL_ROPE_THREADS, 0, half, pos, inv_freq, c,
                s);
  }

  template <class D>
  static void rotary(int64_t B, int64_t H, int64_t T, int64_t Dh, const typename D::storage* x, const float* cosv,
                     const float* sinv, typename D::storage* out) {
    RL_CHECK(B <= 65535 && H <= 65535, "rl_kernel: rotary takes at most 65535 sequences and heads on the GPU");
    launch_grid(rotary_kernel<D>, dim3(blocks_for(T, 1, "rotary"), unsigned(H), unsigned(B)), RL_ROPE_THREADS, 0, H,
                T, Dh, x, cosv, sinv, out);
  }

  template <class D>
  static void silu_mul(int64_t n, const typename D::storage* g, const typename D::storage* u,
                       typename D::storage* out) {
    launch_grid(silu_mul_kernel<D>, dim3(blocks_for(n, RL_ELEM_THREADS, "silu_mul")), RL_ELEM_THREADS, 0, n, g, u,
                out);
  }

  template <class D>
  static void silu_mul_backward(int64_t n, const typename D::storage* dy, const typename D::storage* g,
                                const typename D::storage* u, typename D::storage* dg, typename D::storage* du) {
    launch_grid(silu_mul_backward_kernel<D>, dim3(blocks_for(n, RL_ELEM_THREADS, "silu_mul_backward")),
                RL_ELEM_THREADS, 0, n, dy, g, u, dg, du);
  }

  // A block per (chunk of qc query positions, KV head, sequence): qc x group warps, at most 8 unless a group
  // alone is larger (at most 32 query heads per KV head). With a window, one query position per block: its rows
  // share their first key, from which their tiles are counted.
  template <class D>
  static void attention(int64_t rows, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t Dh,
                        const typename D::storage* q, const typename D::storage* k, const typename D::storage* v,
                        const int64_t* q_pos, const int64_t* k_start, float scale, int64_t window,
                        const float* sinks, typename D::storage* o, float* stats) {
    if (rows == 0) return;
    const int64_t group = Hq / Hkv, B = rows / (Hq * Tq);
    RL_CHECK(group <= RL_ATTN_MAX_WARPS, "rl_kernel: attention takes at most ", RL_ATTN_MAX_WARPS,
                " query heads per KV head on the GPU, got ", group);
    RL_CHECK(B <= 65535 && Hkv <= 65535, "rl_kernel: attention takes at most 65535 sequences and KV heads");
    const int qc = int(group >= 8 || window > 0 ? 1 : 8 / group);
    const int warps = int(group) * qc;
    const size_t shared = size_t(attn_shared_floats(Dh, warps)) * sizeof(float);
    if (shared > 48 * 1024)
      C10_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          int(shared)));
    const dim3 grid(blocks_for(Tq, qc, "attention"), unsigned(Hkv), unsigned(B));
    launch_grid(attention_kernel<D>, grid, warps * RL_WARP, shared, Hq, Hkv, Tq, Tk, Dh, int(group), qc, q, k, v,
                q_pos, k_start, scale, window, sinks, o, stats);
  }

  template <class D>
  static void attention_sink_terms(int64_t B, int64_t Hq, int64_t Tq, int64_t Dh, const float* stats,
                                   const typename D::storage* o, const typename D::storage* go, const float* sinks,
                                   float* terms) {
    if (B * Hq * Tq == 0) return;
    RL_CHECK(B <= 65535 && Hq <= 65535, "rl_kernel: attention takes at most 65535 sequences and heads");
    launch_grid(attention_sink_terms_kernel<D>, dim3(blocks_for(Tq, 128, "attention"), unsigned(Hq), unsigned(B)), 128,
                0, Hq, Tq, Dh, stats, o, go, sinks, terms);
  }

  template <class D>
  static void attention_backward(int64_t B, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t Dh,
                                 const typename D::storage* go, const typename D::storage* q,
                                 const typename D::storage* k, const typename D::storage* v,
                                 const typename D::storage* o, const float* stats, const int64_t* q_pos,
                                 const int64_t* k_start, float scale, int64_t window, typename D::storage* dq,
                                 typename D::storage* dk, typename D::storage* dv) {
    if (B == 0 || Hq == 0) return;
    RL_CHECK(B <= 65535 && Hq <= 65535, "rl_kernel: attention takes at most 65535 sequences and heads");
    at::Tensor rowg = at::empty({B * Hq * Tq * 4}, at::TensorOptions().dtype(at::kFloat).device(at::kCUDA));
    float* rg = rowg.data_ptr<float>();
    launch_grid(attention_row_grad_kernel<D>, dim3(blocks_for(Tq, 128, "attention"), unsigned(Hq), unsigned(B)), 128,
                0, Hq, Tq, Dh, stats, o, go, rg);
    launch_grid(attention_dq_kernel<D>, dim3(blocks_for(Tq, RL_ATTN_BWD_WARPS, "attention"), unsigned(Hq), unsigned(B)),
                RL_ATTN_BWD_WARPS * RL_WARP, 0, Hq, Hkv, Hq / Hkv, Tq, Tk, Dh, q, k, v, go, q_pos, k_start, rg, scale, window,
                dq);
    launch_grid(attention_dkv_kernel<D>, dim3(blocks_for(Tk, RL_ATTN_BWD_WARPS, "attention"), unsigned(Hkv), unsigned(B)),
                RL_ATTN_BWD_WARPS * RL_WARP, 0, Hq, Hkv, Hq / Hkv, Tq, Tk, Dh, q, k, v, go, q_pos, k_start, rg, scale, window,
                dk, dv);
  }
};

}  // namespace
}  // namespace rl

TORCH_LIBRARY_IMPL(rl_kernel, CUDA, m) { rl::impl_decoder<rl::GpuExec>(m); }
