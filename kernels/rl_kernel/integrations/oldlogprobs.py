"""Old log-probs without a recompute: when the rollout and the training forward are proven bitwise equal, the
rollout's per-token log-probs are the old log-probs of the PPO/GRPO ratio, and the trainer skips one forward
over the batch per step.

    from rl_kernel.integrations.oldlogprobs import old_logprobs
    old = old_logprobs(rollout_logprobs, lambda: trainer_logprobs(model, batch),       # the usual recompute
                       proven=cell_passed,          # a passing rlparity cell's verdict; None: check once here
                       check_every=100,             # and recompute anyway every 100th call, to keep checking
                       model=model, input_ids=ids, attention_mask=mask, new_tokens=n)      # to name a module

- proven=True: the rollout's log-probs are returned and recompute is never called (except every check_every-th
  call: a spot check).
- proven=None: the first call runs recompute() once and compares the two on integer views; the verdict is cached
  (per model, or per OldLogprobs object) and later calls follow it.
- proven=False, or a check that found different bits: recompute() is returned, with a RolloutMismatchWarning that
  says how many tokens differ and, when model, input_ids, attention_mask and new_tokens are given, the first
  module where the rollout and training paths part (rl_kernel.locate, run once per verdict).

Never a tolerance: equal means the same bits (rl_kernel.bitwise).
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

from rl_kernel import bitwise


class RolloutMismatchWarning(UserWarning):
    """The rollout's log-probs are not the training forward's bits: the old log-probs are recomputed."""


class OldLogprobs:
    """The verdict and the counters behind old_logprobs(): one per model (old_logprobs keeps it on the model) or
    one of your own. `verdict` is None until proven or checked; `recomputes` counts the calls of recompute."""

    def __init__(self, proven: bool | None = None, check_every: int = 0, model: torch.nn.Module | None = None) -> None:
        if check_every < 0:
            raise ValueError(f"rl_kernel: check_every must be >= 0, got {check_every}")
        self.verdict: bool | None = proven
        self.proven = proven  # the last proven flag given (a later spot check may still overturn it)
        self.check_every = check_every
        self.model = model
        self.calls = 0
        self.recomputes = 0
        self.message: str | None = None  # the warning of the last mismatch (the locator runs once per verdict)

    def __call__(
        self,
        rollout_logprobs: torch.Tensor,
        recompute: Callable[[], torch.Tensor],
        *,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        new_tokens: int | None = None,
    ) -> torch.Tensor:
        self.calls += 1
        spot = self.check_every > 0 and self.calls % self.check_every == 0
        if self.verdict is True and not spot:
            return rollout_logprobs
        recomputed = recompute()
        self.recomputes += 1
        if self.verdict is False:
            self._warn(rollout_logprobs, recomputed, input_ids, attention_mask, new_tokens)
            return recomputed
        if bitwise.bits_equal(rollout_logprobs, recomputed):
            self.verdict = True
            return rollout_logprobs
        self.verdict, self.message = False, None
        self._warn(rollout_logprobs, recomputed, input_ids, attention_mask, new_tokens)
        return recomputed

    def _warn(self, rollout: torch.Tensor, recomputed: torch.Tensor, input_ids, attention_mask, new_tokens) -> None:
        if self.message is None:
            self.message = mismatch_message(rollout, recomputed, self.model, input_ids, attention_mask, new_tokens)
        warnings.warn(self.message, RolloutMismatchWarning, stacklevel=3)


def mismatch_message(
    rollout: torch.Tensor,
    recomputed: torch.Tensor,
    model: torch.nn.Module | None = None,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    new_tokens: int | None = None,
) -> str:
    """What differs between the rollout's and the recomputed log-probs, and where the model's paths part."""
    if rollout.shape != recomputed.shape or rollout.dtype != recomputed.dtype:
        what = f"shapes/dtypes differ: {tuple(rollout.shape)} {rollout.dtype} vs {tuple(recomputed.shape)} "
        what += str(recomputed.dtype)
    else:
        d = bitwise.diff(rollout, recomputed)
        what = f"{d.count}/{d.total} tokens differ, max |dlogp| {d.max_abs:.3e}, max {d.max_ulp} ulp"
    text = f"rl_kernel: the rollout's log-probs are not the training forward's ({what}); recomputing the old log-probs"
    if model is None or input_ids is None or new_tokens is None:
        return text + "; pass model, input_ids, attention_mask and new_tokens to name the first divergent module"
    from rl_kernel.locator import locate

    try:
        report = locate(model, input_ids, attention_mask, new_tokens, scored=True)  # the positions that score tokens
    except (TypeError, ValueError, RuntimeError) as exc:
        return f"{text}; the locator could not run: {exc}"
    first = report.first
    if first is None:
        return f"{text}; the model's rollout and training paths agree on every module (the difference is outside it)"
    return (
        f"{text}; first divergent module: {first.name} ({first.count}/{first.total} elements differ, "
        f"max |a-b| {first.max_abs:.3e}, max {first.max_ulp} ulp)"
    )


_DEFAULT = OldLogprobs()  # the state of calls without a model
_STATES: weakref.WeakKeyDictionary[Any, OldLogprobs] = weakref.WeakKeyDictionary()


def state_for(model: torch.nn.Module | None) -> OldLogprobs:
    """The cached verdict and counters of old_logprobs() calls that pass this model (or none)."""
    if model is None:
        return _DEFAULT
    if model not in _STATES:
        _STATES[model] = OldLogprobs(model=model)
    return _STATES[model]


def reset(model: torch.nn.Module | None = None) -> None:
    """Forget the cached verdict (after the weights' dtype, the device, the kernels or the stack changed)."""
    global _DEFAULT
    if model is None:
        _DEFAULT = OldLogprobs()
    else:
        _STATES.pop(model, None)


def old_logprobs(
    rollout_logprobs: torch.Tensor,
    recompute: Callable[[], torch.Tensor],
    *,
    proven: bool | None = None,
    check_every: int = 0,
    model: torch.nn.Module | None = None,
    input_ids: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    new_tokens: int | None = None,
    state: OldLogprobs | None = None,
) -> torch.Tensor:
    """The old log-probs: rollout_logprobs when the two paths are proven bitwise equal (proven=True, or a cached
    verdict, or a one-off check that calls recompute once), else recompute() with a RolloutMismatchWarning naming
    the first divergent module when model and inputs are given. The verdict is kept in `state` (default: one per
    model, state_for(model)); proven sets it when it changes (a spot check that fails is not undone by passing
    proven=True again)."""
    st = state if state is not None else state_for(model)
    if proven is not None and proven is not st.proven:  # a new flag sets the verdict; the same one again does not
        st.proven, st.verdict, st.message = proven, proven, None
    if check_every < 0:
        raise ValueError(f"rl_kernel: check_every must be >= 0, got {check_every}")
    st.check_every = check_every or st.check_every
    if model is not None:
        st.model = model
    return st(rollout_logprobs, recompute, input_ids=input_ids, attention_mask=attention_mask, new_tokens=new_tokens)


__all__ = ["OldLogprobs", "RolloutMismatchWarning", "mismatch_message", "old_logprobs", "reset", "state_for"]
