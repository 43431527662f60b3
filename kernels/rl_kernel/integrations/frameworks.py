"""Drop-ins for the log-prob helpers of RL frameworks, in the exact tier (the same bits on every device and
for every batch). Each has its framework's signature; replace the framework's import with this one:

    verl      from verl.utils.torch_functional import logprobs_from_logits, entropy_from_logits
          ->  from rl_kernel.integrations import logprobs_from_logits, entropy_from_logits
    TRL       from trl.trainer.utils import selective_log_softmax
          ->  from rl_kernel.integrations import selective_log_softmax
    OpenRLHF  from openrlhf.models.utils import log_probs_from_logits
          ->  from rl_kernel.integrations import log_probs_from_logits
    verl's fused kernels (use_fused_kernels: log-probs and entropy from the hidden states)
              from verl.utils.experimental.torch_functional import FusedLinearForPPO
          ->  from rl_kernel.integrations import FusedLinearForPPO

All return float32 log-probs (entropies) of the shape of labels (of logits without its last dimension),
differentiable through rl_kernel's deterministic backward.
"""

from __future__ import annotations

import torch

from rl_kernel.exact.softmax.ops import divide_by_temperature, entropy, token_logprobs


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


class FusedLinearForPPO(torch.nn.Module):
    """verl's FusedLinearForPPO (use_fused_kernels): `forward(hidden_states, vocab_weights, input_ids,
    temperature=1.0) -> (log_probs, entropy)` without materialising the logits, through rl_kernel's fused head
    (rl_kernel.lm_head_logprobs) in `tier`. Bit for bit token_logprobs / entropy of the tier's logits divided by the
    temperature as generate() divides (divide_by_temperature; verl divides in the logits' dtype, so at a
    temperature other than 1 the bits are rl_kernel's, not verl's). chunk_size is verl's token chunk: accepted for
    its signature; rl_kernel's chunks are over the vocabulary (vocab_chunk), fixed, never chosen from the batch."""

    def __init__(self, chunk_size: int = 512, *, tier: str = "exact", vocab_chunk: int | None = None) -> None:
        super().__init__()
        from rl_kernel.head import VOCAB_CHUNK

        self.chunk_size, self.tier, self.vocab_chunk = chunk_size, tier, vocab_chunk or VOCAB_CHUNK

    def forward(
        self,
        hidden_states: torch.Tensor,
        vocab_weights: torch.Tensor,
        input_ids: torch.Tensor,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        from rl_kernel.head import lm_head_logprobs

        return lm_head_logprobs(
            hidden_states, vocab_weights, input_ids, tier=self.tier, entropy=True,
            temperature=None if temperature == 1.0 else temperature, vocab_chunk=self.vocab_chunk,
        )  # fmt: skip
