// What every family's GPU kernels share: thread, block and lane indices, barriers and shuffles of a
// logical warp of 32 lanes (a wave32, or half of a wave64 on AMD). On AMD the compiler builtins are used
// directly, so the device code calls no device-library function (kernels_check demands none).
#pragma once

#include <stdint.h>

#if defined(__CUDACC__) || defined(__HIPCC__)

namespace rl {

constexpr int RL_WARP = 32;  // lanes of one shuffle group (a logical warp; two per wave64 on AMD)

#if defined(__HIP_DEVICE_COMPILE__)
#define RL_TID (int(__builtin_amdgcn_workitem_id_x()))
#define RL_ROW (int64_t(__builtin_amdgcn_workgroup_id_x()))
#define RL_NODE (int64_t(__builtin_amdgcn_workgroup_id_y()))
#define RL_BLOCK_Y (int64_t(__builtin_amdgcn_workgroup_id_y()))
#define RL_BLOCK_Z (int64_t(__builtin_amdgcn_workgroup_id_z()))
// A logical warp is half a wave64 or a wave32, whose lanes run in lockstep: a wavefront-scope fence.
#define RL_WARP_SYNC() __builtin_amdgcn_fence(__ATOMIC_SEQ_CST, "wavefront")
#define RL_SYNC()                                             \
  do {                                                        \
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "workgroup");    \
    __builtin_amdgcn_s_barrier();                             \
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "workgroup");    \
  } while (0)
#else
#define RL_TID (int(threadIdx.x))
#define RL_ROW (int64_t(blockIdx.x))
#define RL_NODE (int64_t(blockIdx.y))
#define RL_BLOCK_Y (int64_t(blockIdx.y))
#define RL_BLOCK_Z (int64_t(blockIdx.z))
#define RL_WARP_SYNC() __syncwarp()
#define RL_SYNC() __syncthreads()
#endif

__device__ __forceinline__ int lane_id() { return RL_TID & (RL_WARP - 1); }
__device__ __forceinline__ int warp_id() { return RL_TID / RL_WARP; }

// The value of lane (lane ^ mask) of this logical warp.
__device__ __forceinline__ float shfl_xor(float v, int mask) {
#if defined(__HIP_DEVICE_COMPILE__)
  const int lane = int(__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)));
  return __int_as_float(__builtin_amdgcn_ds_bpermute((lane ^ mask) << 2, __float_as_int(v)));
#else
  return __shfl_xor_sync(0xffffffffu, v, mask);
#endif
}
// The value of lane src (0..31) of this logical warp.
__device__ __forceinline__ float shfl_from(float v, int src) {
#if defined(__HIP_DEVICE_COMPILE__)
  const int lane = int(__builtin_amdgcn_mbcnt_hi(~0u, __builtin_amdgcn_mbcnt_lo(~0u, 0u)));
  return __int_as_float(__builtin_amdgcn_ds_bpermute(((lane & ~(RL_WARP - 1)) | src) << 2, __float_as_int(v)));
#else
  return __shfl_sync(0xffffffffu, v, src);
#endif
}

}  // namespace rl

#endif
