"""What a patched Hugging Face model's pieces share (integrations.transformers patches the model; .paged serves
its continuous batching): the mark patch() leaves on the model and what it says (is_patched, tier_of, layers_of), and
the attention function registered with transformers, over the tier's attention, fed the positions the patched
forward derives. A module of its own so that the two above import it, and not each other."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from rl_kernel import tiers

_STATE = "_rl_kernel_patch"  # the attribute patch() sets on a model: its tier and what it replaced


def check_no_dropout(dropout: float) -> None:
    """The tier's attention has no dropout (it would draw from torch's generator): a clear error for one."""
    if dropout:
        raise ValueError(f"rl_kernel: rl_kernel's attention has no dropout (got {dropout}); set attention_dropout=0")


def tier_attention(
    layers: Any,
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature over a tier's attention (`layers`, bound by patch). The query
    rows' slots and each sequence's first valid key (rl_q_pos, rl_k_start) come from the patched model's
    forward; a windowed layer's module passes its window (sliding_window), one with attention sinks its sinks
    (s_aux, as GPT-OSS's attention does)."""
    q_pos, k_start = kwargs.get("rl_q_pos"), kwargs.get("rl_k_start")
    if q_pos is None or k_start is None:
        raise RuntimeError(
            "rl_kernel: the rl_kernel attention needs the positions its patched model's forward derives; "
            "call the model patched by rl_kernel.integrations.transformers.patch (not a sub-module alone)"
        )
    check_no_dropout(dropout)
    window = window_of(kwargs)
    if window:
        q_pos, k_start = kept_keys(q_pos, k_start, key.shape[2])
    out = layers.attention(query.contiguous(), key.contiguous(), value.contiguous(), q_pos, k_start, scaling,
                           validate=False, window=window, sinks=kwargs.get("s_aux"))  # fmt: skip
    return out.transpose(1, 2).contiguous(), None


def window_of(kwargs: dict[str, Any]) -> int:
    """The layer's sliding window in keys (transformers' attention modules pass sliding_window; None or absent on a
    full-attention layer): 0 for none."""
    window = kwargs.get("sliding_window")
    return int(window) if window else 0


def kept_keys(q_pos: torch.Tensor, k_start: torch.Tensor, keys: int) -> tuple[torch.Tensor, torch.Tensor]:
    """q_pos [B, T] and k_start [B], slots of the whole sequence so far (the mask's), as slots of the `keys` a
    windowed layer's cache hands attention: transformers' sliding-window layers (dynamic and static) keep only the
    latest keys and hand over a suffix of the sequence, at least the window of every query row; a cache that keeps
    every key (or more slots than tokens) drops none. Counted from the row's first key, a row's tiles and so its
    bits are the same either way (docs/numerics.md, attention). Tensor arithmetic only: no host sync."""
    dropped = (q_pos[:, -1:] + 1 - keys).clamp(min=0)  # the tokens so far (the last row's slot + 1) past those kept
    return q_pos - dropped, (k_start - dropped[:, 0]).clamp(min=0)


def is_patched(model: nn.Module) -> bool:
    return hasattr(model, _STATE)


def layers_of(model: nn.Module) -> Any:
    """The operators of the tier a patched model runs in (the namespace patch() resolved)."""
    state = getattr(model, _STATE, None)
    if state is None:
        raise ValueError("rl_kernel: this model is not patched")
    return state["layers"]


def tier_of(model: nn.Module) -> str | None:
    """The name of the tier a patched model runs in (None when it is not patched)."""
    desc = descriptor_of(model)
    return None if desc is None else desc.name


def descriptor_of(model: nn.Module) -> tiers.Tier | None:
    """The tier a patched model runs in, as patch() resolved it (None when it is not patched)."""
    state = getattr(model, _STATE, None)
    return state["tier"] if state else None
