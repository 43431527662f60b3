"""Framework adapters: thin layers that route a framework's calls to rl_kernel's exact tier.

- rl_kernel.integrations.transformers: patch(model) for Hugging Face Llama / Qwen2 / Qwen3 models, so that
  generate() and the training forward agree bit for bit, and GumbelSampler (imports transformers).
- the log-prob helpers of verl, TRL and OpenRLHF, with their signatures (frameworks.py; torch only).
- old_logprobs: the rollout's log-probs as the old log-probs once the two paths are proven bitwise equal, else a
  recompute with a warning naming the first divergent module (oldlogprobs.py; torch only).
"""

from __future__ import annotations

from rl_kernel.integrations.frameworks import (
    FusedLinearForPPO,
    divide_by_temperature,
    entropy_from_logits,
    log_probs_from_logits,
    logprobs_from_logits,
    selective_log_softmax,
)
from rl_kernel.integrations.oldlogprobs import old_logprobs

__all__ = [
    "FusedLinearForPPO",
    "divide_by_temperature",
    "entropy_from_logits",
    "log_probs_from_logits",
    "logprobs_from_logits",
    "old_logprobs",
    "selective_log_softmax",
]
