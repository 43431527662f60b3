"""The fast tier's operators, as the Hugging Face patch and the harness take them: linear and attention on the
matrix cores (rl_kernel.fast), RMSNorm with the exact forward and a parallel weight gradient (rl_kernel.fast.norm),
everything else from the exact tier (rotary with fp32 tables, SwiGLU, the embedding with its fixed-order
gradient, the log-prob head and the sampler), whose bits are the same on every device anyway."""

from __future__ import annotations

from rl_kernel.fast import attention, linear
from rl_kernel.fast.norm import rms_norm
from rl_kernel.ops.decoder import (
    embedding,
    positions_from_mask,
    rope_inv_freq,
    rope_table,
    rotary,
    silu_mul,
)
from rl_kernel.ops.sampling import gumbel_argmax
from rl_kernel.ops.softmax import entropy, log_softmax, row_stats, token_logprobs

__all__ = [
    "attention",
    "embedding",
    "entropy",
    "gumbel_argmax",
    "linear",
    "log_softmax",
    "positions_from_mask",
    "rms_norm",
    "rope_inv_freq",
    "rope_table",
    "rotary",
    "row_stats",
    "silu_mul",
    "token_logprobs",
]
