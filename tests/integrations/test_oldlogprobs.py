"""rl_kernel.integrations.oldlogprobs on the CPU: proven paths never recompute; an unproven one is checked once and
the verdict cached; check_every spot-checks; a differing check recomputes, and the warning names the first
divergent module of a patched tiny Qwen3 whose layer 3 down_proj was made decode-variant (the rollout's real
log-probs from a prefill and decode steps over the cache against the teacher-forced forward's)."""

from __future__ import annotations

import inspect
import types

import pytest
import torch

import rl_kernel
from rl_kernel.bitwise import bits_equal
from rl_kernel.integrations.oldlogprobs import OldLogprobs, RolloutMismatchWarning, old_logprobs, reset, state_for
from rl_kernel.models import sequences, tiny_model

VOCAB, PROMPT, NEW = 97, 6, 4


class Counted:
    """A recompute that counts its calls and returns fixed log-probs."""

    def __init__(self, value: torch.Tensor) -> None:
        self.value, self.calls = value, 0

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        return self.value.clone()


def logprobs(seed: int = 0) -> torch.Tensor:
    return -torch.rand(3, NEW, generator=torch.Generator().manual_seed(seed))


def test_proven_paths_never_recompute():
    rollout = logprobs()
    recompute = Counted(rollout + 1)  # different bits: returning them would show
    state = OldLogprobs()
    outs = [old_logprobs(rollout, recompute, proven=True, state=state) for _ in range(5)]
    assert recompute.calls == 0 and state.recomputes == 0
    assert all(out is rollout for out in outs)


def test_an_unproven_run_checks_once_and_caches_the_verdict():
    rollout = logprobs()
    recompute = Counted(rollout)
    model = torch.nn.Linear(2, 2)  # the verdict is kept per model
    reset(model)
    outs = [old_logprobs(rollout, recompute, model=model) for _ in range(4)]
    assert recompute.calls == 1 and state_for(model).verdict is True
    assert all(bits_equal(out, rollout) for out in outs)


def test_check_every_spot_checks_and_a_failed_spot_check_sticks():
    rollout = logprobs()
    recompute = Counted(rollout)
    state = OldLogprobs()
    for _ in range(6):
        old_logprobs(rollout, recompute, proven=True, check_every=3, state=state)
    assert recompute.calls == 2  # calls 3 and 6
    other = Counted(rollout.nextafter(torch.zeros_like(rollout)))  # one ulp off: caught on integer views
    with pytest.warns(RolloutMismatchWarning, match="12/12 tokens differ"):
        for _ in range(3):
            out = old_logprobs(rollout, other, proven=True, check_every=3, state=state)
    assert state.verdict is False and bits_equal(out, other.value)
    with pytest.warns(RolloutMismatchWarning):
        old_logprobs(rollout, other, proven=True, check_every=3, state=state)  # proven=True again does not undo it
    assert other.calls == 2


def test_check_every_is_kept_by_the_state_until_given_again():
    """A call that leaves check_every out keeps the period an earlier call set (the trainer passes it once)."""
    rollout = logprobs()
    recompute = Counted(rollout)
    state = OldLogprobs()
    old_logprobs(rollout, recompute, proven=True, check_every=2, state=state)
    for _ in range(3):
        old_logprobs(rollout, recompute, state=state)
    assert recompute.calls == 2 and state.check_every == 2  # calls 2 and 4


def nudge_in_decode(module: torch.nn.Module) -> None:
    forward = module.forward

    def nudged(self, x):
        out = forward(x)
        return torch.nextafter(out, torch.full_like(out, float("inf"))) if x.shape[1] == 1 else out

    module.forward = types.MethodType(nudged, module)


def rollout_logprobs(model, ids: torch.Tensor, mask: torch.Tensor, new: int) -> torch.Tensor:
    """The completion's log-probs as a rollout makes them: the prompt's prefill scores the first token, each
    decode step over the cache the next."""
    prompt = ids.shape[1] - new
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"  # transformers 5.2x
    with torch.no_grad():
        out = model(input_ids=ids[:, :prompt], attention_mask=mask[:, :prompt], position_ids=pos[:, :prompt],
                    use_cache=True)  # fmt: skip
        logits = [out.logits[:, -1]]
        for t in range(prompt, ids.shape[1] - 1):
            out = model(input_ids=ids[:, t : t + 1], attention_mask=mask[:, : t + 1], position_ids=pos[:, t : t + 1],
                        use_cache=True, **{key: getattr(out, key)})  # fmt: skip
            logits.append(out.logits[:, -1])
    return rl_kernel.token_logprobs(torch.stack(logits, 1), ids[:, prompt:])


def training_logprobs(model, ids: torch.Tensor, mask: torch.Tensor, new: int) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask).logits
    return rl_kernel.token_logprobs(logits[:, -new - 1 : -1], ids[:, -new:])


def test_a_differing_check_recomputes_and_the_warning_names_the_module():
    pytest.importorskip("transformers")
    model = tiny_model("qwen3", VOCAB, layers=4, hidden=32, heads=4, tier="exact")
    ids, mask = sequences(3, PROMPT, NEW, VOCAB, seed=2)
    # the control: patched, the rollout's log-probs are the forward's, so no recompute after the check
    clean = OldLogprobs(model=model)
    recompute = Counted(training_logprobs(model, ids, mask, NEW))
    for _ in range(3):
        old_logprobs(rollout_logprobs(model, ids, mask, NEW), recompute, state=clean)
    assert recompute.calls == 1 and clean.verdict is True
    # layer 3's down_proj one ulp up in decode steps only
    nudge_in_decode(model.model.layers[3].mlp.down_proj)
    rollout = rollout_logprobs(model, ids, mask, NEW)
    recompute = Counted(training_logprobs(model, ids, mask, NEW))
    assert not bits_equal(rollout, recompute.value)
    state = OldLogprobs()
    kw = dict(model=model, input_ids=ids, attention_mask=mask, new_tokens=NEW, state=state)
    with pytest.warns(RolloutMismatchWarning, match=r"first divergent module: model\.layers\.3\.mlp\.down_proj"):
        outs = [old_logprobs(rollout, recompute, **kw) for _ in range(3)]
    assert recompute.calls == 3 and state.verdict is False
    assert all(bits_equal(out, recompute.value) for out in outs)
