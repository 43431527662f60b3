"""The mode's positions: a Hugging Face base model's forward called without position_ids takes generate()'s, those of
its attention mask, for as long as rl_kernel.mode is on; given ones that differ from them are refused by name.

Why: generate() derives each token's position from the 2-d attention mask (1s so far - 1: a left-padded prompt starts
at 0), and a forward called without position_ids, as TRL's trainers score a rollout, counts from the first column
(the left padding shifts every real token's rotary position by the pad count). The two then differ in every
left-padded row, in every tier, though every operator is served (TRL issues 6800 and 6819: a 34-nat sequence
log-prob gap). patch() derives positions from the mask; this does the same under the mode, for code that knows
nothing of rl_kernel. A caller's own position_ids are checked against the mask's on real tokens (padding's never
reach a real token): where they differ (packed sequences, shifted positions) generate() would not have computed that
forward, so the call raises ModeError naming the fix, or, inside aten_mode.audit, is recorded as an uncovered call.

Which classes: transformers' PreTrainedModel subclasses named `...Model` (the base model under a `...ForCausalLM`)
whose forward takes input_ids, attention_mask and position_ids. A call with a mask that is not 2-d (generate()'s 4-d
masks for a static cache), or with no mask, is the class's own.
"""

from __future__ import annotations

import functools
import inspect
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch

from rl_kernel._validate import compiling
from rl_kernel.aten.ops import ModeError

PARAMETERS = ("input_ids", "attention_mask", "position_ids")
FIX = ("pass the attention mask alone (the mode derives the positions generate() takes) or position_ids = "
       "attention_mask.cumsum(-1) - 1")  # fmt: skip
_ORIGINAL: dict[type, Callable] = {}  # served class -> its own forward, while a mode is on
RECORDING: list[Counter] = []  # the audits running now: a differing call is counted there instead of raised


def is_base_model(cls: type) -> bool:
    """A transformers base model class that defines a forward taking input_ids, attention_mask and position_ids."""
    forward = cls.__dict__.get("forward")
    if forward is None or not cls.__name__.endswith("Model") or not _is_pretrained(cls):
        return False
    try:
        names = inspect.signature(forward).parameters
    except (TypeError, ValueError):
        return False
    return all(p in names for p in PARAMETERS)


def _is_pretrained(cls: type) -> bool:
    return any(
        base.__name__ == "PreTrainedModel" and base.__module__.startswith("transformers") for base in cls.__mro__
    )


def mask_positions(attention_mask: torch.Tensor, new: int) -> torch.Tensor:
    """generate()'s position ids of the last `new` tokens of a [B, past + new] mask: 1s so far - 1, padding 0."""
    mask = attention_mask.long()
    return (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)[:, -new:]


def differ(given: torch.Tensor, attention_mask: torch.Tensor, new: int) -> bool:
    """Whether given position ids differ from the mask's on a real token (a host sync)."""
    want = mask_positions(attention_mask, new)
    real = attention_mask[:, -new:] != 0
    return bool(((given.to(want.device).expand_as(want) != want) & real).any())


def _served_forward(original: Callable) -> Callable:
    names = list(inspect.signature(original).parameters)[1:]  # after self

    @functools.wraps(original)
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        bound = dict(zip(names, args, strict=False)) | kwargs
        mask = bound.get("attention_mask")
        ref = bound.get("input_ids") if bound.get("input_ids") is not None else bound.get("inputs_embeds")
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2 or ref is None or ref.dim() < 2:
            return original(self, *args, **kwargs)
        given, new = bound.get("position_ids"), ref.shape[1]
        if given is None:
            args, kwargs = _with_positions(names, args, kwargs, mask_positions(mask, new))
            return original(self, *args, **kwargs)
        if not compiling() and differ(given, mask, new):
            if RECORDING:
                RECORDING[-1][f"{type(self).__name__}.forward: position_ids differ from the attention mask's"] += 1
            else:
                raise ModeError(f"rl_kernel.mode: {type(self).__name__}.forward got position_ids that differ from "
                                f"its attention mask's on real tokens (generate() takes those): {FIX}")  # fmt: skip
        return original(self, *args, **kwargs)

    forward._rl_kernel_mode_positions = True  # what tests read: served
    return forward


def _with_positions(names: list[str], args: tuple, kwargs: dict, positions: torch.Tensor) -> tuple:
    """The call's (positional, keyword) arguments with position_ids set, where the caller had it (None) or by name."""
    at = names.index("position_ids")
    if len(args) > at:
        return (*args[:at], positions, *args[at + 1 :]), kwargs
    return args, kwargs | {"position_ids": positions}


def serve_class(cls: type) -> None:
    """Serve cls's forward (a base model's) for as long as the mode is on."""
    if cls in _ORIGINAL or not is_base_model(cls):
        return
    _ORIGINAL[cls] = cls.__dict__["forward"]
    cls.forward = _served_forward(_ORIGINAL[cls])


def served(cls: type) -> bool:
    """Whether the mode serves this class's forward now."""
    return bool(getattr(cls.__dict__.get("forward"), "_rl_kernel_mode_positions", False))


def restore() -> None:
    """Every served class's own forward back."""
    for cls, forward in _ORIGINAL.items():
        cls.forward = forward
    _ORIGINAL.clear()
