"""The verl / TRL / OpenRLHF log-prob drop-ins equal rl_kernel's operators bit for bit, with the frameworks'
signatures and their temperature division."""

from __future__ import annotations

import torch

import rl_kernel
from rl_kernel import inputs, integrations
from rl_kernel.bitwise import bits_equal


def _batch(dtype=torch.bfloat16):
    x = inputs.logits(24, 32000, dtype, seed=3).view(2, 12, 32000)
    return x, inputs.tokens(24, 32000, seed=3).view(2, 12)


def test_verl_helpers(device: str) -> None:
    x, t = (v.to(device) for v in _batch())
    assert bits_equal(integrations.logprobs_from_logits(x, t), rl_kernel.token_logprobs(x, t))
    assert bits_equal(integrations.logprobs_from_logits(x, t, inplace_backward=False), rl_kernel.token_logprobs(x, t))
    assert bits_equal(integrations.entropy_from_logits(x), rl_kernel.entropy(x))


def test_trl_selective_log_softmax(device: str) -> None:
    x, t = (v.to(device) for v in _batch())
    assert bits_equal(integrations.selective_log_softmax(x, t), rl_kernel.token_logprobs(x, t))


def test_openrlhf_log_probs_with_temperature(device: str) -> None:
    x, t = (v.to(device) for v in _batch(torch.float32))
    assert bits_equal(integrations.log_probs_from_logits(x, t), rl_kernel.token_logprobs(x, t))
    hot = integrations.log_probs_from_logits(x, t, temperature=0.7)
    assert bits_equal(hot, rl_kernel.token_logprobs(integrations.divide_by_temperature(x, 0.7), t))
    if device == "cpu":  # the CPU's x / T is a true division too (the GPU's multiplies by 1/T: see the helper)
        assert bits_equal(hot, rl_kernel.token_logprobs(x / 0.7, t))
    assert not bits_equal(hot, rl_kernel.token_logprobs(x, t))  # the temperature is applied


def test_gradients_flow_through_the_drop_ins() -> None:
    x, t = _batch(torch.float32)
    leaf = x.clone().requires_grad_()
    integrations.selective_log_softmax(leaf, t).sum().backward()
    ref = x.clone().requires_grad_()
    rl_kernel.token_logprobs(ref, t).sum().backward()
    assert bits_equal(leaf.grad, ref.grad)


def test_verl_fused_linear_for_ppo(device: str) -> None:
    """verl's FusedLinearForPPO signature: (log_probs, entropy) of hidden @ W^T / T, the unfused path's bits, and a
    gradient into the hidden states and the weight."""
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(2, 5, 32, generator=g).bfloat16().to(device).requires_grad_()
    weight = (torch.randn(300, 32, generator=g) * 0.2).bfloat16().to(device).requires_grad_()
    ids = torch.randint(0, 300, (2, 5), generator=g).to(device)
    fused = integrations.FusedLinearForPPO(chunk_size=7)
    for t in (1.0, 0.6):
        logp, ent = fused(hidden, weight, ids, temperature=t)
        want = rl_kernel.head.unfused(hidden, weight, ids, temperature=None if t == 1.0 else t, entropy=True)
        assert bits_equal(logp, want[0]) and bits_equal(ent, want[1])
    (logp.sum() + ent.sum()).backward()
    assert hidden.grad is not None and weight.grad is not None and bool(weight.grad.abs().sum() > 0)
