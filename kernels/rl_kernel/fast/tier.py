"""The fast tier: matrix cores (wgmma, MFMA, WMMA) in an order fixed per target (configs.toml): the same bits
within one architecture (every run, batch size and order, rollout and training), not across architectures or
vendors, so its golden digests are recorded per target. No CPU kernels; the operators it lacks are the exact tier's."""

from __future__ import annotations

from rl_kernel.fast import OPERATORS
from rl_kernel.tiers import Tier

TIER = Tier(
    name="fast",
    scope="per-target",
    cpu_reference=False,
    platforms=("cuda", "rocm"),
    package="rl_kernel.fast",
    operators=OPERATORS,
    fallback="exact",
    head="rl_kernel.fast.head:gemms",
    controls={"split-k": "rl_kernel.fast.controls"},
    dtypes=("bf16", "fp16"),
    scan="rl_kernel.fast.compile_check:tier_scan",
    build=(
        "triton",
        "configs.toml: BLOCK_K, matrix instruction, num_warps/stages per target",
        "enable_fp_fusion=false",
    ),
    details="rl_kernel.fast.configs:fingerprint",
    description="matrix-core linear and attention in a fixed order per target; the rest of the exact tier",
)
