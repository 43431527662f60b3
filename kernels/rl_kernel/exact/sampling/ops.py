"""The sampling family: a seeded Gumbel-max draw that picks the same token on every device (docs/numerics.md
section 12).

    tokens = rl_kernel.gumbel_argmax(scores, seed=1234, step=t, keys=sequence_ids)

Element i of a row gets the noise -log(-log(u)), u a pure function of (seed, the row's key, step, i)
through a counter-based hash (no generator state), with the contract's log; the draw is the lowest
index of the largest score + noise. So a token drawn from softmax(scores) is the same on the CPU (the
golden reference) and on every GPU build, whatever the batch or its order, as long as a sequence keeps
its key. The kernel is in csrc/sampling/, its numpy transcription in rl_kernel/reference/sampling.py.
"""

from __future__ import annotations

import torch

from rl_kernel._library import ops, register_fake
from rl_kernel._validate import check_logits, check_same_device

FAMILY = "sampling"


@register_fake("rl_kernel::gumbel_argmax")
def _gumbel_argmax_fake(scores, keys, steps, seed):
    return keys.new_empty(scores.shape[:-1])


def gumbel_argmax(
    scores: torch.Tensor, seed: int, step: int | torch.Tensor, keys: torch.Tensor | None = None
) -> torch.Tensor:
    """A draw from softmax(scores) per row of scores [..., V], int64 [...]: argmax_i(scores_i + g_i) with the
    lowest index among equals, g_i Gumbel noise from (seed, keys[row], step[row], i). keys (int64 [...], a
    stable id per sequence) default to the row numbers; step is one int for every row or an int64 tensor
    [...] (a sequence's own length, say); keys and step on the scores' device or the CPU. A NaN score counts
    as -inf; temperature, top-k and other processing are the caller's (apply them to scores first)."""
    check_logits(scores, "scores")
    lead = scores.shape[:-1]
    if keys is None:
        keys = torch.arange(scores[..., 0].numel(), device=scores.device).view(lead)
    if not isinstance(step, torch.Tensor):
        _check_int64("step", step)
        step = torch.full(lead, step, dtype=torch.int64, device=scores.device)
    _check_int64("seed", seed)
    for name, t in (("keys", keys), ("step", step)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int64:
            raise TypeError(f"rl_kernel: {name} must be an int64 tensor, got {getattr(t, 'dtype', type(t))}")
    # keys and step made on the host are copied to the scores' device (as before); any other device is an error.
    check_same_device({"scores": scores, "keys": keys, "step": step}, host_ok=("keys", "step"))
    return ops.gumbel_argmax(scores, keys.to(scores.device), step.to(scores.device), seed)


def _check_int64(name: str, v: object) -> None:
    if not isinstance(v, int) or not -(2**63) <= v < 2**63:
        raise ValueError(f"rl_kernel: {name} must be an int64 Python int, got {v!r}")
