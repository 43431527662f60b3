"""generate() as users run it on a patched model (rl_kernel.integrations.transformers): the masks the patched forward
reads (none, the 2-d mask, generate()'s 4-d ones, a static cache's slot mask) and the positions it derives from them,
the static cache (its slots; its running length kept a tensor: no host sync, one graph for every decode step),
transformers' compiled decode step with inductor's exact options, and the rollout modes the benchmarks and the
harness's model workload name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import transformers
from torch import nn

from rl_kernel.exact.decoder.ops import positions_and_flag


# ---- what the patched forward reads: positions from the mask -----------------------------------------------------
def positions(
    attention_mask: torch.Tensor, past: int | torch.Tensor, new: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(position_ids [B, new], q_pos [B, new], k_start [B], bad) of the `new` tokens after `past` ones (an int, or
    a 0-d tensor: a static cache's running length, no host sync) of a [B, slots] mask with one run of 1s per row
    (slots >= past + new; a static cache's mask is zero past its tokens): position = 1s so far - 1 (0 on
    padding), q_pos = the token's slot, k_start = the row's first 1; bad, unread (no host sync here): whether a
    row has other than one run (positions_and_flag)."""
    _, k_start, bad = positions_and_flag(attention_mask)
    b = attention_mask.shape[0]
    q_pos = (torch.arange(new, device=attention_mask.device) + past).expand(b, new).contiguous()
    pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0).gather(1, q_pos)
    return pos, q_pos, k_start, bad


def key_mask(
    mask: Any, b: int, t: int, cache: Any, device: torch.device, cache_position: torch.Tensor | None = None
) -> tuple[torch.Tensor, int | torch.Tensor]:
    """(the 2-d key mask [b, past + t]: 1 token, 0 padding; past, the cache's tokens) of the attention mask a
    caller passes: none (every key), the 2-d mask, or what generate() builds for a static cache, a 4-d mask [b, 1,
    t, slots] (boolean, or additive 0 / -inf) or a dict of them by layer type. A 4-d mask's last query row names the
    keys the newest token sees, its own slot last: its sequence's tokens so far."""
    if isinstance(mask, dict):
        if not mask:
            raise ValueError("rl_kernel: the patched model got an empty dict of attention masks")
        mask = mask.get("full_attention", next(iter(mask.values())))
    if mask is not None and mask.dim() == 4:
        if mask.shape[0] != b or mask.shape[2] != t:
            raise ValueError(f"rl_kernel: a 4-d attention_mask must be [{b}, 1, {t}, slots], got {tuple(mask.shape)}")
        seen = (mask if mask.dtype == torch.bool else mask == 0)[:, 0, -1]
        slots = torch.arange(seen.shape[-1], device=seen.device)
        last = torch.where(seen, slots, -1).amax(-1)
        if bool((last != last[0]).any() or last[0] < t - 1):
            raise ValueError(
                "rl_kernel: a 4-d attention_mask whose newest token does not see its own slot in every row (right "
                "padding, or a packed mask): pass the 2-d mask"
            )
        past = int(last[0]) + 1 - t
        return seen[:, : past + t].long(), past
    slots = static_slots(cache)
    if slots and mask is not None and mask.dim() == 2 and mask.shape[0] == b and t <= mask.shape[1] <= slots:
        # A static cache (compiled decode): its running length stays a tensor, the mask is padded to every slot.
        return _to_slots(mask, slots), _static_length(cache, cache_position)
    past = int(cache.get_seq_length()) if cache is not None else 0
    if mask is None:
        return torch.ones(b, past + t, dtype=torch.long, device=device), past
    if mask.dim() != 2 or tuple(mask.shape) != (b, past + t):
        raise ValueError(
            f"rl_kernel: the patched model takes a 2-d attention_mask [batch, cache + new] = [{b}, {past + t}] "
            f"(1 = token, 0 = padding, one run of 1s per row) or generate()'s 4-d one, got {tuple(mask.shape)}"
        )
    return mask, past


def static_slots(cache: Any) -> int:
    """A static cache's slot count (every layer's max_cache_len, full attention), 0 for any other cache."""
    layers = getattr(cache, "layers", None)
    if not layers or not getattr(cache, "is_compileable", False) or type(layers[0]).__name__ != "StaticLayer":
        return 0
    # Compared, not hashed into a set: under torch.compile a set of the lengths specializes the graph on their value
    # (a recompile for every new prompt + completion length), a comparison only guards that they are equal.
    slots = getattr(layers[0], "max_cache_len", None)
    same = slots is not None and all(getattr(layer, "max_cache_len", None) == slots for layer in layers[1:])
    return slots if same else 0


def _static_length(cache: Any, cache_position: torch.Tensor | None) -> torch.Tensor:
    """The tokens a static cache holds before this forward, as a 0-d tensor: transformers >= 5.x keeps it in each
    layer (cumulative_length), older 5.x passes cache_position; int(get_seq_length()) would be a host sync."""
    length = getattr(cache.layers[0], "cumulative_length", None)
    if isinstance(length, torch.Tensor):
        return length
    if cache_position is None:
        raise ValueError("rl_kernel: a static cache without cumulative_length needs the forward's cache_position")
    return cache_position[0]


# ---- generate()'s modes: the static cache and the compiled decode step -----------------------------------
ROLLOUT_MODES = ("eager", "static", "compiled")


def rollout_kwargs(mode: str, device: torch.device | str) -> dict[str, Any]:
    """generate()'s arguments for a rollout mode: eager (the dynamic cache), static (cache_implementation="static",
    not compiled) or compiled (the static cache and transformers' compiled decode step, with exact_compile_options
    on a patched model; on a CPU, where transformers compiles only when asked, its CompileConfig asks)."""
    if mode == "eager":
        return {}
    if mode == "static":
        return {"cache_implementation": "static", "disable_compile": True}
    if mode == "compiled":
        if torch.device(device).type != "cpu":
            return {"cache_implementation": "static"}
        config = transformers.CompileConfig()
        config._compile_all_devices = True
        return {"cache_implementation": "static", "compile_config": config}
    raise ValueError(f"rl_kernel: unknown rollout mode {mode!r} (modes: {', '.join(ROLLOUT_MODES)})")


def exact_compile_options(backend: Any, mode: str | None, options: dict | None) -> tuple[str | None, dict | None]:
    """torch.compile's (mode, options) for a patched model's forward: inductor fuses the elementwise ops the tier
    leaves to PyTorch (residual adds, the rotary multiply-adds, casts) and by default keeps their bf16/fp16
    intermediates in fp32 and contracts a*b+c into an fma, where eager rounds each op: other bits than the
    training forward's. emulate_precision_casts rounds each op as eager does (and turns fma contraction off in
    the Triton it writes); the mode's options (reduce-overhead: CUDA graphs) are kept, as options, since
    torch.compile takes a mode or options, not both. Other backends (aot_eager, eager) do not fuse: unchanged."""
    if backend != "inductor":
        return mode, options
    from torch._inductor import list_mode_options

    merged = {**(list_mode_options(mode) if mode else {}), **(options or {}), "emulate_precision_casts": True}
    return None, merged


def compiled_call(model: nn.Module, compile_config: Any = None) -> Callable:
    """generate()'s compiled decode step (a static cache on CUDA, or any device with compile_config's
    _compile_all_devices) for a patched model: the caller's CompileConfig, or the model's, with
    exact_compile_options applied; compiled once per config, like transformers' own get_compiled_call."""
    config = compile_config or getattr(model.generation_config, "compile_config", None) or transformers.CompileConfig()
    kwargs = config.to_dict()
    kwargs["mode"], kwargs["options"] = exact_compile_options(kwargs["backend"], kwargs["mode"], kwargs["options"])
    key = repr(sorted(kwargs.items(), key=lambda kv: kv[0]))
    kept = model.__dict__.get("_rl_compiled")
    if kept is None or kept[0] != key:
        kept = (key, torch.compile(model.__call__, **kwargs))
        model.__dict__["_rl_compiled"] = kept
    return kept[1]


def slot_mask(*, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor | None:
    """A patched model's create_masks_for_generate: generate()'s 2-d mask as it is, padded to a static cache's slots
    (one shape for every decode step)."""
    slots = static_slots(kwargs.get("cache", kwargs.get("past_key_values")))
    if attention_mask is None or not slots or attention_mask.shape[1] >= slots:
        return attention_mask
    return _to_slots(attention_mask, slots)


def _to_slots(mask: torch.Tensor, slots: int) -> torch.Tensor:
    """A [b, past + t] mask zero-padded to a static cache's [b, slots] (slots past its tokens hold no key)."""
    return torch.nn.functional.pad(mask, (0, slots - mask.shape[1]))
