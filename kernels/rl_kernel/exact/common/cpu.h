// What every family's CPU executor shares: the row loop over threads, each thread in
// IEEE mode for the loop's duration.
//
// A process can be in flush-to-zero / denormals-are-zero mode without asking for it: any
// library built with fast-math that it loads may set the bits (torch.set_flush_denormal
// does it on purpose). The GPU builds are IEEE by their flags (--ftz=false,
// -fno-gpu-flush-denormals-to-zero); the CPU executor makes itself so by clearing FTZ and
// DAZ (and choosing round to nearest) around its work, and restoring the caller's mode
// after. Rows are independent, so running them on several threads changes no bit.
#pragma once

#include <ATen/Parallel.h>

#include <cstdint>

#if defined(__x86_64__) || defined(_M_X64) || defined(__i386__)
#include <xmmintrin.h>
#define RL_CPU_X86 1
#elif defined(__aarch64__)
#define RL_CPU_ARM64 1
#else
#include <cfenv>
#endif

namespace rl {

// IEEE binary32 arithmetic for this thread while alive (docs/numerics.md section 7).
class IeeeMode {
 public:
#if defined(RL_CPU_X86)
  // MXCSR: bit 15 flush-to-zero, bit 6 denormals-are-zero, bits 13-14 rounding control.
  IeeeMode() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ & ~(0x8000u | 0x0040u | 0x6000u)); }
  ~IeeeMode() { _mm_setcsr(saved_); }

 private:
  unsigned saved_;
#elif defined(RL_CPU_ARM64)
  // FPCR: bit 24 FZ, bit 19 FZ16, bits 22-23 rounding mode.
  IeeeMode() {
    __asm__ __volatile__("mrs %0, fpcr" : "=r"(saved_));
    const uint64_t ieee = saved_ & ~((uint64_t(1) << 24) | (uint64_t(1) << 19) | (uint64_t(3) << 22));
    __asm__ __volatile__("msr fpcr, %0" : : "r"(ieee));
  }
  ~IeeeMode() { __asm__ __volatile__("msr fpcr, %0" : : "r"(saved_)); }

 private:
  uint64_t saved_;
#else
  IeeeMode() {
    std::fegetenv(&saved_);
    std::fesetenv(FE_DFL_ENV);
  }
  ~IeeeMode() { std::fesetenv(&saved_); }

 private:
  std::fenv_t saved_;
#endif
  IeeeMode(const IeeeMode&) = delete;
  IeeeMode& operator=(const IeeeMode&) = delete;
};

// f(r) for every row r < n, on torch's CPU threads, each in IEEE mode.
template <class F>
void for_rows(int64_t n, F&& f) {
  at::parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
    const IeeeMode ieee;
    for (int64_t r = lo; r < hi; ++r) f(r);
  });
}

}  // namespace rl
