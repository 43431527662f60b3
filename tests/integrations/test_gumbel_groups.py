"""GumbelSampler's keys for a GRPO group: one key per sample gives distinct samples; one key per prompt (what
the docstring used to advise) gives G identical samples, so every advantage would be zero. The docstring
now says so; this test holds both halves."""

from __future__ import annotations

import torch
from transformers import LogitsProcessorList

from rl_kernel.integrations import transformers as hf
from rlparity.cell.workloads import model as M

VOCAB, NEW, G, SEED = 211, 6, 4, 5


def _group(keys: torch.Tensor) -> torch.Tensor:
    """G copies of one prompt, sampled with GumbelSampler(keys): the G completions [G, NEW]."""
    model = hf.patch(M.build("llama", VOCAB, "fp32", 0).eval())
    p = M.prompts(1, VOCAB, 3)
    ids, mask = p.ids.repeat(G, 1), p.mask.repeat(G, 1)
    procs = LogitsProcessorList([hf.GumbelSampler(SEED, keys=keys, pad_token_id=M.PAD)])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=NEW,
            min_new_tokens=NEW,
            do_sample=False,
            logits_processor=procs,
            pad_token_id=M.PAD,
        )
    return out[:, ids.shape[1] :]


def test_a_key_per_group_member_gives_distinct_samples() -> None:
    prompt_id = 17
    samples = _group(prompt_id * G + torch.arange(G))  # the docstring's key = prompt_id * G + member
    assert len({tuple(s.tolist()) for s in samples}) >= 2, samples


def test_one_key_per_prompt_gives_identical_samples() -> None:
    """What the docstring warns about: the same key for the whole group draws the same sequence G times."""
    samples = _group(torch.full((G,), 17))
    assert all(torch.equal(s, samples[0]) for s in samples), samples


def test_the_docstring_advises_a_key_per_sample() -> None:
    doc = " ".join(hf.GumbelSampler.__doc__.split())
    assert "prompt_id * G + member" in doc and "Never one key per prompt" in doc, doc
    assert "pass a stable id per prompt" not in doc
