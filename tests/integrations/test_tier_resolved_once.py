"""The tier is resolved once at each entry point (the fused head, the policy loss, the mode, patch, a cell's model
step) and passed down as its descriptor: a call looks its tier up by name once (never when handed the descriptor)
and builds the fused head's GEMMs once."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import rl_kernel
from rl_kernel import head, models, tiers
from rl_kernel.head import parallel
from rl_kernel.integrations import transformers as hf
from rlparity.cell.workloads import model as M


@pytest.fixture
def counted(monkeypatch) -> Counter:
    """Every lookup of a tier by name (tiers.get) and every HeadGemms built, counted by tier name."""
    found: Counter = Counter()
    get, gemms = tiers.get, tiers.Tier.head_gemms

    def counting_get(name: str) -> tiers.Tier:
        found[f"get {name}"] += 1
        return get(name)

    def counting_gemms(self: tiers.Tier) -> tiers.HeadGemms:
        found[f"gemms {self.name}"] += 1
        return gemms(self)

    monkeypatch.setattr(tiers, "get", counting_get)
    monkeypatch.setattr(tiers.Tier, "head_gemms", counting_gemms)
    return found


def _case() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(6, 16, generator=g).bfloat16().requires_grad_()
    weight = torch.randn(300, 16, generator=g).bfloat16().requires_grad_()
    return hidden, weight, torch.randint(0, 300, (6,), generator=g)


def _fused_head(tier) -> None:
    h, w, tok = _case()
    logp, ent = head.lm_head_logprobs(h, w, tok, tier=tier, entropy=True, vocab_chunk=64)
    (logp.sum() + ent.sum()).backward()


def _policy_loss(tier) -> None:
    h, w, tok = _case()
    old, adv = torch.zeros(6), torch.ones(6)
    out = rl_kernel.lm_head_loss(h, w, tok, lambda lp, o, a: -(lp - o).exp() * a, torch.mean, (old, adv), tier=tier)
    out.loss.backward()


def _vocab_parallel(tier) -> None:
    h, w, tok = _case()
    parallel.lm_head_logprobs(h, w, tok, vocab_start=0, vocab_size=300, tier=tier, vocab_chunk=64).sum().backward()


def _unfused(tier) -> None:
    h, w, tok = _case()
    head.unfused(h, w, tok, tier=tier, entropy=True)


def _mode(tier) -> None:
    model = models.tiny_model("qwen3", 64, dtype="bf16")
    ids, mask = models.sequences(2, 3, 4, 64, 0)
    with rl_kernel.mode(tier):
        model(input_ids=ids, attention_mask=mask).logits.float().sum().backward()


@pytest.mark.parametrize("call", [_fused_head, _policy_loss, _vocab_parallel, _unfused, _mode])
def test_a_call_looks_its_tier_up_once_and_builds_its_gemms_once(counted: Counter, call) -> None:
    call("exact")
    assert counted["get exact"] == 1, counted
    assert counted["gemms exact"] == (0 if call is _mode else 1), counted
    counted.clear()
    call(tiers.get("exact"))  # a descriptor is never looked up again
    assert counted["get exact"] == 1, counted  # (the line above's own)


def test_patch_resolves_once_and_its_model_passes_the_descriptor_down(counted: Counter) -> None:
    """patch() looks the tier up once; the patched model's forward, generate() and completion_logprobs never do
    (completion_logprobs builds its GEMMs once); a cell's model step handed the descriptor looks nothing up."""
    model = hf.patch(models.tiny_model("qwen3", 64, dtype="bf16"), tier="exact")
    assert counted["get exact"] == 1, counted
    ids, mask = models.sequences(2, 3, 4, 64, 0)
    model(input_ids=ids, attention_mask=mask)
    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2, do_sample=False, pad_token_id=models.PAD)
    hf.completion_logprobs(model, ids, mask, 2).sum()
    assert counted["get exact"] == 1 and counted["gemms exact"] == 1, counted
    assert hf.layers_of(model) is model.model.norm._rl_layers  # the namespace patch() resolved, on every module
    hf.unpatch(model)
    assert "_rl_layers" not in model.model.norm.__dict__
    counted.clear()
    exact = tiers.get("exact")
    M.rl_step("qwen3", (2, 2, 64), "bf16", 0, "cpu", exact)
    assert counted["get exact"] == 1 and counted["gemms exact"] == 2, counted  # the line above's; two steps' heads
