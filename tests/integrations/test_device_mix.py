"""A patched Hugging Face model with one layer on another device raises, as the stock model does, instead of
returning logits computed from uninitialised memory (rl_kernel's fake implementations used to run for the meta
weights and hand back empty host tensors)."""

from __future__ import annotations

import pytest
import torch

from rl_kernel.integrations import transformers as hf
from rlparity.cell.workloads import model as M

VOCAB = 211


@pytest.mark.parametrize("family", M.FAMILIES)
def test_a_layer_on_meta_raises(family: str) -> None:
    p = M.prompts(2, VOCAB, 0)
    stock = M.build(family, VOCAB, "fp32", 0).eval()
    stock.model.layers[1].to("meta")
    with pytest.raises((RuntimeError, NotImplementedError, ValueError)), torch.no_grad():
        stock(input_ids=p.ids, attention_mask=p.mask)  # the control: stock PyTorch refuses the mix
    model = hf.patch(M.build(family, VOCAB, "fp32", 0).eval())
    model.model.layers[1].to("meta")
    with pytest.raises(ValueError, match=r"^rl_kernel: .* is on meta but .* is on cpu"), torch.no_grad():
        model(input_ids=p.ids, attention_mask=p.mask)
