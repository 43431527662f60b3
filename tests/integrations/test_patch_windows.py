"""patch() on models with sliding windows that cut keys (issue 54): Mistral (every layer windowed) and Qwen2 / Qwen3
with use_sliding_window (a full layer, then a windowed one), windows of models.WINDOW keys under prompts of up to
MAX_PROMPT tokens and NEW more. generate() with transformers' dynamic cache (its sliding layers keep window - 1 keys),
its static cache and its compiled decode step == the teacher-forced forward seen four ways and called as verl calls
it, bit for bit; the control: a windowed layer that reads a kept-keys cache as if it held every key is caught.
Continuous batching with windows: test_paged.py."""

from __future__ import annotations

import patched_views
import pytest
import torch

from rl_kernel import models
from rl_kernel.integrations import patched

VOCAB, NEW = 211, 12  # NEW: with prompts of 2 .. 8 tokens, every sequence outgrows the window


def mismatches(model, rollout: str, device: str) -> dict[str, str]:
    """generate()'s logits against each forward view's and verl's call: the views that differ (patched_views)."""
    return patched_views.mismatches(model, VOCAB, NEW, rollout, device, longer_than=models.WINDOW + 1)


@pytest.mark.parametrize("rollout", ["eager", "static"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("family", models.WINDOWED)
def test_windowed_generate_equals_every_forward(family: str, dtype: str, rollout: str, device: str) -> None:
    model = models.tiny_windowed_model(family, VOCAB, dtype=dtype, device=device, tier="exact")
    assert not mismatches(model, rollout, device)


def test_windowed_compiled_generate_equals_every_forward() -> None:
    """transformers' compiled decode step over the static cache's sliding layers (rollout "compiled")."""
    assert not mismatches(models.tiny_windowed_model("mistral", VOCAB, tier="exact"), "compiled", "cpu")


def test_a_kept_keys_cache_read_as_a_full_one_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The negative control: slots of the whole sequence used on the sliding cache's suffix of keys."""
    monkeypatch.setattr(patched, "kept_keys", lambda q_pos, k_start, keys: (q_pos, k_start))
    model = models.tiny_windowed_model("mistral", VOCAB, tier="exact")
    for rollout in ("eager", "static"):
        assert mismatches(model, rollout, "cpu"), f"{rollout}: the control must differ from the forward"


@pytest.mark.parametrize("family", models.WINDOWED)
def test_the_patched_window_is_the_models_window(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Which keys a row sees, not bits: the patched fp32 forward is the stock one's within rounding (2e-6 here), and
    the control, the patch without the window (each row sees every earlier key), is far from it."""
    ids, mask = models.sequences(5, 8, NEW, VOCAB, 0)
    seen = mask.bool()

    def distance(model) -> float:
        with torch.no_grad():
            return float((model(input_ids=ids, attention_mask=mask).logits - stock)[seen].abs().max())

    with torch.no_grad():
        stock = models.tiny_windowed_model(family, VOCAB)(input_ids=ids, attention_mask=mask).logits
    model = models.tiny_windowed_model(family, VOCAB, tier="exact")
    assert distance(model) < 1e-4
    monkeypatch.setattr(patched, "window_of", lambda kwargs: 0)
    assert distance(model) > 1e-2, "the control: every earlier key instead of the window"


def test_kept_keys_counts_slots_from_the_first_key_kept() -> None:
    q_pos, k_start = torch.tensor([[9, 10], [9, 10]]), torch.tensor([0, 8])
    assert [t.tolist() for t in patched.kept_keys(q_pos, k_start, 6)] == [[[4, 5], [4, 5]], [0, 3]]
    assert [t.tolist() for t in patched.kept_keys(q_pos, k_start, 11)] == [q_pos.tolist(), k_start.tolist()]
    assert [t.tolist() for t in patched.kept_keys(q_pos, k_start, 64)] == [q_pos.tolist(), k_start.tolist()]


@pytest.mark.gpu
@pytest.mark.parametrize("rollout", ["eager", "static", "compiled"])
@pytest.mark.parametrize("family", models.WINDOWED)
def test_the_fast_tier_windowed_generate_equals_every_forward(family: str, rollout: str) -> None:
    model = models.tiny_windowed_model(family, VOCAB, dtype="bf16", device="cuda", tier="fast")
    assert not mismatches(model, rollout, "cuda")
