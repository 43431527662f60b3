"""Unpatched Hugging Face models under rl_kernel.mode("exact") on the CPU: generate()'s logits equal the
teacher-forced forward's bit for bit, a sequence alone equals it in a padded batch, two runs are equal, and the
audit finds nothing left to stock. Stock (no mode) is the negative control: its generate() differs from its forward.
The architecture table of docs/architecture.md ("The mode") records these, family by family."""

from __future__ import annotations

import pytest
import torch

import rl_kernel
from rl_kernel import aten_mode, models
from rl_kernel.bitwise import bits_equal, diff
from rlparity.cell.workloads import model as M

VOCAB, NEW = 211, 5  # test_transformers.py's sizes: the stock model's generate() and forward differ there


def logits_both_ways(family: str, dtype: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """generate()'s logits for five left-padded prompts, the forward's over the same sequences (positions from the
    mask, as generate() makes them: the unpatched model takes them as given), and the third sequence's forward alone
    (unpadded)."""
    model = M.build(family, VOCAB, dtype, 0).eval()
    p = M.prompts(5, VOCAB, 0)
    r = M.generate(model, p, NEW, None, "cpu")
    full = torch.cat([p.mask, torch.ones(p.mask.shape[0], NEW, dtype=p.mask.dtype)], dim=1)
    pos = (full.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        forward = model(input_ids=r.sequences, attention_mask=full, position_ids=pos).logits[:, -NEW - 1 : -1]
        real = full[2].bool()
        alone = model(input_ids=r.sequences[2:3, real]).logits[:, -NEW - 1 : -1]
    return r.logits, forward.float(), alone.float()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("family", models.FAMILIES)
def test_generate_equals_the_forward_under_the_mode(family: str, dtype: str) -> None:
    with rl_kernel.mode("exact"):
        generated, forward, alone = logits_both_ways(family, dtype)
        again = logits_both_ways(family, dtype)
    assert bits_equal(generated, forward), f"{family} {dtype}: {diff(generated, forward).summary()}"
    assert bits_equal(alone, forward[2:3]), f"{family} {dtype}: alone vs batch {diff(alone, forward[2:3]).summary()}"
    assert all(bits_equal(a, b) for a, b in zip(again, (generated, forward, alone), strict=True)), "run to run"


@pytest.mark.parametrize("family", models.FAMILIES)
def test_stock_generate_differs_from_its_forward(family: str) -> None:
    """The negative control: the same comparison without the mode finds differing logits (CPU fp32)."""
    generated, forward, _ = logits_both_ways(family, "fp32")
    assert not bits_equal(generated, forward), f"{family}: stock generate() == forward: the check could not fail"


@pytest.mark.parametrize("family", models.FAMILIES)
def test_the_audit_finds_the_family_covered(family: str) -> None:
    """A training forward and backward of the family under the mode leaves no batch-variant operator to stock."""
    model = models.tiny_model(family, 97, dtype="bf16")
    ids, mask = models.sequences(3, 8, 4, 97, seed=1)

    def step() -> None:
        logits = model(input_ids=ids, attention_mask=mask).logits
        logits.float().backward(torch.ones(logits.shape))

    found = aten_mode.audit(step)
    assert found.covered, found.summary()
    assert {"mm", "mean", "sum"} <= set(found.served) and "rl_kernel::attention" in found.served
