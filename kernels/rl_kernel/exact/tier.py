"""The exact tier: portable arithmetic (docs/numerics.md), the same bits on the CPU, NVIDIA and AMD."""

from __future__ import annotations

from pathlib import Path

from rl_kernel import build_flags
from rl_kernel.tiers import Tier

TIER = Tier(
    name="exact",
    scope="all-devices",
    cpu_reference=True,
    platforms=("cpu", "cuda", "rocm"),
    module="rl_kernel",
    operators=(
        "attention",
        "embedding",
        "entropy",
        "gumbel_argmax",
        "linear",
        "log_softmax",
        "log_softmax_backward",
        "positions_from_mask",
        "rms_norm",
        "rope_inv_freq",
        "rope_table",
        "rotary",
        "row_stats",
        "silu_mul",
        "token_logprobs",
    ),
    layers="rl_kernel.ops.decoder",
    checks="rl_kernel.checks",
    golden_dir=Path(__file__).resolve().parents[1] / "golden" / "exact",
    scan="csrc",
    build=(*build_flags.CXX_FLAGS, *build_flags.NVCC_FLAGS, *build_flags.HIP_FLAGS),
    description="portable IEEE arithmetic in one fixed order: CPU == NVIDIA == AMD bit for bit",
)
