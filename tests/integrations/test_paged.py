"""transformers' continuous batching (`generate_batch`: paged KV cache, packed steps, chunked prefill) on a patched
model, the exact tier on the CPU (issue 30): each request's greedy tokens and their log-probabilities are those of the
teacher-forced forward of that request alone, and equal bit for bit alone, in a busy batch, in shuffled arrival and at
two page sizes, with windows that cut keys too (Mistral, a Qwen2 with use_sliding_window) and mixtures of experts
(Qwen3-MoE, OLMoE); a batch-variant attention
in the same engine and a windowed layer run without its window are caught (the negative controls). The log-probability
is the engine's own, log(softmax(the logit row)[token]) in fp32: a function of the whole row, compared as bits."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from rl_kernel import models
from rl_kernel.integrations import paged
from rl_kernel.integrations import transformers as hf

pytestmark = pytest.mark.skipif(not paged.served(), reason=paged.UNSERVED)
VOCAB, NEW = 211, 5


def prompts(n: int, seed: int) -> list[list[int]]:
    g = random.Random(seed)
    return [[g.randrange(1, VOCAB) for _ in range(g.randrange(3, 40))] for _ in range(n)]


def run(model, batch: list[list[int]], page_size: int = 16, max_batch_tokens: int = 48) -> list[tuple[list, list]]:
    """(generated tokens, their log-probs as float32 bits) per prompt, in the order given. max_batch_tokens below the
    batch's prompt tokens: prefills are chunked and requests join while others decode."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = ContinuousBatchingConfig(page_size=page_size, num_blocks=64, max_batch_tokens=max_batch_tokens,
                                      return_logprobs=True)  # fmt: skip
    gen = GenerationConfig(max_new_tokens=NEW, do_sample=False, eos_token_id=-1, pad_token_id=models.PAD)
    with torch.no_grad():
        out = model.generate_batch(batch, generation_config=gen, continuous_batching_config=config)  # patch's
    by_prompt = {}
    for o in out.values():
        assert o.error is None and len(o.generated_tokens) == NEW, (o.request_id, o.error, o.generated_tokens)
        bits = torch.tensor(o.logprobs, dtype=torch.float32).view(torch.int32).tolist()
        by_prompt[tuple(o.prompt_ids)] = (o.generated_tokens, bits)
    return [by_prompt[tuple(p)] for p in batch]


def teacher_forced(model, prompt: list[int], tokens: list[int]) -> tuple[list, list]:
    """The request alone through the patched model's forward: the greedy tokens of its logit rows and the engine's
    log-probability of each, log(softmax(row.float())[token])."""
    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + tokens], device=device)).logits[0].float()
    rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]
    logp = paged.engine_logprobs(rows, torch.tensor(tokens))
    return rows.argmax(-1).tolist(), logp.view(torch.int32).tolist()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("family", (*models.FAMILIES, *models.MIXTURES))
def test_each_request_is_its_forward_alone_whatever_the_batch(family: str, dtype: str) -> None:
    model = models.tiny_model(family, VOCAB, tier="exact", dtype=dtype)
    batch = prompts(6, 0)
    busy = run(model, batch)
    for prompt, (tokens, bits) in zip(batch, busy, strict=True):
        assert teacher_forced(model, prompt, tokens) == (tokens, bits), f"{family} {dtype}: vs the forward"
    assert [run(model, [p])[0] for p in batch[:3]] == busy[:3], "a request alone == in the busy batch"
    order = random.Random(1).sample(range(len(batch)), len(batch))
    shuffled = run(model, [batch[i] for i in order])
    assert [shuffled[order.index(i)] for i in range(len(batch))] == busy, "shuffled arrival"
    assert run(model, batch, page_size=32, max_batch_tokens=80) == busy, "another page size and chunking"


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("family", ["mistral", "qwen2"])
def test_windowed_layers_are_their_forward_alone_whatever_the_batch(family: str, dtype: str) -> None:
    """Mistral (every layer windowed) and a Qwen2 with use_sliding_window (a full layer, then a windowed one: the
    engine's two caches, a sliding one that keeps window - 1 keys per request): each request == its forward alone,
    alone == in the busy batch, at two page sizes and chunkings."""
    model = models.tiny_windowed_model(family, VOCAB, tier="exact", dtype=dtype)
    batch = prompts(6, 0)
    busy = run(model, batch)
    for prompt, (tokens, bits) in zip(batch, busy, strict=True):
        assert teacher_forced(model, prompt, tokens) == (tokens, bits), f"{family} {dtype}: vs the forward"
    assert [run(model, [p])[0] for p in batch[:3]] == busy[:3], "a request alone == in the busy batch"
    assert run(model, batch, page_size=32, max_batch_tokens=80) == busy, "another page size and chunking"


@pytest.mark.gpu
@pytest.mark.parametrize("family", (*models.WINDOWED, *models.MIXTURES))
def test_the_fast_tier_on_the_gpu_is_each_requests_forward_alone(family: str) -> None:
    """The fast tier's engine step on the GPU, with windows that cut keys (Mistral; Qwen2 / Qwen3 with full and
    windowed layers) and mixtures of experts: each request == its forward alone, alone == in the busy batch."""
    build = models.tiny_windowed_model if family in models.WINDOWED else models.tiny_model
    model = build(family, VOCAB, tier="fast", dtype="bf16", device="cuda")
    batch = prompts(6, 0)
    busy = run(model, batch)
    for prompt, (tokens, bits) in zip(batch, busy, strict=True):
        assert teacher_forced(model, prompt, tokens) == (tokens, bits), f"{family}: vs the forward"
    assert [run(model, [p])[0] for p in batch[:3]] == busy[:3], "a request alone == in the busy batch"


def test_a_window_left_out_of_the_step_is_caught(monkeypatch) -> None:
    """The negative control: the engine's windowed layers through the tier's attention without their window (what
    serving a sliding cache as a full one would do) must differ from the forward."""
    model = models.tiny_windowed_model("mistral", VOCAB, tier="exact")
    layers = hf.layers_of(model)

    def no_window(*args, window=0, **kwargs):
        return layers.attention(*args, **kwargs)

    monkeypatch.setattr(paged.patched, "layers_of", lambda _m: SimpleNamespace(attention=no_window))
    batch = prompts(6, 0)
    busy = run(model, batch)
    assert any(teacher_forced(model, p, t) != (t, b) for p, (t, b) in zip(batch, busy, strict=True)), (
        "without its window a request's rows must differ from its forward: the check could not fail"
    )


def batch_variant_attention(q, k, v, q_pos, k_start, scale=None, validate=False, window=0, sinks=None):
    """The negative control: the padded batch through SDPA's math in fp32, whose sums run over the batch's longest
    key row (the padded length changes with the other requests)."""
    keys = torch.arange(k.shape[2])
    seen = (keys[None, None, :] <= q_pos[:, :, None]) & (keys[None, None, :] >= k_start[:, None, None])
    rep = q.shape[1] // k.shape[1]
    kf, vf = (t.float().repeat_interleave(rep, 1) for t in (k, v))
    out = F.scaled_dot_product_attention(q.float(), kf, vf, attn_mask=seen[:, None], scale=scale)
    return torch.nan_to_num(out).to(q.dtype)


def test_a_batch_variant_attention_is_caught(monkeypatch) -> None:
    model = models.tiny_model("qwen3", VOCAB, tier="exact")
    monkeypatch.setattr(paged.patched, "layers_of", lambda _m: SimpleNamespace(attention=batch_variant_attention))
    batch = prompts(6, 0)
    busy = run(model, batch)
    alone = [run(model, [p])[0] for p in batch]
    assert alone != busy, "the control's rows must move with the batch: the check could not fail"


def test_the_engine_is_restored_and_bad_use_is_refused() -> None:
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    model = models.tiny_model("llama", VOCAB, tier="exact")
    before, implementation = ALL_ATTENTION_FUNCTIONS[paged.ENGINE], model.config._attn_implementation
    with paged.continuous_batching(model):
        assert model.config._attn_implementation == paged.ENGINE
        assert ALL_ATTENTION_FUNCTIONS[paged.ENGINE] is not before
    assert ALL_ATTENTION_FUNCTIONS[paged.ENGINE] is before and model.config._attn_implementation == implementation
    assert not any(hasattr(m, paged._MARK) for m in model.modules())
    with pytest.raises(ValueError, match="needs a model patched"):
        paged.continuous_batching(models.tiny_model("llama", VOCAB)).__enter__()
    q = torch.zeros(1, 4, 2, 8)
    kw = {"cu_seq_lens_q": torch.tensor([0, 2]), "cu_seq_lens_k": torch.tensor([0, 2]), "max_length_q": 2,
          "max_length_k": 2}  # fmt: skip
    layers = hf.layers_of(model)
    with pytest.raises(ValueError, match="block-table"):
        paged.paged_attention(layers, None, q, q[:, :2], q[:, :2], None, block_table=torch.zeros(1), **kw)
    assert "generate_batch" in model.__dict__ and "generate_batch" not in hf.unpatch(model).__dict__


def test_a_graph_padded_step_gives_its_padding_rows_zeros() -> None:
    """A step padded for CUDA graphs: query rows past the last request and requests of no tokens come back as +0."""
    model = models.tiny_model("qwen3", VOCAB, tier="exact")
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 4, 6, 16, generator=g), torch.randn(1, 2, 9, 16, generator=g)
    kw = {"cu_seq_lens_q": torch.tensor([0, 1, 4, 4]), "cu_seq_lens_k": torch.tensor([0, 5, 9, 9]),
          "max_length_q": 3, "max_length_k": 5}  # fmt: skip
    out, _ = paged.paged_attention(hf.layers_of(model), None, q, k, k, None, **kw)
    assert out.shape == (1, 6, 4, 16) and bool((out[0, 4:] == 0).all())
    layers = hf.layers_of(model)
    alone = layers.attention(q[:, :, 1:4], k[:, :, 5:9], k[:, :, 5:9], torch.tensor([[1, 2, 3]]), torch.tensor([0]))
    assert torch.equal(out[0, 1:4].view(torch.int32), alone[0].transpose(0, 1).contiguous().view(torch.int32))
