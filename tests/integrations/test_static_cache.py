"""generate(cache_implementation="static") on a patched model (issue 30's first part, the exact tier on the CPU): its
logits equal the dynamic cache's and the teacher-forced forward's (the batch left and right padded, shuffled, each
sequence alone) bit for bit; the stock model's static generate() differs from its forward (the negative control).
And key_mask, which reads the 2-d key mask from what a caller passes (none, 2-d, generate()'s 4-d masks or a dict of
them)."""

from __future__ import annotations

import types

import pytest
import torch

from rl_kernel import models
from rl_kernel.bitwise import bits_equal, diff
from rl_kernel.integrations import generation
from rl_kernel.integrations import transformers as hf
from rlparity.cell.workloads import model as M

VOCAB, NEW = 211, 5


def generated(model, p: M.Prompts, static: bool) -> M.Rollout:
    kw = {"cache_implementation": "static"} if static else {}
    kw |= {"max_new_tokens": NEW, "min_new_tokens": NEW, "pad_token_id": models.PAD}
    with torch.no_grad():
        out = model.generate(p.ids, attention_mask=p.mask, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, **kw)  # fmt: skip
    return M.Rollout(out.sequences, torch.stack(out.logits, 1).float(), p.ids.shape[1])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("family", models.FAMILIES)
def test_static_cache_generate_equals_the_forward(family: str, dtype: str) -> None:
    model = models.tiny_model(family, VOCAB, tier="exact", dtype=dtype)
    p = M.prompts(5, VOCAB, 0)
    static, dynamic = generated(model, p, static=True), generated(model, p, static=False)
    assert bits_equal(static.logits, dynamic.logits), diff(static.logits, dynamic.logits).summary()
    for view, logits in M.forward_views(model, static, p, "cpu").items():
        assert bits_equal(static.logits, logits), f"{family} {dtype} {view}: {diff(static.logits, logits).summary()}"


def test_the_stock_static_generate_differs_from_its_forward() -> None:
    model = models.tiny_model("qwen3", VOCAB)
    p = M.prompts(5, VOCAB, 0)
    r = generated(model, p, static=True)
    assert not bits_equal(r.logits, M.forward_views(model, r, p, "cpu")["batch, left padded"])


def test_unpatch_takes_the_mask_hook_away() -> None:
    model = models.tiny_model("llama", VOCAB, tier="exact")
    assert "create_masks_for_generate" in model.__dict__
    hf.unpatch(model)
    assert "create_masks_for_generate" not in model.__dict__


def four_d(mask2d: torch.Tensor, new: int, slots: int, additive: bool) -> torch.Tensor:
    """generate()'s 4-d mask for the last `new` tokens of a left-padded [b, past + new] mask, over `slots` keys."""
    total = mask2d.shape[1]
    keys = torch.arange(slots)
    rows = torch.arange(total - new, total)
    seen = (keys[None, None, :] <= rows[None, :, None]) & torch.nn.functional.pad(mask2d.bool(), (0, slots - total))[
        :, None, :
    ]
    seen = seen[:, None]
    return torch.where(seen, 0.0, float("-inf")) if additive else seen


@pytest.mark.parametrize("additive", [False, True])
def test_key_mask_reads_generates_4d_masks(additive: bool) -> None:
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1], [0, 0, 0, 1, 1, 1]])
    for new in (6, 1):
        got, past = generation.key_mask(four_d(mask, new, 9, additive), 3, new, None, torch.device("cpu"))
        assert past == 6 - new and torch.equal(got, mask)
        # a hybrid model's masks by layer type: the full attention's, whichever comes first
        window = torch.zeros_like(four_d(mask, new, 9, additive))
        by_type = {"sliding_attention": window, "full_attention": four_d(mask, new, 9, additive)}
        got, past = generation.key_mask(by_type, 3, new, None, torch.device("cpu"))
        assert past == 6 - new and torch.equal(got, mask)
    none, past = generation.key_mask(None, 2, 4, None, torch.device("cpu"))
    assert past == 0 and torch.equal(none, torch.ones(2, 4, dtype=torch.long))


def test_key_mask_names_what_it_cannot_read() -> None:
    cpu = torch.device("cpu")
    right_padded = torch.tensor([[[[True, True, True, False]]], [[[True, True, True, True]]]])  # row 0 ends early
    with pytest.raises(ValueError, match="does not see its own slot"):
        generation.key_mask(right_padded, 2, 1, None, cpu)
    with pytest.raises(ValueError, match="2-d attention_mask"):
        generation.key_mask(torch.ones(2, 3, dtype=torch.long), 2, 4, None, cpu)
    with pytest.raises(ValueError, match="empty dict"):
        generation.key_mask({}, 2, 4, None, cpu)


def test_positions_count_a_rows_tokens_and_are_zero_on_its_padding() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0]])  # a static cache's mask: zero past its tokens
    pos, q_pos, k_start, _ = generation.positions(mask, 1, 4)
    assert torch.equal(pos, torch.tensor([[0, 0, 1, 2], [1, 2, 3, 4]]))
    assert torch.equal(q_pos, torch.tensor([[1, 2, 3, 4]] * 2)) and torch.equal(k_start, torch.tensor([2, 0]))


class StaticLayer:  # the name transformers' full-attention static layer has
    def __init__(self, slots: int) -> None:
        self.max_cache_len = slots


class StaticSlidingWindowLayer(StaticLayer):
    pass


def test_static_slots_are_a_full_attention_static_caches_only() -> None:
    def cache(*layers: object, compileable: bool = True) -> types.SimpleNamespace:
        return types.SimpleNamespace(layers=list(layers), is_compileable=compileable)

    assert generation.static_slots(cache(StaticLayer(16), StaticLayer(16))) == 16
    assert generation.static_slots(cache(StaticSlidingWindowLayer(16), StaticSlidingWindowLayer(16))) == 0
    assert generation.static_slots(cache(StaticLayer(16), StaticLayer(8))) == 0
    assert generation.static_slots(cache(StaticLayer(16), compileable=False)) == 0
    assert generation.static_slots(None) == 0


def test_slot_mask_pads_to_the_slots_and_never_cuts() -> None:
    cache = types.SimpleNamespace(layers=[StaticLayer(6)], is_compileable=True)
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    assert torch.equal(generation.slot_mask(attention_mask=mask, cache=cache), torch.nn.functional.pad(mask, (0, 3)))
    longer = torch.ones(2, 8, dtype=torch.long)
    assert generation.slot_mask(attention_mask=longer, past_key_values=cache) is longer  # key_mask names it later
    assert generation.slot_mask(attention_mask=mask) is mask  # no static cache
