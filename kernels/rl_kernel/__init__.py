"""rl_kernel: deterministic log-prob kernels with one numerical contract.

The same inputs give the same bits on the CPU (the golden reference), CUDA and
HIP builds, at every batch size and on every run: the reduction order and the
arithmetic are fixed by docs/numerics.md. These are the `exact` tier's operators (rl_kernel.exact); rl_kernel.tiers
lists every tier this installation offers (`tiers.get("fast").op("linear")`).

    logp = rl_kernel.token_logprobs(logits, tokens)       # [...], fp32
    lsm  = rl_kernel.log_softmax(logits)                  # [..., V], fp32
    ent  = rl_kernel.entropy(logits)                      # [...], fp32

and the layers of a decoder in the same tier: linear, rms_norm, rope_table, rotary, silu_mul and attention (causal
GQA, one algorithm for prefill and decode), a fused LM head that never materialises the logits (rl_kernel.head:
lm_head_logprobs, for every tier; rl_kernel.head.loss: lm_head_loss, an RL step's loss with its gradients computed
in the forward), and a seeded Gumbel-max sampler that draws the same tokens on every device
(gumbel_argmax). `rl_kernel.mode(tier)` serves aten's matrix products and log_softmax by a tier in any code
(rl_kernel.aten.mode: the enable/disable pair and the audit of what a model leaves to stock).

This module only re-exports: the operators live in their family's folder, rl_kernel/exact/<family>/.
"""

from __future__ import annotations

from rl_kernel import bitwise, exact, optim, tiers
from rl_kernel._library import has_gpu_kernels
from rl_kernel.aten.mode import mode
from rl_kernel.exact import *  # noqa: F403  (the exact tier's operators are the package's: exact.__all__)
from rl_kernel.exact import reference
from rl_kernel.head import lm_head_logprobs
from rl_kernel.head.loss import lm_head_loss

__all__ = [
    *exact.__all__,
    "bitwise",
    "has_gpu_kernels",
    "lm_head_logprobs",
    "lm_head_loss",
    "mode",
    "optim",
    "reference",
    "tiers",
]
