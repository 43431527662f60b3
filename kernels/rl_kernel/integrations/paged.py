"""transformers' continuous batching (`generate_batch`, paged KV cache) on a patched model, bit for bit.

    model = patch(model, tier="exact")
    outputs = model.generate_batch(prompts, max_new_tokens=64)   # {request id: GenerationOutput}: this module's

transformers' engine packs the requests of a step into one row (`cu_seq_lens_q` / `cu_seq_lens_k` mark where each
request's query tokens and keys start), reads each request's past keys from its pages and chunks long prefills. It
runs only attention implementations it knows (`paged|eager`, `sdpa`, flash), so for the duration of the call the
patched model runs under the name "sdpa", and the "sdpa" entry of transformers' attention registry serves the modules
of that model by the tier's attention (any other model keeps transformers' SDPA):

- each request's queries and keys are gathered into a row of a [requests, heads, longest, head_dim] batch, its keys
  from the first (k_start = 0), its query t at key slot (keys - queries + t): the slots and the first key a
  teacher-forced forward of that request alone gives its rows;
- the tier's attention does not depend on the batch, the number of query rows, the other rows or what lies past a
  row's last key, so each request's rows have the bits of that forward, whatever else is in the step, the pages
  they were read from, the order requests arrived in or how their prefill was chunked; its position ids are the
  engine's (past length + t, the same as the forward's).

- a windowed layer (Mistral; Qwen2 / Qwen3 with use_sliding_window) gets its window (the module's sliding_window) and
  the engine's sliding cache: the request's latest keys (at most window - 1 cached), then its new ones. Each query
  sees the last `window` keys up to its slot, the same keys as in the forward, its tiles counted from the first.

Refused by name: the block-table (flash) decode path, a flash implementation the engine would switch to (the call
sets `auto_switch_to_flash=False`), transformers older than the engine this was written for.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
import transformers
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from rl_kernel.integrations import patched

ENGINE = "sdpa"  # the name continuous batching accepts and the patched model runs under during the call
MIN_TRANSFORMERS = (5, 25)  # the engine's kwargs (cu_seq_lens_q, max_length_k, read/write indices) as read here
_MARK = "_rl_paged_layers"  # on a patched model's attention modules while its continuous batching runs


def _version() -> tuple[int, int]:
    parts = transformers.__version__.split(".")[:2]
    major, minor = (int("".join(c for c in part if c.isdigit()) or 0) for part in parts)
    return major, minor


def served() -> bool:
    """Whether this transformers' continuous batching is one this module serves (MIN_TRANSFORMERS and later)."""
    return _version() >= MIN_TRANSFORMERS


UNSERVED = f"continuous batching as served needs transformers >= {'.'.join(map(str, MIN_TRANSFORMERS))}"


def paged_attention(
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
    """transformers' attention signature over the tier's attention for one packed continuous-batching step: query [1,
    Hq, total queries, D], key / value [1, Hkv, total keys, D] (each request's cached keys, then its new ones),
    cu_seq_lens_q / cu_seq_lens_k and max_length_q / max_length_k in kwargs. Returns [1, total queries, Hq, D]."""
    if kwargs.get("block_table") is not None:
        raise ValueError("rl_kernel: continuous batching's block-table (flash) decode path is not served; run the "
                         f"engine under {ENGINE!r}")  # fmt: skip
    patched.check_no_dropout(dropout)
    cu_q, cu_k = kwargs["cu_seq_lens_q"].long(), kwargs["cu_seq_lens_k"].long()
    longest_q, longest_k = int(kwargs["max_length_q"]), int(kwargs["max_length_k"])
    q_pad, slots, valid = _by_request(query[0], cu_q, longest_q)  # valid: a slot that holds a query
    k_pad, _, _ = _by_request(key[0], cu_k, longest_k)
    v_pad, _, _ = _by_request(value[0], cu_k, longest_k)
    lens_q, lens_k = (cu_q[1:] - cu_q[:-1])[:, None], (cu_k[1:] - cu_k[:-1])[:, None]
    # query t of a request sees its keys 0 .. keys - queries + t; a padding row (t >= its queries) sees none (+0).
    q_pos = torch.where(valid, lens_k - lens_q + slots, -1)
    k_start = torch.zeros(q_pos.shape[0], dtype=torch.int64, device=query.device)
    # A windowed layer's keys are its sliding cache's (the request's latest keys, then its new ones): the window
    # counted back from each query's slot cuts the same keys as in the forward, and the row's tiles start there.
    window = patched.window_of(kwargs)
    out = layers.attention(q_pad, k_pad, v_pad, q_pos, k_start, scaling, validate=False, window=window,
                           sinks=kwargs.get("s_aux"))  # fmt: skip
    return _packed(out, cu_q, query.shape[2]).unsqueeze(0), None


def _packed(out: torch.Tensor, cu: torch.Tensor, total: int) -> torch.Tensor:
    """[requests, H, longest, D] -> the packed rows [total, H, D]: row p is request r's slot p - cu[r] where cu[r] <=
    p < cu[r + 1]; rows past the last request (a step padded for CUDA graphs) are +0. Gathers only: no host sync,
    no shape that depends on the values (capturable in a graph)."""
    if out.shape[0] == 0:
        return out.new_zeros(total, out.shape[1], out.shape[3])
    p = torch.arange(total, device=out.device)
    r = torch.searchsorted(cu[1:].contiguous(), p, right=True)
    inside = r < out.shape[0]
    r = r.clamp(max=out.shape[0] - 1)
    slot = (p - cu[r]).clamp(min=0, max=out.shape[2] - 1)
    return torch.where(inside[:, None, None], out[r, :, slot], 0)


def _by_request(x: torch.Tensor, cu: torch.Tensor, longest: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed x [H, total, D] -> [requests, H, longest, D] (request r's tokens cu[r] .. cu[r + 1] - 1 first, then
    copies of a valid token as padding), the slot index [requests, longest] and which slots hold a token."""
    slots = torch.arange(max(longest, 1), device=x.device).expand(cu.numel() - 1, -1)
    valid = slots < (cu[1:] - cu[:-1])[:, None]
    index = (cu[:-1, None] + slots).clamp(max=max(x.shape[1] - 1, 0))
    return x[:, index].permute(1, 0, 2, 3).contiguous(), slots, valid


def _dispatch(original: Any) -> Any:
    """The "sdpa" entry while a patched model's continuous batching runs: its marked modules by the tier's paged
    attention (or its plain attention outside a packed step), every other module by transformers' own."""

    def attention(module: nn.Module, query, key, value, attention_mask, *args: Any, **kwargs: Any):
        layers = getattr(module, _MARK, None)
        if layers is None:
            return original(module, query, key, value, attention_mask, *args, **kwargs)
        if "cu_seq_lens_q" in kwargs and "cu_seq_lens_k" in kwargs:
            return paged_attention(layers, module, query, key, value, attention_mask, *args, **kwargs)
        return patched.tier_attention(layers, module, query, key, value, attention_mask, *args, **kwargs)

    return attention


@contextlib.contextmanager
def continuous_batching(model: nn.Module) -> Iterator[nn.Module]:
    """For the block, a patched model runs transformers' continuous batching (`model.generate_batch`, its manager) with
    the tier's attention: the model under the engine's name "sdpa", whose registry entry serves this model's attention
    modules by paged_attention. Everything is restored on exit."""
    if not patched.is_patched(model):
        raise ValueError("rl_kernel: continuous batching needs a model patched by rl_kernel.integrations.transformers")
    if not served():
        raise RuntimeError(f"rl_kernel: {UNSERVED}, this is {transformers.__version__}")
    layers = patched.layers_of(model)
    attention_modules = [m for m in model.modules() if hasattr(m, "num_key_value_groups")]
    original = ALL_ATTENTION_FUNCTIONS[ENGINE]
    implementation = model.config._attn_implementation
    for m in attention_modules:
        setattr(m, _MARK, layers)
    ALL_ATTENTION_FUNCTIONS[ENGINE] = _dispatch(original)
    model.config._attn_implementation = ENGINE
    try:
        yield model
    finally:
        model.config._attn_implementation = implementation
        ALL_ATTENTION_FUNCTIONS[ENGINE] = original
        for m in attention_modules:
            m.__dict__.pop(_MARK, None)


def engine_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float | None = None) -> torch.Tensor:
    """The log-probability transformers' engine returns for each chosen token (`return_logprobs`), from logit rows
    [n, V]: log(softmax(rows in fp32 [/ temperature, the engine's division by a float32 tensor])[token]), fp32 (no
    other logits processor). Its bits are a function of the whole row: what a check of a request against its
    teacher-forced forward compares, the engine keeping no logits."""
    scores = logits.float()
    if temperature is not None and temperature != 1.0:
        scores = scores / torch.full((1,), temperature, dtype=torch.float32, device=scores.device)
    probs = torch.nn.functional.softmax(scores, dim=-1)
    return probs.gather(1, tokens.to(probs.device)[:, None]).squeeze(-1).log()


def generate_batch(model: nn.Module, inputs: list[list[int]], continuous_batching_config=None, **kwargs: Any) -> dict:
    """transformers' `generate_batch(inputs, ...)` of a patched model under continuous_batching(model), with the engine
    kept on its attention (auto_switch_to_flash off: a flash implementation is not the tier's). Returns its outputs.
    patch() installs it as the model's own `generate_batch`, so callers of that method (TRL's GRPOTrainer with
    `use_transformers_paged`) get it; the manager API (`init_continuous_batching`) needs the block of
    continuous_batching(model) around it."""
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = continuous_batching_config or ContinuousBatchingConfig()
    if config.auto_switch_to_flash:
        config = dataclasses.replace(config, auto_switch_to_flash=False)
    with continuous_batching(model):
        return type(model).generate_batch(model, inputs, continuous_batching_config=config, **kwargs)
