"""generate() against a patched model's teacher-forced forward, as the patch's architecture tests compare them."""

from __future__ import annotations

import torch

from rl_kernel.bitwise import bits_equal, diff
from rlparity.cell.workloads import model as M


def mismatches(model, vocab: int, new: int, rollout: str, device: str, longer_than: int = 0) -> dict[str, str]:
    """generate()'s logits for 5 left-padded prompts and `new` tokens against the forward seen four ways (called as
    TRL calls it: M.forward_views) and called as verl calls it (position_ids = the mask's 1s so far - 1): the views
    that differ, with a summary. longer_than: the sequences must outgrow it (a window they must cut)."""
    p = M.prompts(5, vocab, 0)
    r = M.generate(model, p, new, None, device, rollout=rollout)
    assert r.sequences.shape[1] > longer_than, "the sequences must outgrow the window"
    views = M.forward_views(model, r, p, device)
    full = M.full_mask(p, new).to(device)
    with torch.no_grad():
        verl = model(input_ids=r.sequences.to(device), attention_mask=full, position_ids=(full.cumsum(-1) - 1).clamp(0))
    views["verl's call"] = verl.logits[:, -new - 1 : -1].float().cpu()
    return {name: diff(v, r.logits).summary() for name, v in views.items() if not bits_equal(v, r.logits)}
