"""A deliberately batch-variant engine: hf.py's patched rollout, and a trainer that scores each sequence alone
(batch 1, unpadded) with the stock model and torch's log_softmax. Its log-probs differ from the rollout's: a cell
that requires them equal must fail the gate (exit 1)."""

from __future__ import annotations

import torch

from rl_engines import hf
from rl_engines.hf import rollout

__all__ = ["rollout", "train"]


def train(tokens, shape, dtype: str, seed: int, device: str, tier: str, **model_shape) -> dict:
    batch, _, vocab = shape
    model = hf.build(vocab, dtype, seed, device, tier, patched=False, **model_shape)
    ids, mask = hf.prompts(batch, vocab, seed)
    rows = []
    for b in range(batch):  # each sequence alone: another batch composition than the rollout's
        keep = mask[b].bool()
        one = hf.completion_logits(model, ids[b, keep][None], mask[b, keep][None], tokens[b : b + 1], device)
        rows.append(hf.token_logprobs(one, tokens[b : b + 1].to(device), tier, patched=False))
    return {"logprobs": torch.cat(rows).detach().cpu()}
