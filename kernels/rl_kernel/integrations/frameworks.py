"""Drop-ins for the log-prob helpers of RL frameworks, in the exact tier (the same bits on every device and
for every batch). Each has its framework's signature; replace the framework's import with this one:

    verl      from verl.utils.torch_functional import logprobs_from_logits, entropy_from_logits
          ->  from rl_kernel.integrations import logprobs_from_logits, entropy_from_logits
    TRL       from trl.trainer.utils import selective_log_softmax
          ->  from rl_kernel.integrations import selective_log_softmax
    OpenRLHF  from openrlhf.models.utils import log_probs_from_logits
          ->  from rl_kernel.integrations import log_probs_from_logits

All return float32 log-probs (entropies) of the shape of labels (of logits without its last dimension),
differentiable through rl_kernel's deterministic backward.
"""

from __future__ import annotations

import torch

from rl_kernel.ops.softmax import entropy, token_logprobs


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True) -> torch.Tensor:
    """verl's logprobs_from_logits: log softmax(logits)[labels]. inplace_backward is accepted for the
    signature; the backward is rl_kernel's either way."""
    del inplace_backward
    return token_logprobs(logits, labels)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """verl's entropy_from_logits: the entropy of softmax(logits) per row."""
    return entropy(logits)


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """TRL's selective_log_softmax: log softmax(logits)[index]."""
    return token_logprobs(logits, index)


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """OpenRLHF's log_probs_from_logits: log softmax(logits / temperature)[labels], the division a true one
    (divide_by_temperature)."""
    if temperature != 1.0:
        logits = divide_by_temperature(logits, temperature)
    return token_logprobs(logits, labels)


def divide_by_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """float32 logits / temperature, one correctly rounded division per element on every device. (torch's
    CUDA divide by a Python number multiplies by the number's float reciprocal, its CPU divide divides: the
    frameworks' `logits / T` differs in the last bit between them. Dividing by a float32 tensor on the
    logits' device is a true division on both.)"""
    if not temperature > 0:
        raise ValueError(f"rl_kernel: temperature must be > 0, got {temperature}")
    return logits.float() / torch.full((), temperature, dtype=torch.float32, device=logits.device)
