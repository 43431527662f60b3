"""README's warning is true: rl_kernel on one side (rollout or training) and stock torch on the other differ.

rl_kernel.token_logprobs follows its own contract (docs/numerics.md), not torch's arithmetic, so it is not a
drop-in that reproduces `torch.log_softmax(x.float(), -1).gather(...)` bit for bit. If the two ever became equal
on these inputs, the README's warning ("the same rl_kernel function must run on both sides") would be stale:
this test then fails and the warning must be revisited.
"""

from __future__ import annotations

import torch

import rl_kernel


def _mismatches(a: torch.Tensor, b: torch.Tensor) -> int:
    assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape
    return int((a.contiguous().view(torch.int32) != b.contiguous().view(torch.int32)).sum())


def test_rl_kernel_on_one_side_and_stock_torch_on_the_other_differ() -> None:
    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(64, 32000, generator=g) * 3).to(torch.bfloat16)
    tokens = torch.randint(0, 32000, (64,), generator=g)
    ours = rl_kernel.token_logprobs(logits, tokens)
    stock = torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, None])[:, 0]
    differ = _mismatches(ours, stock)
    assert differ >= 1, "rl_kernel now equals stock torch here: README's one-side warning is stale"
    # the difference is rounding, not a wrong answer: a few ulp at most
    assert torch.allclose(ours, stock, rtol=0, atol=1e-4)
    # and both sides running rl_kernel agree bit for bit
    assert _mismatches(ours, rl_kernel.token_logprobs(logits.clone(), tokens.clone())) == 0
