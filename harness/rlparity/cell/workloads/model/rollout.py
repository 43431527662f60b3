"""The model workload's rollout engine: a tiny random-weight Hugging Face Llama / Qwen2 / Qwen3 (built from a
config, no download; weights drawn on the CPU from a seed, so every device holds the same bits), prompts of
mixed lengths (left padded), generate() greedy or with the seeded Gumbel sampler keeping each step's logits
(Rollout), the training forward's views of the same sequences, a continuous-batching replay, and the stock
control's drift. The trainer (trainer.py) takes a Rollout; rlparity.cell.workloads.model joins the two.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch
import transformers
from transformers import LogitsProcessorList

from rl_kernel.inputs import DTYPE_NAMES
from rl_kernel.integrations import generation
from rl_kernel.integrations import transformers as hf
from rl_kernel.models import FAMILIES as FAMILIES  # re-exported: the model workload's families
from rl_kernel.models import PAD, tiny_config, tiny_weights
from rl_kernel.tiers import Tier
from rlparity.cell import mismatch
from rlparity.cell.workloads.model.workload import MODEL_DEFAULTS

MAX_PROMPT = 8  # prompts are 2 .. MAX_PROMPT tokens
CLIP = 0.2  # the surrogate's clip range: ratios outside [1 - CLIP, 1 + CLIP] are clipped
SHAPE_PARAMS = ("layers", "hidden", "heads", "intermediate")


# ---- the model: rl_kernel.models' (the locator, bench/, examples/ and the tests build the same) ------------
config = tiny_config  # the family's config


def build(
    family: str, vocab: int, dtype: str, seed: int, device: str | torch.device = "cpu", **shape: int
) -> transformers.PreTrainedModel:
    """The family's model (tiny_config's shape arguments) with weights from seed (rl_kernel.models.tiny_weights:
    made on the CPU in float32), then cast and moved (as rl_kernel.models.tiny_model, which takes no `intermediate`)."""
    return tiny_weights(family, vocab, seed, **shape).to(DTYPE_NAMES[dtype]).to(device)


def stock(family: str, vocab: int, dtype: str, seed: int, device, **params: int):
    """A fresh model of the family with the params' shape (MODEL_DEFAULTS' where not given), in eval mode."""
    p = {**MODEL_DEFAULTS, **params}
    shape = {k: p[k] for k in SHAPE_PARAMS if k != "intermediate"} | {"intermediate": p["intermediate"] or None}
    return build(family, vocab, dtype, seed, device, **shape).eval()


def patched(family: str, vocab: int, dtype: str, seed: int, device, tier: str | Tier = "exact", **params: int):
    """stock(), patched in the tier."""
    return hf.patch(stock(family, vocab, dtype, seed, device, **params), tier=tier)


# ---- the batch ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Prompts:
    ids: torch.Tensor  # [B, P] left padded with PAD
    mask: torch.Tensor  # [B, P]
    lengths: tuple[int, ...]


def prompts(batch: int, vocab: int, seed: int) -> Prompts:
    """Seeded prompts of 2 .. MAX_PROMPT tokens, left padded with PAD to the longest. Not rl_kernel.models.sequences
    (the locator's), which draws each row's length and tokens in turn: the committed digests of the model workload
    (data/golden/exact.json) are of these prompts."""
    g = torch.Generator().manual_seed(seed + 11)
    lengths = [int(x) for x in torch.randint(2, MAX_PROMPT + 1, (batch,), generator=g)]
    width = max(lengths)
    ids = torch.full((batch, width), PAD, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for b, n in enumerate(lengths):
        ids[b, width - n :] = torch.randint(1, vocab, (n,), generator=g)
        mask[b, width - n :] = 1
    return Prompts(ids, mask, tuple(lengths))


@dataclass(frozen=True)
class Rollout:
    sequences: torch.Tensor  # [B, P + N] on the CPU: the prompts (left padded) and the completions
    logits: torch.Tensor  # [B, N, V] fp32 on the CPU: the logits each completion token was drawn from
    prompt_width: int

    @property
    def completions(self) -> torch.Tensor:
        return self.sequences[:, self.prompt_width :]


def generate(model, p: Prompts, new: int, seed: int | None, device, rollout: str = "eager") -> Rollout:
    """model.generate(): greedy (seed None) or with rl_kernel's Gumbel sampler (keys: the prompt's number), in a
    rollout mode (rl_kernel.integrations.generation.rollout_kwargs: eager, static, compiled; "batched" is
    engine_rollout's, which keeps no logits)."""
    if rollout == BATCHED:
        raise ValueError("the batched rollout is transformers' engine (engine_rollout), not a generate() mode")
    processors = None
    if seed is not None:
        keys = torch.arange(p.ids.shape[0]) * 7 + 1
        processors = LogitsProcessorList([hf.GumbelSampler(seed, keys=keys, pad_token_id=PAD)])
    with torch.no_grad():
        out = model.generate(
            p.ids.to(device),
            attention_mask=p.mask.to(device),
            max_new_tokens=new,
            min_new_tokens=new,
            do_sample=False,
            logits_processor=processors,
            pad_token_id=PAD,
            output_logits=True,
            return_dict_in_generate=True,
            **generation.rollout_kwargs(rollout, device),
        )
    return Rollout(out.sequences.cpu(), torch.stack(out.logits, 1).float().cpu(), p.ids.shape[1])


# ---- transformers' continuous batching (the rollout mode "batched") ----------------------------------------
BATCHED = "batched"  # the workload's rollout mode that runs transformers' engine instead of generate()


@dataclass(frozen=True)
class EngineRollout:
    """What transformers' continuous batching returns for the prompts: the sequences as generate() lays them out
    (prompts left padded, then the completions) and the engine's log-probability of each chosen token [B, N] fp32
    (rl_kernel.integrations.paged.engine_logprobs's function of its logit row: the engine keeps no logits)."""

    sequences: torch.Tensor
    logprobs: torch.Tensor
    prompt_width: int

    @property
    def completions(self) -> torch.Tensor:
        return self.sequences[:, self.prompt_width :]


def engine_rollout(model, p: Prompts, new: int) -> EngineRollout:
    """model.generate_batch (a patched model's: the tier's attention per request) of the prompts, greedy, exactly
    `new` tokens each (no token ends a sequence), its cache sized for the cell (pages of 16 tokens, prefills chunked
    at 32 tokens: requests join while others decode)."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    prompts = [row[m.bool()].tolist() for row, m in zip(p.ids, p.mask, strict=True)]
    gen = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=-1, pad_token_id=PAD)
    config = ContinuousBatchingConfig(page_size=16, num_blocks=64, max_batch_tokens=32, return_logprobs=True,
                                      auto_switch_to_flash=False)  # fmt: skip
    with torch.no_grad():
        out = list(model.generate_batch(prompts, generation_config=gen, continuous_batching_config=config).values())
    for prompt, o in zip(prompts, out, strict=True):  # generate_batch returns its requests in the order given
        if o.error or o.prompt_ids != prompt or len(o.generated_tokens) != new:
            raise RuntimeError(f"generate_batch: request {o.request_id}: {o.error or 'not the prompt or length asked'}")
    completions = torch.tensor([o.generated_tokens for o in out])
    logprobs = torch.tensor([o.logprobs for o in out], dtype=torch.float32)
    return EngineRollout(torch.cat([p.ids, completions], 1), logprobs, p.ids.shape[1])


def full_mask(p: Prompts, new: int) -> torch.Tensor:
    return torch.cat([p.mask, torch.ones(p.mask.shape[0], new, dtype=torch.long)], 1)


# ---- the training forward's views of the same sequences -----------------------------------------------
def unpadded(r: Rollout | EngineRollout, p: Prompts, b: int) -> torch.Tensor:
    """Sequence b without its padding: prompt + completion, [L]."""
    return r.sequences[b, r.prompt_width - p.lengths[b] :]


def padded(seqs: list[torch.Tensor], right: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The sequences as one batch, padded with PAD to the longest (on the right or the left), and its mask."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        cols = slice(0, len(s)) if right else slice(width - len(s), width)
        ids[i, cols], mask[i, cols] = s, 1
    return ids, mask


def completion_logits(model, seqs: list[torch.Tensor], new: int, device, right: bool) -> list[torch.Tensor]:
    """One forward over the sequences padded to one width (right or left): each one's logits at the positions
    that score its `new` completion tokens, [new, V] fp32 on the CPU."""
    ids, mask = padded(seqs, right)
    width = ids.shape[1]
    with torch.no_grad():
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.float().cpu()
    out = []
    for i, s in enumerate(seqs):
        end = len(s) if right else width  # one past the sequence's last token
        out.append(logits[i, end - new - 1 : end - 1])
    return out


def forward_views(model, r: Rollout | EngineRollout, p: Prompts, device) -> dict[str, torch.Tensor]:
    """The completion logits [B, N, V] of teacher-forced forwards that see the batch four ways."""
    new, batch = r.completions.shape[1], r.sequences.shape[0]
    seqs = [unpadded(r, p, b) for b in range(batch)]
    order = torch.randperm(batch, generator=torch.Generator().manual_seed(batch)).tolist()
    shuffled = completion_logits(model, [seqs[i] for i in order], new, device, right=False)
    inverse = [shuffled[order.index(b)] for b in range(batch)]
    return {
        "batch, left padded": torch.stack(completion_logits(model, seqs, new, device, right=False)),
        "batch, right padded": torch.stack(completion_logits(model, seqs, new, device, right=True)),
        "each sequence alone": torch.stack([completion_logits(model, [s], new, device, True)[0] for s in seqs]),
        "batch shuffled": torch.stack(inverse),
    }


# ---- continuous batching ------------------------------------------------------------------------------
def _cache_kwarg(model) -> str:
    """transformers renamed past_key_values to cache (5.2x); the model's forward says which it takes."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _merge(caches: list[list[tuple[torch.Tensor, torch.Tensor]]]):
    """One DynamicCache over several sequences' own caches (each [1, Hkv, L_b, D] per layer), left padded."""
    width = max(c[0][0].shape[2] for c in caches)
    merged = transformers.DynamicCache()
    for layer in range(len(caches[0])):
        ks, vs = [], []
        for c in caches:
            k, v = c[layer]
            pad = (0, 0, width - k.shape[2], 0)
            ks.append(torch.nn.functional.pad(k, pad))
            vs.append(torch.nn.functional.pad(v, pad))
        merged.update(torch.cat(ks), torch.cat(vs), layer)
    return merged, width


def _layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def continuous_batching(model, r: Rollout, p: Prompts, device) -> torch.Tensor:
    """The completion logits [B, N, V] as a continuous-batching engine makes them: sequence b is prefilled
    alone at step b % 3, then decodes in whatever batch is running that step (rotated each step), from its
    own cache, left padded to the batch's longest; it leaves after its N tokens."""
    batch, new = r.completions.shape
    key = _cache_kwarg(model)
    seqs = [unpadded(r, p, b) for b in range(batch)]
    caches: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    done = {b: 0 for b in range(batch)}  # completion logits made so far
    out = torch.empty(batch, new, r.logits.shape[2])
    step = 0
    while any(n < new for n in done.values()):
        for b in [b for b in range(batch) if b % 3 == step]:  # joins: a prefill alone
            with torch.no_grad():
                o = model(input_ids=seqs[b][: p.lengths[b]].to(device)[None], use_cache=True)
            caches[b], out[b, 0], done[b] = _layers(o.past_key_values), o.logits[0, -1].float().cpu(), 1
        running = [b for b in caches if done[b] < new]
        if running:
            shift = step % len(running)
            running = running[shift:] + running[:shift]
            merged, width = _merge([caches[b] for b in running])
            mask = torch.zeros(len(running), width + 1, dtype=torch.long)
            ids = torch.empty(len(running), 1, dtype=torch.long)
            for i, b in enumerate(running):
                length = caches[b][0][0].shape[2]
                mask[i, width - length :] = 1
                ids[i, 0] = seqs[b][length]
            with torch.no_grad():
                o = model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=True, **{key: merged})
            for i, b in enumerate(running):
                length = caches[b][0][0].shape[2]
                caches[b] = [
                    (k[i : i + 1, :, width - length :], v[i : i + 1, :, width - length :]) for k, v in _layers(merged)
                ]
                out[b, done[b]] = o.logits[i, -1].float().cpu()
                done[b] += 1
        step += 1
    return out


# ---- the stock control's drift --------------------------------------------------------------------------
def drift(rollout_logits: torch.Tensor, forward_logits: torch.Tensor, tokens: torch.Tensor) -> dict[str, float]:
    """What a stock stack's rollout/training mismatch does to PPO, as the RL frameworks report it
    (rlparity.cell.mismatch: mean/max |dlogp|, k3 KL, the share of ratios outside the clip range, a |dlogp|
    histogram) over the sampled tokens' log-probs, float64 on the CPU."""
    old = torch.log_softmax(rollout_logits.double(), -1).gather(-1, tokens[..., None])[..., 0]
    new = torch.log_softmax(forward_logits.double(), -1).gather(-1, tokens[..., None])[..., 0]
    return mismatch.metrics(old, new, clip=CLIP)
