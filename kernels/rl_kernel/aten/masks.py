"""SDPA's mask as the tiers' attention states it, for rl_kernel.mode (aten_mode serves scaled_dot_product_attention
with it): a key range per query row, max(k_start[b], q_pos[b, t] - window + 1) .. q_pos[b, t]; any other mask is
refused by name."""

from __future__ import annotations

import weakref
from collections import OrderedDict

import torch

from rl_kernel.aten.ops import ModeError


def key_ranges(q, k, attn_mask, is_causal: bool, tier: str = "exact") -> tuple[torch.Tensor, torch.Tensor, int]:
    """SDPA's mask as the tier's attention states it: (q_pos, k_start, window), query row t of sequence b seeing
    keys max(k_start[b], q_pos[b, t] - window + 1) .. q_pos[b, t] (window 0: from k_start[b]). Causal (top-left, as
    SDPA's is_causal), none (every key) and a boolean or 0/-inf mask of that form (a left padding under a causal
    mask, a sliding window that cuts keys, the same for every head; right pads) are served; any other mask is refused
    by name."""
    b, tq, s = q.shape[0], q.shape[2], k.shape[2]
    cols = torch.arange(s, device=q.device)
    if attn_mask is None:
        rows = torch.arange(tq, device=q.device) if is_causal else torch.full((tq,), s - 1, device=q.device)
        return rows.expand(b, tq).contiguous(), torch.zeros(b, dtype=torch.int64, device=q.device), 0
    if attn_mask.dtype == torch.bool:
        seen = attn_mask
    elif bool(((attn_mask == 0) | (attn_mask == float("-inf"))).all()):
        seen = attn_mask == 0
    else:
        raise ModeError(f"rl_kernel.mode({tier!r}): scaled_dot_product_attention with an additive mask of "
                        "values other than 0 and -inf (a bias, ALiBi): the tier's attention has none")  # fmt: skip
    while seen.dim() < 4:
        seen = seen.unsqueeze(0)
    seen = seen.expand(b, seen.shape[1], tq, s)
    if not bool((seen == seen[:, :1]).all()):
        raise ModeError(f"rl_kernel.mode({tier!r}): scaled_dot_product_attention with a mask that differs by head")
    seen = seen[:, 0]
    some = seen.any(-1)
    first = torch.where(seen, cols, s).amin(-1)  # each row's first key
    k_start = torch.where(some, first, s).amin(-1).clamp(max=s - 1)
    q_pos = torch.where(some, torch.where(seen, cols, -1).amax(-1), k_start[:, None] - 1)
    window = _window(first, q_pos, k_start, some)
    lo = k_start[:, None] if not window else torch.maximum(k_start[:, None], q_pos - window + 1)
    rebuilt = (cols >= lo[:, :, None]) & (cols <= q_pos[:, :, None])
    # A row whose last key repeats the row before's sees no key of its own: a right pad. Under a window it sees the
    # tail of that range (stated whole: a pad's output is no token's); it may see nothing outside it.
    pad = torch.zeros_like(some)
    pad[:, 1:] = some[:, 1:] & (q_pos[:, 1:] == q_pos[:, :-1])
    if not bool(torch.where(pad[:, :, None], rebuilt | ~seen, rebuilt == seen).all()):
        raise ModeError(f"rl_kernel.mode({tier!r}): scaled_dot_product_attention with a mask that is not a key range "
                        "max(k_start[b], q_pos[b, t] - window + 1) .. q_pos[b, t] per row (packed sequences, "
                        "bidirectional blocks): the tier's attention cannot state it")  # fmt: skip
    return q_pos.contiguous(), k_start.contiguous(), window


def _window(first: torch.Tensor, q_pos: torch.Tensor, k_start: torch.Tensor, some: torch.Tensor) -> int:
    """The sliding window of rows whose first key comes after their sequence's: the keys they see (one count for
    all of them, or the mask is none the tier states: key_ranges rebuilds it to check), 0 where no row is cut."""
    cut = some & (first > k_start[:, None])
    if not bool(cut.any()):
        return 0
    return int((q_pos - first + 1)[cut].max())


class RangesMemo:
    """key_ranges of the masks seen last: a model's layers take one mask tensor per forward (one per kind of layer,
    full or windowed), so its second layer on finds the ranges the first one read. Reading a mask is several passes
    over [batch, len, keys] and a host sync each (its checks), per layer without this. A hit is the same tensor
    object (a weak reference: a freed mask's id may come back), unmodified (its version counter) and the same call
    shape; anything else reads the mask anew."""

    def __init__(self, size: int = 4) -> None:
        self.size = size
        self.entries: OrderedDict[tuple, tuple[weakref.ref, tuple[torch.Tensor, torch.Tensor, int]]] = OrderedDict()

    def key_ranges(self, q, k, attn_mask, is_causal: bool, tier: str) -> tuple[torch.Tensor, torch.Tensor, int]:
        if attn_mask is None:  # nothing to read
            return key_ranges(q, k, attn_mask, is_causal, tier)
        key = (id(attn_mask), attn_mask._version, q.shape[0], q.shape[2], k.shape[2], is_causal, q.device)
        hit = self.entries.get(key)
        if hit is not None and hit[0]() is attn_mask:
            self.entries.move_to_end(key)
            return hit[1]
        ranges = key_ranges(q, k, attn_mask, is_causal, tier)
        self.entries[key] = (weakref.ref(attn_mask), ranges)
        while len(self.entries) > self.size:
            self.entries.popitem(last=False)
        return ranges
