"""The exact tier's descriptor: portable arithmetic (docs/numerics.md), the same bits on the CPU, NVIDIA and AMD."""

from __future__ import annotations

from rl_kernel import build_flags
from rl_kernel.exact import OPERATORS
from rl_kernel.tiers import Tier

TIER = Tier(
    name="exact",
    scope="all-devices",
    cpu_reference=True,
    platforms=("cpu", "cuda", "rocm"),
    package="rl_kernel.exact",
    operators=OPERATORS,
    head="rl_kernel.exact.head:gemms",
    rows="rl_kernel._library:ops",  # the compiled row kernels (exact/softmax), which the fused head walks with
    compiled=True,
    scan="compiled",
    build=(*build_flags.CXX_FLAGS, *build_flags.NVCC_FLAGS, *build_flags.HIP_FLAGS),
    description="portable IEEE arithmetic in one fixed order: CPU == NVIDIA == AMD bit for bit",
)
