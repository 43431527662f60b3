"""The architectures workload's suite (rlparity.cell.workloads.architectures): each architecture of rl_kernel.models
and a decoder in plain PyTorch, unpatched, under rl_kernel.mode(cell's tier) on the cell's device: generate()'s
logits == the teacher-forced forward's (the batch left padded, called without position_ids as TRL does and with the
mask's as verl does; each sequence alone), and the mode's audit of a
training forward and backward leaves nothing batch-variant to stock. The same comparison without the mode is the
informational control. Every equality is on integer views of the bits."""

from __future__ import annotations

import pytest
import torch

import rl_kernel
from rl_kernel import models
from rl_kernel.aten import mode as aten_mode
from rl_kernel.inputs import DTYPE_NAMES
from rlparity.cell.placement import devices
from rlparity.cell.workloads import model as M

PLAIN = "plain"  # rl_kernel.models.PlainDecoder: no transformers


@pytest.fixture(params=(*models.ARCHITECTURES, PLAIN))
def architecture(request) -> str:
    return request.param


def _sid(shape, architecture: str) -> str:
    return f"architectures:{'x'.join(map(str, shape))} {architecture}"


def _model(architecture: str, vocab: int, cell, device, params):
    if architecture == PLAIN:
        heads = params["heads"]
        model = models.PlainDecoder(vocab, params["hidden"], params["layers"], heads, max(1, heads // 2), cell.seed)
        return model.to(DTYPE_NAMES[cell.dtype]).to(device).eval()
    return M.build(architecture, vocab, cell.dtype, cell.seed, device, **params).eval()


def _generate(model, architecture: str, p: M.Prompts, new: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequences [B, prompt width + new], the completion's logits [B, new, V] fp32) of a greedy rollout, on the CPU."""
    if architecture == PLAIN:
        tokens, logits = model.generate(p.ids.to(device), p.mask.to(device), new)
        return torch.cat([p.ids, tokens.cpu()], 1), logits.float().cpu()
    r = M.generate(model, p, new, None, device)
    return r.sequences, r.logits


def _scored(model, architecture: str, seqs: list[torch.Tensor], new: int, device, positions: bool) -> torch.Tensor:
    """One left-padded forward over the sequences, called as a trainer calls it: with the positions generate() gives
    them (1s so far - 1, as verl passes them) or without (as TRL's trainers call it: the mode derives the same); each
    one's logits at the positions that score its `new` completion tokens, [B, new, V] fp32 on the CPU."""
    ids, mask = (t.to(device) for t in M.padded(seqs, right=False))
    given = {"position_ids": (mask.cumsum(-1) - 1).clamp(min=0)} if positions else {}
    with torch.no_grad():
        if architecture == PLAIN:
            return model(ids, mask)[:, -new - 1 : -1].float().cpu()
        logits = model(input_ids=ids, attention_mask=mask, **given).logits
    return logits[:, -new - 1 : -1].float().cpu()


def _views(model, architecture: str, p: M.Prompts, sequences: torch.Tensor, new: int, device) -> dict:
    width = p.ids.shape[1]
    seqs = [sequences[b, width - p.lengths[b] :] for b in range(sequences.shape[0])]
    return {
        "batch, left padded": _scored(model, architecture, seqs, new, device, positions=False),
        "batch, left padded, the mask's positions": _scored(model, architecture, seqs, new, device, positions=True),
        "each sequence alone": torch.cat([_scored(model, architecture, [s], new, device, False) for s in seqs]),
    }


def test_generate_matches_forward_under_the_mode(cell, tier, record, shape, architecture, params):
    dev = devices(cell.platform, cell.placement)[0]
    p = M.prompts(shape[0], shape[2], cell.seed)
    with rl_kernel.mode(tier):
        model = _model(architecture, shape[2], cell, dev, params)
        sequences, logits = _generate(model, architecture, p, shape[1], dev)
        views = _views(model, architecture, p, sequences, shape[1], dev)
    failures = []
    for name, forward in views.items():
        what = f"{_sid(shape, architecture)} generate vs {name} ({dev}), mode({cell.tier})"
        d = record.compare(what, logits, forward)
        if not d.equal:
            failures.append(f"{name}: {d.summary()}")
    assert not failures, "; ".join(failures)


def test_the_mode_covers_the_architecture(cell, tier, record, shape, architecture, params):
    """A training forward and backward under the mode leaves no batch-variant aten operator to stock."""
    dev = devices(cell.platform, cell.placement)[0]
    model = _model(architecture, shape[2], cell, dev, params)
    ids, mask = (t.to(dev) for t in models.sequences(shape[0], 6, shape[1], shape[2], cell.seed))

    def step() -> None:
        out = model(ids, mask) if architecture == PLAIN else model(input_ids=ids, attention_mask=mask).logits
        out.float().sum().backward()

    found = aten_mode.audit(step, tier)
    for op, count in found.served.items():
        record.metric(f"{_sid(shape, architecture)} served {op}", count)
    assert found.covered, found.summary()


def test_stock_architecture_control(cell, record, shape, architecture, params):
    """Informational, never gated: the same comparison without the mode (what it buys)."""
    dev = devices(cell.platform, cell.placement)[0]
    p = M.prompts(shape[0], shape[2], cell.seed)
    model = _model(architecture, shape[2], cell, dev, params)
    sequences, logits = _generate(model, architecture, p, shape[1], dev)
    forward = _views(model, architecture, p, sequences, shape[1], dev)["batch, left padded"]
    d = record.compare(f"{_sid(shape, architecture)} stock generate vs forward", logits, forward, informational=True)
    assert d.total == logits.numel()
