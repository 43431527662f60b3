"""The model workload's trainer: over a Rollout (rollout.py), teacher-forced forwards over micro-batches of
another size (right padded), token log-probs, a GRPO clipped surrogate, backward and an ExactAdamW step, as
many steps as asked (StepResult); and the digests the exact tier commits of a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import rl_kernel
from rl_kernel.bitwise import digest
from rl_kernel.integrations import transformers as hf
from rl_kernel.optim import ExactAdamW
from rlparity.cell.workloads.model.rollout import CLIP, Prompts, Rollout, padded, unpadded

GOLDEN_OUTPUTS = ("sequences", "rollout_logits", "logprobs", "weights")  # per family (golden_outputs)
LEARNING_RATE = 1e-3


# ---- the training step ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class StepResult:
    ratios: torch.Tensor  # [B, N] fp32: exp(new - old) of the first step
    logprobs: torch.Tensor  # [B, N] fp32: the first step's training log-probs
    first_weights: dict[str, torch.Tensor]  # after the first step, on the CPU
    weights: dict[str, torch.Tensor]  # after the last step, on the CPU


def advantages(batch: int, seed: int) -> torch.Tensor:
    """GRPO's group-normalised rewards over one group of random rewards (float32 on the CPU, then moved). A
    group of one has no spread: its advantage is the reward less a fixed baseline of 0.5 (REINFORCE), never
    the 0/0 = NaN of normalising by its standard deviation."""
    r = torch.rand(batch, generator=torch.Generator().manual_seed(seed + 5))
    if batch == 1:
        return r - 0.5
    return (r - r.mean()) / (r.std() + 1e-6)


def completion_mask(batch: int, new: int, seed: int) -> torch.Tensor:
    """Which completion tokens count (a sequence's EOS somewhere in its second half)."""
    g = torch.Generator().manual_seed(seed + 3)
    ends = torch.randint(max(1, new // 2), new + 1, (batch,), generator=g)
    return (torch.arange(new)[None] < ends[:, None]).float()


def train(model, r: Rollout, p: Prompts, device, seed: int, steps: int = 2, micro: int = 3) -> StepResult:
    """steps GRPO steps over the rollout: micro-batches of `micro` sequences (right padded), the clipped
    surrogate's gradients accumulated, then rl_kernel.optim.ExactAdamW. old log-probs: the rollout's logits,
    scored by rl_kernel.token_logprobs.

    The first step is the same on every device: its ratios are exp(0) = 1 exactly. From the second on, the
    ratios are torch.exp of non-zero differences, whose last bits are each vendor's: those steps repeat run to
    run on one device, but are not claimed equal across devices."""
    batch, new = r.completions.shape
    old = rl_kernel.token_logprobs(r.logits, r.completions)
    adv, keep = advantages(batch, seed), completion_mask(batch, new, seed)
    opt = ExactAdamW(model.parameters(), lr=LEARNING_RATE)
    seqs = [unpadded(r, p, b) for b in range(batch)]
    model.train()
    first_ratios = first_lp = first_weights = None
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        ratios, lps = torch.empty(batch, new), torch.empty(batch, new)
        for lo in range(0, batch, micro):
            idx = list(range(lo, min(batch, lo + micro)))
            lp = micro_logprobs(model, [seqs[b] for b in idx], r.completions[idx], device)
            a, k = adv[idx].to(device)[:, None], keep[idx].to(device)
            loss, ratio = grpo_loss(lp, old[idx].to(device), a, k, keep.sum().to(device))
            loss.backward()
            ratios[idx], lps[idx] = ratio.detach().cpu(), lp.detach().cpu()
        opt.step()
        if step == 0:
            first_ratios, first_lp, first_weights = ratios, lps, _weights(model)
    model.eval()
    return StepResult(first_ratios, first_lp, first_weights, _weights(model))


def grpo_loss(
    lp: torch.Tensor, old: torch.Tensor, adv: torch.Tensor, keep: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO's clipped surrogate over the kept tokens, and the ratios exp(lp - old). `tokens` is the whole
    batch's kept-token count, a tensor on lp's device (a true division: a Python divisor would be a multiply by
    its reciprocal on a GPU), so micro-batches' losses add up to the batch mean."""
    ratio = torch.exp(lp - old)
    surrogate = torch.minimum(ratio * adv, torch.clamp(ratio, 1 - CLIP, 1 + CLIP) * adv)
    return -(surrogate * keep).sum() / tokens, ratio


def _weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters()}


def micro_logprobs(model, seqs: list[torch.Tensor], completions: torch.Tensor, device) -> torch.Tensor:
    """Token log-probs [n, N] of the completions under one right-padded forward with autograd on. A patched model
    scores them from the decoder's hidden states through its tier's fused head (rl_kernel.lm_head_logprobs: the
    logits are never made); a stock one through its logits."""
    new = completions.shape[1]
    ids, mask = padded(seqs, right=True)
    ids, mask = ids.to(device), mask.to(device)
    tier = hf.descriptor_of(model)
    if tier is None:
        logits = model(input_ids=ids, attention_mask=mask).logits
        rows = torch.stack([logits[i, len(s) - new - 1 : len(s) - 1] for i, s in enumerate(seqs)])
        return rl_kernel.token_logprobs(rows.float(), completions.to(device))
    hidden = model.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    rows = torch.stack([hidden[i, len(s) - new - 1 : len(s) - 1] for i, s in enumerate(seqs)])
    lm_head = model.get_output_embeddings()
    return rl_kernel.lm_head_logprobs(rows, lm_head.weight, completions.to(device), tier=tier, bias=lm_head.bias)


def golden_outputs(r: Rollout, step: StepResult) -> dict[str, str]:
    """The digests the exact tier commits for one family and shape: the sampled sequences, the rollout's
    logits, the first step's log-probs and the weights after it (every tensor, in name order): what every
    device must reproduce (train's docstring says why not the later steps)."""
    weights = torch.cat([step.first_weights[n].float().reshape(-1) for n in sorted(step.first_weights)])
    digests = (digest(r.sequences), digest(r.logits), digest(step.logprobs), digest(weights))
    return dict(zip(GOLDEN_OUTPUTS, digests, strict=True))
