"""The two paths an RL step takes over the same tokens, as pure torch functions of a log-prob function.

rollout: log-probs taken while generating, one decode step at a time; each step's batch holds the
sequences still running, in the scheduler's order for that step, mixed with other requests' rows.
training: teacher-forced log-probs of the whole batch in one call, with autograd on (a PPO-style
surrogate's backward). The bitwise suite requires the two to agree in every bit.

The logits workloads start from an episode of logits (generated on the CPU from a seed, so every device sees the
same bits), each built by its descriptor's `episode` (plain: make_episode, below; edges: its folder's episode.py);
the model workload (rlparity.cell.workloads.model) starts from token ids and runs a Hugging Face model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rl_kernel import inputs

IGNORE = -100
HEAD_ROWS = 8  # batch_views' small batch
LogprobFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (logits [N, V], tokens [N]) -> fp32 [N]


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
    if dtype not in inputs.DTYPE_NAMES:
        raise ValueError(f"unknown dtype {dtype!r} (known: {', '.join(inputs.DTYPE_NAMES)})")
    logits = inputs.logits(batch * seq, vocab, inputs.DTYPE_NAMES[dtype], seed).view(batch, seq, vocab)
    tokens = inputs.tokens(batch * seq, vocab, seed).view(batch, seq).clone()
    g = torch.Generator().manual_seed(seed + 7)
    # The first sequence runs to the end; the others stop somewhere in the second half (EOS).
    lengths = [seq] + [int(x) for x in torch.randint(max(1, seq // 2), seq + 1, (batch - 1,), generator=g)]
    for b, n in enumerate(lengths):
        tokens[b, n:] = IGNORE
    advantages = torch.randn(batch, seq, generator=g)
    return Episode(logits, tokens, tuple(lengths), advantages)


def to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """t on device with its layout kept: a view into a wider buffer stays one (Tensor.to would make it
    contiguous on another device, and the kernel would never see a misaligned row)."""
    if t.device == torch.device(device) or t.is_contiguous():
        return t.to(device)
    size = t.untyped_storage().nbytes() // t.element_size()
    whole = torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (size,), (1,)).to(device)
    return whole.as_strided(t.shape, t.stride(), t.storage_offset())


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
    leaf = to_device(ep.logits, device).requires_grad_()
    out = lp(leaf.view(batch * seq, vocab), ep.tokens.view(-1).to(device)).view(batch, seq)
    loss = (out * ep.advantages.to(device)).sum()
    loss.backward()
    return out.detach().cpu(), leaf.grad.detach().cpu()


def batch_views(ep: Episode) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The same rows presented five ways: (logits, tokens, index of each presented row in the flat batch).
    `head` (the first 8 rows as their own batch) checks more than one row at a small row count, where a
    kernel that picks its reduction by the batch size (split rows for small batches) shows."""
    batch, seq, vocab = ep.shape
    x = ep.logits.reshape(batch * seq, vocab)
    tok = ep.tokens.reshape(-1)
    n = x.shape[0]
    everything = torch.arange(n)
    reversed_ = everything.flip(0)
    wide = torch.cat([x, x], dim=1)[:, :vocab]  # a strided (non-contiguous) view of the same values
    alone = everything[:1]
    head = everything[: min(n, HEAD_ROWS)]
    return {
        "alone": (x[:1], tok[:1], alone),
        "head": (x[: len(head)], tok[: len(head)], head),
        "batch": (x, tok, everything),
        "reversed": (x[reversed_], tok[reversed_], reversed_),
        "strided": (wide, tok, everything),
    }
