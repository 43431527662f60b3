"""Unpatched Hugging Face models under rl_kernel.mode(tier): generate()'s logits equal the teacher-forced forward's bit
for bit, a sequence alone equals it in a padded batch, two runs are equal, and the audit finds nothing left to stock;
for every architecture of rl_kernel.models (Llama, Qwen2, Qwen3, Mistral, Phi-3, OLMo 2, Qwen3-MoE, Gemma 2, Gemma 3),
the exact tier on the CPU and, where a GPU is, the exact and fast tiers on it. Stock (no mode) is the negative
control: its generate() differs from its forward. The forward is called both ways trainers call it: without
position_ids (TRL: the mode derives generate()'s from the mask, rl_kernel.aten.positions) and with the mask's
(verl). Qwen3-MoE runs its experts as transformers' default does, by the grouped GEMM; Mistral, Gemma 2 and Gemma 3
with sliding windows shorter than the sequences. The architecture table of docs/architecture.md ("The mode")
records these."""

from __future__ import annotations

import contextlib

import pytest
import torch

import rl_kernel
from rl_kernel import models
from rl_kernel.aten import mode as aten_mode
from rl_kernel.aten import positions as mode_positions
from rl_kernel.bitwise import bits_equal, diff
from rlparity.cell.workloads import model as M

VOCAB, NEW = 211, 5  # test_transformers.py's sizes: the stock model's generate() and forward differ there

# (tier, device, dtypes): the fast tier has bf16 / fp16 and a GPU only
PLACES = [
    pytest.param("exact", "cpu", ("fp32", "bf16"), id="exact-cpu"),
    pytest.param("exact", "cuda", ("fp32", "bf16"), id="exact-cuda", marks=pytest.mark.gpu),
    pytest.param("fast", "cuda", ("bf16",), id="fast-cuda", marks=pytest.mark.gpu),
]


def logits_every_way(family: str, dtype: str, device: str) -> dict[str, torch.Tensor]:
    """{view: completion logits} on the CPU: generate()'s for five left-padded prompts; the forward's over the same
    sequences called as TRL's trainers call it (input_ids and the mask, no position_ids) and as verl calls it
    (position_ids = the mask's 1s so far - 1, padding 0); each sequence's forward alone (unpadded)."""
    model = M.build(family, VOCAB, dtype, 0, device).eval()
    p = M.prompts(5, VOCAB, 0)
    r = M.generate(model, p, NEW, None, device)
    full = torch.cat([p.mask, torch.ones(p.mask.shape[0], NEW, dtype=p.mask.dtype)], dim=1).to(device)
    pos = (full.cumsum(-1) - 1).clamp(min=0)
    seqs = r.sequences.to(device)
    with torch.no_grad():
        trl = model(input_ids=seqs, attention_mask=full).logits
        verl = model(input_ids=seqs, attention_mask=full, position_ids=pos).logits
        alone = [model(input_ids=seqs[b : b + 1, full[b].bool()]).logits for b in range(len(seqs))]
    views = {"TRL's call": trl, "verl's call": verl, "alone": torch.cat([a[:, -NEW - 1 : -1] for a in alone])}
    views = {k: v if k == "alone" else v[:, -NEW - 1 : -1] for k, v in views.items()}
    return {"generate": r.logits} | {k: v.float().cpu() for k, v in views.items()}


@pytest.mark.parametrize(("tier", "device", "dtypes"), PLACES)
@pytest.mark.parametrize("family", models.ARCHITECTURES)
def test_generate_equals_the_forward_under_the_mode(family: str, tier: str, device: str, dtypes) -> None:
    for dtype in dtypes:
        with rl_kernel.mode(tier):
            views = logits_every_way(family, dtype, device)
            again = logits_every_way(family, dtype, device)
        what = f"{family} {tier} {device} {dtype}"
        for view, logits in views.items():
            assert bits_equal(views["generate"], logits), f"{what} {view}: {diff(views['generate'], logits).summary()}"
            assert bits_equal(again[view], logits), f"{what} {view}: run to run"


@pytest.mark.parametrize("family", models.ARCHITECTURES)
def test_stock_generate_differs_from_its_forward(family: str) -> None:
    """The negative control: the same comparison without the mode finds differing logits (CPU fp32), the trainer's
    call (no position_ids) most of all: its left-padded rows take other rotary positions."""
    views = logits_every_way(family, "fp32", "cpu")
    for view in ("TRL's call", "verl's call"):
        assert not bits_equal(views["generate"], views[view]), f"{family} {view}: stock == generate(): cannot fail"


def test_position_ids_that_differ_from_the_mask_are_refused_and_audited() -> None:
    """Positions that are not the mask's (counted from the first column, as a left-padded batch without the mask's
    positions would be) raise a ModeError naming the fix, and the audit reports the call; the mask's own positions
    and no positions at all are covered."""
    model = models.tiny_model("qwen3", 97, dtype="bf16")
    ids, mask = models.sequences(3, 8, 4, 97, seed=1)
    shifted = torch.arange(ids.shape[1]).expand_as(ids)
    with rl_kernel.mode("exact"), pytest.raises(aten_mode.ModeError, match="cumsum"):
        model(input_ids=ids, attention_mask=mask, position_ids=shifted)
    found = aten_mode.audit(lambda: model(input_ids=ids, attention_mask=mask, position_ids=shifted))
    assert not found.covered and "position_ids differ" in found.summary(), found.summary()
    for given in (None, (mask.cumsum(-1) - 1).clamp(min=0)):
        found = aten_mode.audit(lambda given=given: model(input_ids=ids, attention_mask=mask, position_ids=given))
        assert found.covered, found.summary()
    assert not mode_positions.served(type(model.model)), "the base model's forward is restored after the mode"


@pytest.mark.parametrize("family", models.ARCHITECTURES)
def test_the_audit_finds_the_family_covered(family: str) -> None:
    """A training forward and backward of the family under the mode leaves no batch-variant operator to stock."""
    model = models.tiny_model(family, 97, dtype="bf16")
    ids, mask = models.sequences(3, 8, 4, 97, seed=1)

    def step() -> None:
        logits = model(input_ids=ids, attention_mask=mask).logits
        logits.float().backward(torch.ones(logits.shape))

    found = aten_mode.audit(step)
    assert found.covered, found.summary()
    assert "mm" in found.served, found.served
    assert found.served.keys() & {"rl_kernel::attention", "bmm"}, found.served  # Gemma 2's eager attention: bmm


def _forward(model, ids: torch.Tensor) -> None:
    with torch.no_grad():
        model(input_ids=ids, attention_mask=torch.ones_like(ids))


def test_the_windows_cut_the_tests_sequences() -> None:
    """Mistral, Gemma 2 and Gemma 3 run with a sliding window shorter than the sequences above (prompts up to
    M.MAX_PROMPT tokens and NEW more), so the window cuts keys in prefill and decode; a Mistral forward with the
    window and without it differ (the window is not vacuous)."""
    import transformers

    for family in ("mistral", "gemma2", "gemma3"):
        assert models.tiny_config(family, VOCAB).sliding_window < M.MAX_PROMPT + NEW, family
    model = models.tiny_model("mistral", VOCAB)
    wide = transformers.AutoModelForCausalLM.from_config(models.tiny_config("mistral", VOCAB)).eval()
    wide.load_state_dict(model.state_dict())
    wide.config.sliding_window = None
    ids = torch.randint(1, VOCAB, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), rl_kernel.mode("exact"):
        cut, full = (m(input_ids=ids, attention_mask=torch.ones_like(ids)).logits for m in (model, wide))
    assert bits_equal(cut[:, : models.WINDOW], full[:, : models.WINDOW]) and not bits_equal(cut, full)


@pytest.mark.parametrize(("tier", "device"), [
    pytest.param("exact", "cpu", id="exact-cpu"),
    pytest.param("fast", "cuda", id="fast-cuda", marks=pytest.mark.gpu),  # fast.grouped_mm's one launch
])  # fmt: skip
def test_the_grouped_experts_hold_in_any_batch_order(tier: str, device: str) -> None:
    """Qwen3-MoE at transformers' default experts implementation (the grouped GEMM, which the architecture tests run:
    rl_kernel.models' config leaves it as is) under the mode: the batch in another order routes each expert's tokens
    to other rows of its group, and every sequence's logits keep their bits; every gradient is the same run to run;
    stock's grouped GEMM (the control) gives other logits."""
    import transformers
    from transformers.integrations import moe

    # Both ends of the supported transformers range and torch >= 2.9 have them: their absence is a failure.
    assert hasattr(moe, "grouped_mm_experts_forward") and hasattr(torch, "_grouped_mm"), (
        f"transformers {transformers.__version__} / torch {torch.__version__}: no grouped GEMM experts"
    )
    model = models.tiny_model("qwen3_moe", 97, dtype="bf16").to(device)
    assert model.config._experts_implementation == "grouped_mm", model.config._experts_implementation
    ids, mask = (t.to(device) for t in models.sequences(4, 8, 4, 97, seed=1))
    order = torch.tensor([2, 0, 3, 1], device=device)

    def step(rows: torch.Tensor, mode: bool = True) -> list[torch.Tensor]:
        model.zero_grad()
        with rl_kernel.mode(tier) if mode else contextlib.nullcontext():
            logits = model(input_ids=ids[rows], attention_mask=mask[rows]).logits
            logits.float().square().mean().backward()
        return [logits] + [p.grad.clone() for p in model.parameters()]

    first = step(torch.arange(4, device=device))
    assert bits_equal(step(order)[0], first[0][order]), "a sequence's logits in another batch order"
    assert all(bits_equal(x, y) for x, y in zip(step(torch.arange(4, device=device)), first, strict=True)), "run to run"
    assert not bits_equal(step(torch.arange(4, device=device), mode=False)[0], first[0]), (
        "stock's grouped GEMM must differ here")  # fmt: skip


# ---- a model in plain PyTorch (rl_kernel.models.PlainDecoder: an engine's own classes, no transformers) ----------
def plain_both_ways(dtype: torch.dtype, device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Its greedy loop's logits for five left-padded prompts, its teacher-forced forward's, and each sequence's
    forward alone; on the CPU."""
    model = models.PlainDecoder(VOCAB).to(dtype).to(device).eval()
    ids, mask = (t.to(device) for t in models.sequences(5, 9, 0, VOCAB, seed=3))
    tokens, generated = model.generate(ids, mask, NEW)
    full, full_mask = torch.cat([ids, tokens], 1), torch.cat([mask, torch.ones_like(tokens)], 1)
    with torch.no_grad():
        forward = model(full, full_mask)[:, -NEW - 1 : -1]
        alone = [model(full[b : b + 1, m.bool()], full_mask[b : b + 1, m.bool()]) for b, m in enumerate(full_mask)]
    alone = torch.cat([a[:, -NEW - 1 : -1] for a in alone])
    return generated.float().cpu(), forward.float().cpu(), alone.float().cpu()


@pytest.mark.parametrize(("tier", "device", "dtypes"), PLACES)
def test_a_plain_pytorch_model_under_the_mode(tier: str, device: str, dtypes) -> None:
    for name in dtypes:
        dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[name]
        with rl_kernel.mode(tier):
            generated, forward, alone = plain_both_ways(dtype, device)
            again = plain_both_ways(dtype, device)
        assert bits_equal(generated, forward), f"plain {tier} {device} {name}: {diff(generated, forward).summary()}"
        assert bits_equal(alone, forward), f"plain {tier} {device} {name}: alone vs batch"
        assert all(bits_equal(a, b) for a, b in zip(again, (generated, forward, alone), strict=True)), "run to run"
    if device == "cpu":  # the negative control
        generated, forward, _ = plain_both_ways(torch.float32, "cpu")
        assert not bits_equal(generated, forward), "stock: the plain model's loop == its forward: the check cannot fail"


def test_the_audit_finds_the_plain_model_covered() -> None:
    model = models.PlainDecoder(97).to(torch.bfloat16)
    ids, mask = models.sequences(3, 8, 4, 97, seed=1)

    def step() -> None:
        logits = model(ids, mask)
        logits.float().backward(torch.ones(logits.shape))

    found = aten_mode.audit(step)
    assert found.covered, found.summary()
    assert {"mm", "embedding_dense_backward", "rl_kernel::attention"} <= found.served.keys(), found.served
