"""rl_kernel: deterministic log-prob kernels with one numerical contract.

The same inputs give the same bits on the CPU (the golden reference), CUDA and
HIP builds, at every batch size and on every run: the reduction order and the
arithmetic are fixed by docs/numerics.md. These are the `exact` tier's operators; rl_kernel.tiers
lists every tier this installation offers (`tiers.get("fast")`).

    logp = rl_kernel.token_logprobs(logits, tokens)       # [...], fp32
    lsm  = rl_kernel.log_softmax(logits)                  # [..., V], fp32
    ent  = rl_kernel.entropy(logits)                      # [...], fp32

and the layers of a decoder in the same tier (rl_kernel.ops.decoder): linear, rms_norm, rope_table,
rotary, silu_mul and attention (causal GQA, one algorithm for prefill and decode), a fused LM head that
never materialises the logits (rl_kernel.head: lm_head_logprobs), and a seeded
Gumbel-max sampler that draws the same tokens on every device (rl_kernel.ops.sampling: gumbel_argmax).

This module only re-exports: the operators live in rl_kernel.ops.<family>.
"""

from __future__ import annotations

from rl_kernel import bitwise, ops, optim, reference, tiers
from rl_kernel._library import has_gpu_kernels
from rl_kernel.head import lm_head_logprobs
from rl_kernel.ops.decoder import (
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
from rl_kernel.ops.sampling import gumbel_argmax
from rl_kernel.ops.softmax import (
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
    "bitwise",
    "embedding",
    "entropy",
    "gumbel_argmax",
    "has_gpu_kernels",
    "linear",
    "lm_head_logprobs",
    "log_softmax",
    "log_softmax_backward",
    "ops",
    "optim",
    "positions_from_mask",
    "reference",
    "rms_norm",
    "rope_inv_freq",
    "rope_table",
    "rotary",
    "row_stats",
    "silu_mul",
    "tiers",
    "token_logprobs",
]
