"""The mode's reading of SDPA's mask (rl_kernel.aten.masks): a model's layers pass one mask per forward, read once
(each read is several passes over the mask and host syncs); a mask changed in place, or another tensor, is read
anew, so a stale range is never served."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import rl_kernel
from rl_kernel.aten import masks as mode_masks
from rl_kernel.aten.mode import ModeError
from rl_kernel.bitwise import bits_equal


def _inputs() -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 9, 8, generator=g)
    k, v = (torch.randn(2, 2, 9, 8, generator=g) for _ in range(2))
    cols = torch.arange(9)
    pad = torch.tensor([0, 3])
    mask = (cols[None, :, None] >= cols[None, None, :]) & (cols[None, None, :] >= pad[:, None, None])
    return q, k, v, mask[:, None]


@pytest.fixture
def reads(monkeypatch) -> list[int]:
    """How many times the mode read a mask (mode_masks.key_ranges' calls with one)."""
    seen: list[int] = []
    real = mode_masks.key_ranges

    def counted(q, k, attn_mask, *args):
        seen.append(attn_mask is not None)
        return real(q, k, attn_mask, *args)

    monkeypatch.setattr(mode_masks, "key_ranges", counted)
    return seen


def test_one_mask_is_read_once_for_every_layer(reads: list[int]) -> None:
    q, k, v, mask = _inputs()
    with rl_kernel.mode("exact"):
        outs = [F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True) for _ in range(4)]
        fresh = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.clone(), enable_gqa=True)
    assert sum(reads) == 2, f"four layers on one mask read it once, another tensor once more: {reads}"
    assert all(bits_equal(o, fresh) for o in outs), "a remembered range gives the bits of a fresh read"


def test_a_mask_changed_in_place_is_read_anew(reads: list[int]) -> None:
    """Control: the same tensor, made a mask no key range states: re-read (its version moved) and refused."""
    q, k, v, mask = _inputs()
    with rl_kernel.mode("exact"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        mask[0, 0, 2, 0] = False  # a hole in row 2's range
        with pytest.raises(ModeError, match="not a key range"):
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert sum(reads) == 2


def test_other_shapes_of_the_call_are_read_anew(reads: list[int]) -> None:
    q, k, v, mask = _inputs()
    with rl_kernel.mode("exact"):
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        F.scaled_dot_product_attention(q[:, :, 4:], k, v, attn_mask=mask[:, :, 4:], enable_gqa=True)  # a view
        F.scaled_dot_product_attention(q[:, :, 4:], k, v, attn_mask=mask[:, :, 4:], enable_gqa=True)  # another
    assert sum(reads) == 3, "each view is a tensor of its own: read once each"


def test_a_freed_mask_is_never_mistaken_for_a_new_one() -> None:
    """The memo keeps a weak reference: an entry whose mask was freed (its id free to come back for a new tensor)
    does not answer, even under the new tensor's own key; the mask is read anew."""
    q, k, _, mask = _inputs()
    memo = mode_masks.RangesMemo()
    right = memo.key_ranges(q, k, mask, False, "exact")
    ((key, _),) = memo.entries.items()
    stale = (right[0], right[1] + 1, right[2])  # what a freed mask of this id had said
    memo.entries[key] = (lambda: None, stale)  # its weak reference: dead
    assert torch.equal(memo.key_ranges(q, k, mask, False, "exact")[1], right[1]), "a dead entry never answers"
