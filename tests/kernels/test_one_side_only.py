"""README's warning is true: rl_kernel on one side (rollout or training) and stock torch on the other differ.

rl_kernel.token_logprobs follows its own contract (docs/numerics.md), not torch's arithmetic, so it is not a
drop-in that reproduces `torch.log_softmax(x.float(), -1).gather(...)` bit for bit. If the two ever became equal
on these inputs, the README's warning ("the same rl_kernel function must run on both sides") would be stale:
this test then fails and the warning must be revisited.
"""

from __future__ import annotations

import pytest
import torch

import rl_kernel
from rl_kernel import inputs


def _mismatches(a: torch.Tensor, b: torch.Tensor) -> int:
    assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape
    return int((a.contiguous().view(torch.int32) != b.contiguous().view(torch.int32)).sum())


def _stock(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, None])[:, 0]


def _random(seed: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(64, 32000, generator=g) * scale).to(torch.bfloat16)
    return logits, torch.randint(0, 32000, (64,), generator=g)


CASES = {f"normal x{scale} seed {seed}": (seed, scale) for scale in (1, 3) for seed in range(6)}


@pytest.mark.parametrize("name", [*CASES, "rl_kernel.inputs.logits"])
def test_rl_kernel_on_one_side_and_stock_torch_on_the_other_differ(name: str) -> None:
    if name in CASES:
        logits, tokens = _random(*CASES[name])
    else:
        logits, tokens = inputs.logits(64, 32000, torch.bfloat16, 0), inputs.tokens(64, 32000, 0)
    ours = rl_kernel.token_logprobs(logits, tokens)
    stock = _stock(logits, tokens)
    assert _mismatches(ours, stock) >= 1, f"{name}: rl_kernel now equals stock torch: README's warning is stale"
    # the difference is rounding, not a wrong answer: a few ulp
    assert torch.allclose(ours, stock, rtol=0, atol=1e-4)
    # and both sides running rl_kernel agree bit for bit
    assert _mismatches(ours, rl_kernel.token_logprobs(logits.clone(), tokens.clone())) == 0
