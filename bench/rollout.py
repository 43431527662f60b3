"""The rollout side of an RL step for the benchmarks: left-padded prompts, generate() keeping each step's logits,
the training forward's views of the same sequences, and a stock model's drift. Built on rl_kernel.models' PAD and
transformers' generate(); the harness's own model workload is not imported (bench stays outside the harness).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.nn.utils.rnn import pad_sequence

from rl_kernel.models import PAD


def prompts(batch: int, lo: int, hi: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """batch prompts of lo..hi random tokens (ids 1 .. vocab - 1), left padded with PAD: (ids, mask) [B, P]."""
    g = torch.Generator().manual_seed(seed)
    lengths = [int(x) for x in torch.randint(lo, hi + 1, (batch,), generator=g)]
    return padded([torch.randint(1, vocab, (n,), generator=g) for n in lengths], right=False)


def generate(
    model, ids: torch.Tensor, mask: torch.Tensor, new: int, keep_logits: bool = True, host: bool = True, **mode: Any
):
    """Greedy generate() of exactly `new` tokens: (sequences [B, P + new], logits [B, new, V] fp32), both on the
    CPU (or the model's device with host=False; logits None unless keep_logits); `mode`: generate()'s cache and
    compile arguments (bench.rollout_modes)."""
    device = next(model.parameters()).device
    with torch.no_grad():
        out = model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=new, min_new_tokens=new,
            do_sample=False, pad_token_id=PAD, output_logits=keep_logits, return_dict_in_generate=True, **mode,
        )  # fmt: skip
    logits = torch.stack(out.logits, 1).float() if keep_logits else None
    if not host:
        return out.sequences, logits
    return out.sequences.cpu(), None if logits is None else logits.cpu()


def unpadded(sequences: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """Each generated sequence without its left padding (mask: the prompts' [B, P])."""
    width = mask.shape[1]
    return [sequences[b, width - int(mask[b].sum()) :] for b in range(sequences.shape[0])]


def padded(seqs: Sequence[torch.Tensor], right: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequences as one batch padded with PAD to the longest (on the right or the left), and its mask."""
    side = "right" if right else "left"
    ids = pad_sequence(list(seqs), batch_first=True, padding_value=PAD, padding_side=side)
    mask = pad_sequence([torch.ones_like(s) for s in seqs], batch_first=True, padding_value=0, padding_side=side)
    return ids, mask


def completion_logits(
    model, seqs: Sequence[torch.Tensor], new: int, right: bool, grad: bool = True, host: bool = True
) -> torch.Tensor:
    """One training forward (autograd on unless grad=False) over the sequences padded one way: the logits
    [B, new, V] fp32 (on the CPU, or the model's device with host=False) at the positions that score each
    sequence's `new` completion tokens."""
    device = next(model.parameters()).device
    ids, mask = padded(seqs, right)
    with torch.set_grad_enabled(grad):
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits
    ends = [len(s) if right else ids.shape[1] for s in seqs]  # one past each sequence's last token
    out = torch.stack([logits[i, end - new - 1 : end - 1] for i, end in enumerate(ends)]).detach().float()
    return out.cpu() if host else out


def forward_views(model, seqs: Sequence[torch.Tensor], new: int) -> dict[str, torch.Tensor]:
    """The completion logits of teacher-forced forwards (no autograd) that see the batch three ways."""
    return {
        "batch, left padded": completion_logits(model, seqs, new, right=False, grad=False),
        "batch, right padded": completion_logits(model, seqs, new, right=True, grad=False),
        "each sequence alone": torch.cat([completion_logits(model, [s], new, True, grad=False) for s in seqs]),
    }


def drift(rollout_logits: torch.Tensor, forward_logits: torch.Tensor, tokens: torch.Tensor, clip: float) -> dict:
    """A stock stack's rollout/training mismatch over the sampled tokens' log-probs (float64): mean and max
    |dlogp| and the share of importance ratios outside [1 - clip, 1 + clip]."""
    old = torch.log_softmax(rollout_logits.double(), -1).gather(-1, tokens[..., None])[..., 0]
    new = torch.log_softmax(forward_logits.double(), -1).gather(-1, tokens[..., None])[..., 0]
    d = (new - old).flatten()
    ratio = torch.exp(d)
    return {
        "mean_abs_dlogp": float(d.abs().mean()),
        "max_abs_dlogp": float(d.abs().max()),
        "clipped_share": float(((ratio < 1 - clip) | (ratio > 1 + clip)).double().mean()),
    }
