"""The exact tier: portable arithmetic (docs/numerics.md), the same bits on the CPU, NVIDIA and AMD.

This package's attributes are the tier's operators (tier.py names them); each lives in its family's folder:
softmax/ (log-softmax, token log-probs, entropy, the row tree's node and join kernels), decoder/ (linear, RMSNorm,
rotary, SwiGLU, attention, embedding) and sampling/ (the seeded Gumbel-max sampler). A family folder holds its
C++/CUDA/HIP kernels, its autograd operators (ops.py), its numpy reference (reference.py), its checks (checks.py)
and its golden digests (golden.json); common/ holds the contract's headers and their numpy transcription.
"""

from __future__ import annotations

from rl_kernel.exact.decoder.ops import (
    attention,
    embedding,
    linear,
    positions_from_mask,
    rms_norm,
    rope_inv_freq,
    rope_table,
    rotary,
    silu_mul,
)
from rl_kernel.exact.sampling.ops import gumbel_argmax
from rl_kernel.exact.softmax.ops import (
    BitwiseLogSoftmax,
    entropy,
    log_softmax,
    log_softmax_backward,
    row_stats,
    token_logprobs,
)

__all__ = [
    "BitwiseLogSoftmax",
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
]
# The tier's operators (tier.py): every function above but the autograd class.
OPERATORS = tuple(n for n in __all__ if n != "BitwiseLogSoftmax")
