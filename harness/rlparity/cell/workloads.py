"""The two paths an RL step takes over the same tokens, as pure torch functions of a log-prob function.

rollout: log-probs taken while generating, one decode step at a time; each step's batch holds the
sequences still running, in the scheduler's order for that step, mixed with other requests' rows.
training: teacher-forced log-probs of the whole batch in one call, with autograd on (a PPO-style
surrogate's backward). The bitwise suite requires the two to agree in every bit.

The workload starts from logits (generated on the CPU from a seed, so every device sees the same bits):
the transformer forward is not part of rl_kernel yet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rl_kernel import inputs

IGNORE = -100
LogprobFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (logits [N, V], tokens [N]) -> fp32 [N]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Episode:
    """B sampled sequences of up to T tokens: the logits each step saw, the tokens, the lengths."""

    logits: torch.Tensor  # [B, T, V], the model's dtype, on the CPU
    tokens: torch.Tensor  # [B, T] int64; IGNORE past a sequence's end
    lengths: tuple[int, ...]
    advantages: torch.Tensor  # [B, T] fp32, the surrogate's weights

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.logits.shape)  # type: ignore[return-value]


def make_episode(batch: int, seq: int, vocab: int, dtype: str, seed: int = 0) -> Episode:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(DTYPES)})")
    logits = inputs.logits(batch * seq, vocab, DTYPES[dtype], seed).view(batch, seq, vocab)
    tokens = inputs.tokens(batch * seq, vocab, seed).view(batch, seq).clone()
    g = torch.Generator().manual_seed(seed + 7)
    # The first sequence runs to the end; the others stop somewhere in the second half (EOS).
    lengths = [seq] + [int(x) for x in torch.randint(max(1, seq // 2), seq + 1, (batch - 1,), generator=g)]
    for b, n in enumerate(lengths):
        tokens[b, n:] = IGNORE
    advantages = torch.randn(batch, seq, generator=g)
    return Episode(logits, tokens, tuple(lengths), advantages)


def _other_requests(step: int, vocab: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of unrelated requests that share a decode step (0, 1 or 2 of them, varying by step)."""
    n = step % 3
    return inputs.logits(n, vocab, dtype, seed + 1000 + step), inputs.tokens(n, vocab, seed + 1000 + step)


def rollout_logprobs(ep: Episode, lp: LogprobFn, device: torch.device | str = "cpu", seed: int = 0) -> torch.Tensor:
    """[B, T] fp32 log-probs as a decode loop takes them (0 past each sequence's end)."""
    batch, seq, vocab = ep.shape
    out = torch.zeros(batch, seq, dtype=torch.float32)
    for t in range(seq):
        running = [b for b in range(batch) if t < ep.lengths[b]]
        order = running[t % len(running) :] + running[: t % len(running)]  # the scheduler rotates slots
        extra_x, extra_tok = _other_requests(t, vocab, ep.logits.dtype, seed)
        x = torch.cat([ep.logits[order, t], extra_x]).to(device)
        tok = torch.cat([ep.tokens[order, t], extra_tok]).to(device)
        out[order, t] = lp(x, tok)[: len(order)].cpu()
    return out


def training_logprobs(
    ep: Episode, lp: LogprobFn, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher-forced log-probs of the whole batch [B, T] and the surrogate's gradient w.r.t. the logits."""
    batch, seq, vocab = ep.shape
    leaf = ep.logits.to(device).requires_grad_()
    out = lp(leaf.view(batch * seq, vocab), ep.tokens.view(-1).to(device)).view(batch, seq)
    loss = (out * ep.advantages.to(device)).sum()
    loss.backward()
    return out.detach().cpu(), leaf.grad.detach().cpu()


def batch_views(ep: Episode) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The same rows presented four ways: (logits, tokens, index of each presented row in the flat batch)."""
    batch, seq, vocab = ep.shape
    x = ep.logits.reshape(batch * seq, vocab)
    tok = ep.tokens.reshape(-1)
    n = x.shape[0]
    everything = torch.arange(n)
    reversed_ = everything.flip(0)
    wide = torch.cat([x, x], dim=1)[:, :vocab]  # a strided (non-contiguous) view of the same values
    alone = everything[:1]
    return {
        "alone": (x[:1], tok[:1], alone),
        "batch": (x, tok, everything),
        "reversed": (x[reversed_], tok[reversed_], reversed_),
        "strided": (wide, tok, everything),
    }
