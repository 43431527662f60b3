"""A Hugging Face rollout engine and trainer of a tiny random-weight Qwen3 (built from a config: no download),
in the interface of rlparity's engines workload:

    rollout(shape=(B, T, V), dtype, seed, device, tier, **engine) -> {tokens, logprobs, logits_digest}
    train(tokens, shape, dtype, seed, device, tier, **engine) -> {logprobs, logits_digest}

The model and the prompts are rl_kernel.models' (tiny_model, sequences). The rollout is generate() (greedy, T
new tokens after seeded prompts of mixed lengths, left padded) keeping the logits each token was chosen from; the
trainer rebuilds the same model and prompts from the seed and runs one teacher-forced forward (autograd on, as a
training step runs it) over prompt + completion. Both take the tokens' log-probs with the same function. engine
parameters: patched (default true: rl_kernel.integrations.transformers.patch(model, tier=tier); false: stock),
layers, hidden, heads (the model's shape).
"""

from __future__ import annotations

import torch

from rl_kernel import tiers
from rl_kernel.bitwise import digest
from rl_kernel.models import PAD, sequences, tiny_model

PROMPT = 8  # prompts are 2 .. PROMPT tokens, left padded to PROMPT


def build(vocab: int, dtype: str, seed: int, device: str, tier: str, patched: bool = True, layers: int = 2,
          hidden: int = 64, heads: int = 4) -> torch.nn.Module:  # fmt: skip
    """rl_kernel.models' tiny Qwen3 of the shape, weights drawn on the CPU from seed (the same bits on every
    device), patched in the tier unless `patched` is false."""
    return tiny_model("qwen3", vocab, layers, hidden, heads, dtype=dtype, seed=seed, device=device,
                      tier=tier if patched else "stock")  # fmt: skip


def prompts(batch: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded prompts of 2 .. PROMPT tokens, left padded with PAD (rl_kernel.models.sequences, no completion):
    (ids, mask), [B, PROMPT]."""
    return sequences(batch, PROMPT, 0, vocab, seed)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, tier: str, patched: bool) -> torch.Tensor:
    """log p(tokens) in fp32: the tier's operator when patched, torch's log_softmax + gather when stock."""
    logits = logits.float()
    if patched:
        return tiers.get(tier).op("token_logprobs")(logits, tokens)
    return torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]


def rollout(shape, dtype: str, seed: int, device: str, tier: str, patched: bool = True, **model_shape) -> dict:
    batch, new, vocab = shape
    model = build(vocab, dtype, seed, device, tier, patched, **model_shape)
    ids, mask = prompts(batch, vocab, seed)
    with torch.no_grad():
        out = model.generate(
            ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            pad_token_id=PAD,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[:, ids.shape[1] :]
    logits = torch.stack(out.logits, 1)
    with torch.no_grad():
        logprobs = token_logprobs(logits, tokens, tier, patched)
    return {"tokens": tokens.cpu(), "logprobs": logprobs.cpu(), "logits_digest": digest(logits.float().cpu())}


def completion_logits(model, ids: torch.Tensor, mask: torch.Tensor, tokens: torch.Tensor, device: str) -> torch.Tensor:
    """One teacher-forced forward over prompt + completion (left padded): the logits scoring each completion token."""
    width, new = ids.shape[1], tokens.shape[1]
    seqs = torch.cat([ids, tokens.cpu()], 1)
    full = torch.cat([mask, torch.ones_like(tokens.cpu())], 1)
    logits = model(input_ids=seqs.to(device), attention_mask=full.to(device)).logits
    return logits[:, width - 1 : width + new - 1]


def train(tokens, shape, dtype: str, seed: int, device: str, tier: str, patched: bool = True, **model_shape) -> dict:
    batch, _, vocab = shape
    model = build(vocab, dtype, seed, device, tier, patched, **model_shape)
    ids, mask = prompts(batch, vocab, seed)
    logits = completion_logits(model, ids, mask, tokens, device)
    logprobs = token_logprobs(logits, tokens.to(device), tier, patched)
    return {"logprobs": logprobs.detach().cpu(), "logits_digest": digest(logits.detach().float().cpu())}
