"""Hugging Face transformers models in an rl_kernel tier: `generate()` and the training forward agree bit for bit.

    from rl_kernel.integrations.transformers import patch, GumbelSampler
    model = patch(AutoModelForCausalLM.from_pretrained(...), tier="exact")   # Llama, Qwen2/3, Mistral, Qwen3-MoE, OLMoE
    out = model.generate(ids, attention_mask=mask, output_logits=True, return_dict_in_generate=True,
                         do_sample=False, logits_processor=LogitsProcessorList([GumbelSampler(seed=0)]))
    logits = model(input_ids=out.sequences, attention_mask=full_mask).logits   # the same bits
    logp = completion_logprobs(model, out.sequences, full_mask, new)   # those logits' log-probs, fused head

patch() swaps, in place, every layer whose arithmetic differs between a decode step and a prefill, or
between devices, for the layers of the tier asked for (rl_kernel.tiers: the descriptor's `layers` module;
"exact", the default, is docs/numerics.md sections 11 and 12; "fast" takes linear and attention from the
matrix-core kernels, the same bits within one architecture, and the rest from the exact tier):

- the linear layers (q/k/v/o with Qwen2's biases, gate/up/down, lm_head): rl_kernel.linear, whose row
  is one fma chain whatever the batch;
- the token embedding: a gather, with rl_kernel.embedding's fixed-order weight gradient;
- the RMSNorms (Qwen3's q_norm/k_norm included): rl_kernel.rms_norm;
- the rotary embedding's cos/sin: rl_kernel.rope_table over rope_inv_freq (default or llama3 scaling);
- the MLP's SiLU x up: rl_kernel.silu_mul;
- a mixture of experts' router and experts (Qwen3-MoE, OLMoE at the default experts implementation):
  integrations.experts, the tier's grouped product, the mode's softmax, top-k and tree sums;
- attention, through transformers' attention function registry (ALL_ATTENTION_FUNCTIONS): rl_kernel.attention,
  with the layer's sliding window where it has one (Mistral; Qwen2 / Qwen3 with use_sliding_window): each row sees
  its last `window` keys, over a cache that keeps every key or, as transformers' sliding-window cache layers do,
  only the latest ones (integrations.patched.kept_keys).

What stays Hugging Face's is elementwise IEEE arithmetic (the embedding gather, residual adds, the rotary
multiply-adds, dtype casts): each op is one correctly rounded result on every device. Position ids and the
first valid key of each row come from the attention mask, the same way in generate() and in a plain
forward: position = (number of 1s up to the token) - 1. So a sequence's logits do not depend on the
batch, its order, left or right padding, or decode vs prefill.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
import transformers
from torch import nn
from transformers import LogitsProcessor
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from rl_kernel import head, tiers
from rl_kernel._validate import compiling, needs_autograd
from rl_kernel.exact.decoder.ops import MASK_RUNS_ERROR
from rl_kernel.exact.sampling.ops import gumbel_argmax
from rl_kernel.inputs import DTYPE_NAMES
from rl_kernel.integrations import experts, generation, paged
from rl_kernel.integrations.frameworks import divide_by_temperature
from rl_kernel.integrations.generation import key_mask, positions
from rl_kernel.integrations.patched import _STATE, descriptor_of, is_patched, layers_of, tier_attention, tier_of

ATTENTION = "rl_kernel_{tier}"  # the name registered in transformers' AttentionInterface, per tier
ARCHITECTURES = (
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "MistralForCausalLM",
    "Qwen3MoeForCausalLM",
    "OlmoeForCausalLM",
    "GptOssForCausalLM",
)
ROPE_TYPES = ("default", "llama3", "yarn")  # yarn: the module's own frequencies (transformers' at load) and scaling
HALF_TABLES = ("GptOssRotaryEmbedding",)  # rotary modules whose tables cover half the head (their rotation's halves)
TRANSFORMERS_RANGE = ">=5.0,<6"  # tested at both ends (requirements-hf.txt, .ci/run)


# ---- the swapped layers ---------------------------------------------------------------------------
# Each swapped module holds its tier's operators as `_rl_layers` (patch() resolves them once: Tier.namespace()).
def _linear_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    ready = self.__dict__.get("_rl_ready")  # computed with its group for this input (_attention_forward)
    if ready is not None and ready[0] is x:
        return ready[1]
    return self._rl_layers.linear(x, self.weight, self.bias)


def _embedding_forward(self: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    return self._rl_layers.embedding(ids, self.weight, self.padding_idx)


def _rms_norm_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return self._rl_layers.rms_norm(x, self.weight, self.variance_epsilon)


def _mlp_forward(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    L = self._rl_layers
    both = _grouped(x, (self.gate_proj, self.up_proj), L)
    gate, up = both if both is not None else (self.gate_proj(x), self.up_proj(x))
    return self.down_proj(L.silu_mul(gate, up))


def _attention_forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The architecture's own attention forward, its q/k/v projections computed first in one launch where the tier's
    linear has a group form and no gradient can flow: each projection's call then returns its output, for this
    input and during this call only. Otherwise (a gradient, a hook, an adapter) the forward as it is."""
    original = type(self)._rl_original.forward
    x = args[0] if args else kwargs.get("hidden_states")
    projections = (self.q_proj, self.k_proj, self.v_proj)
    ready = None
    if isinstance(x, torch.Tensor) and not needs_autograd(x, *(t for p in projections for t in (p.weight, p.bias))):
        ready = _grouped(x, projections, self._rl_layers)
    if ready is None:
        return original(self, *args, **kwargs)
    for p, y in zip(projections, ready, strict=True):
        p.__dict__["_rl_ready"] = (x, y)
    try:
        return original(self, *args, **kwargs)
    finally:
        for p in projections:
            p.__dict__.pop("_rl_ready", None)


def _grouped(x: torch.Tensor, linears: tuple[nn.Module, ...], layers: Any) -> tuple[torch.Tensor, ...] | None:
    """Each linear's output for x through the tier linear's group form (one launch, the same bits), or None where
    the tier's linear has none (the exact tier's, a control's), would not launch them once on x's device (its
    launches_once: configs.toml's linear.group), or one of them is not a plain swapped linear (a hook or an adapter
    must see its own call)."""
    group = getattr(layers.linear, "group", None)
    if group is None or compiling():  # traced: each linear's own op (a group saves host time only in eager)
        return None
    if not group.launches_once(x) or not all(_plain_linear(m) for m in linears):
        return None
    return group(x, tuple(m.weight for m in linears), tuple(m.bias for m in linears))


def _plain_linear(m: nn.Module) -> bool:
    """A linear whose forward is the swapped one and no hook (its own or a global one) would see the call."""
    hooked = m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or m._backward_pre_hooks
    g = nn.modules.module
    global_hooks = (
        g._global_forward_hooks
        or g._global_forward_pre_hooks
        or g._global_backward_hooks
        or g._global_backward_pre_hooks
    )
    return type(m).forward is _linear_forward and not hooked and not global_hooks


def _rotary_forward(self: nn.Module, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's (cos, sin) layout, [batch, seq, head_dim] in x's dtype (GPT-OSS's: [batch, seq, head_dim / 2],
    HALF_TABLES), from the contract's sin_cos times the module's attention_scaling where it is not 1 (YaRN's), as
    transformers scales them (the tables stay fp32 until this last cast, in every tier)."""
    L = self._rl_layers
    cos, sin = L.rope_table(position_ids.to(torch.int64).contiguous(), _inv_freq_on(self, position_ids.device))
    scale = getattr(self, "attention_scaling", 1.0)
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    if type(self)._rl_original.__name__ in HALF_TABLES:
        return cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((cos, cos), dim=-1).to(x.dtype), torch.cat((sin, sin), dim=-1).to(x.dtype)


def _inv_freq_on(module: nn.Module, device: torch.device) -> torch.Tensor:
    """The rotary frequencies on `device`, copied there once (a copy per forward was a host sync per decode step)."""
    kept = module.__dict__.get("_rl_inv_freq_on")
    if kept is None or kept.device != device:
        kept = module._rl_inv_freq.to(device)
        module.__dict__["_rl_inv_freq_on"] = kept
    return kept


_FORWARDS: dict[str, Callable] = {
    "linear": _linear_forward,
    "embedding": _embedding_forward,
    "rms_norm": _rms_norm_forward,
    "mlp": _mlp_forward,
    "rotary": _rotary_forward,
    "attention": _attention_forward,
    "router": experts.router_forward,
    "experts": experts.experts_forward,
}


def _kind(module: nn.Module) -> str | None:
    """Which swap a module takes: by type for linear layers, by the class name's suffix for the others."""
    if isinstance(module, nn.Linear):
        return "linear"
    if isinstance(module, nn.Embedding):
        return "embedding"
    name = type(module).__name__
    if name.endswith("Attention") and all(hasattr(module, p) for p in ("q_proj", "k_proj", "v_proj")):
        return "attention"
    suffixes = (
        ("RMSNorm", "rms_norm"),
        ("MLP", "mlp"),
        ("RotaryEmbedding", "rotary"),
        ("TopKRouter", "router"),
        ("Experts", "experts"),
    )
    for suffix, kind in suffixes:
        if name.endswith(suffix) and not (kind == "mlp" and hasattr(module, "experts")):  # GPT-OSS's MLP: its parts
            return kind
    return None


@functools.cache
def _tier_class(cls: type, kind: str, tier: str) -> type:
    """A subclass of cls whose forward is the tier's (one per class and tier, so isinstance still holds); each
    patched module holds the operators patch() resolved as `_rl_layers`."""
    attrs = {"forward": _FORWARDS[kind], "_rl_original": cls}
    return type(f"{tier.capitalize()}{cls.__name__}", (cls,), attrs)


# ---- the patched model's forward: positions from the mask (its attention: integrations.patched) ------------
def _model_forward(original: Callable) -> Callable:
    """The base model's forward with position ids, query slots and first keys derived from the mask."""
    # The positional parameters' names, read once: Signature.bind at call time does not trace under torch.compile.
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    names = [p.name for p in inspect.signature(original).parameters.values() if p.kind in kinds]

    @functools.wraps(original)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if len(args) > len(names):
            raise TypeError(f"rl_kernel: the patched forward takes {len(names)} positional arguments, got {len(args)}")
        args_ = dict(zip(names[: len(args)], args, strict=True)) | kwargs
        ref = args_.get("input_ids") if args_.get("input_ids") is not None else args_.get("inputs_embeds")
        if ref is None:
            raise ValueError("rl_kernel: the patched model needs input_ids or inputs_embeds")
        b, t = ref.shape[:2]
        cache = args_.get("cache", args_.get("past_key_values"))
        if type(cache).__name__ == "PagedAttentionCache":  # continuous batching: its own positions (integrations.paged)
            for name in ("input_ids", "position_ids"):  # the engine's int32 ids: the tier's embedding takes int64
                if args_.get(name) is not None:
                    args_[name] = args_[name].long()
            return original(**args_)
        mask, past = key_mask(args_.get("attention_mask"), b, t, cache, ref.device, args_.get("cache_position"))
        pos, q_pos, k_start, bad_runs = positions(mask, past, t)
        if not compiling():
            _check_positions(bad_runs, args_.get("position_ids"), pos, mask, q_pos)
        args_["position_ids"] = pos
        return original(**args_, rl_q_pos=q_pos, rl_k_start=k_start)

    return forward


def _check_positions(
    bad_runs: torch.Tensor, given: torch.Tensor | None, pos: torch.Tensor, mask: torch.Tensor, q_pos: torch.Tensor
) -> None:
    """The mask's one run of 1s per row and the caller's position_ids (if any) against the mask's, read in one host
    sync: a decode step of an eager generate() pays one, as stock's does, not one per check."""
    flags = [bad_runs]
    if given is not None:
        flags.append(((given.to(pos.device) != pos) & (mask.gather(1, q_pos) != 0)).any())
    runs_bad, *positions_bad = torch.stack(flags).tolist()
    if runs_bad:
        raise ValueError(MASK_RUNS_ERROR)
    if any(positions_bad):
        raise ValueError(
            "rl_kernel: position_ids differ from those of the attention mask (1s so far - 1); packed or "
            "shifted positions are not supported in the exact tier: pass the mask alone"
        )


# ---- what a model must be --------------------------------------------------------------------------
def _supported(model: nn.Module, tier: tiers.Tier) -> None:
    names = {c.__name__ for c in type(model).__mro__}
    if not names & set(ARCHITECTURES):
        raise TypeError(f"rl_kernel: patch supports {', '.join(ARCHITECTURES)}; got {type(model).__name__}")
    c = model.config
    if getattr(c, "hidden_act", "silu") != "silu":
        raise ValueError(f"rl_kernel: hidden_act {c.hidden_act!r} is not supported (supported: 'silu')")
    _check_windows(c)
    for module in model.modules():
        if _kind(module) == "experts":
            experts.check_experts(module)
    if getattr(c, "attention_dropout", 0.0):
        raise ValueError(f"rl_kernel: attention_dropout must be 0, got {c.attention_dropout}")
    rope = _rope_parameters(c)
    if rope.get("rope_type", "default") not in ROPE_TYPES:
        raise ValueError(
            f"rl_kernel: rope scaling {rope.get('rope_type')!r} is not supported (supported: {', '.join(ROPE_TYPES)})"
        )
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError("rl_kernel: partial rotary embeddings are not supported (partial_rotary_factor must be 1)")
    dtypes = {p.dtype for p in model.parameters()}
    allowed = {DTYPE_NAMES[d] for d in tier.dtypes}
    if len(dtypes) != 1 or not dtypes <= allowed:
        names = "/".join(str(d).removeprefix("torch.") for d in sorted(allowed, key=str))
        raise ValueError(f"rl_kernel: the {tier.name} tier needs parameters that share one of {names}, got {dtypes}")


def _check_windows(config: Any) -> None:
    """Full causal attention, or sliding windows of a positive number of keys on the layers layer_types names
    (the window itself is what each attention module passes its attention function: sliding_window)."""
    kinds = set(getattr(config, "layer_types", None) or [])
    if kinds - {"full_attention", "sliding_attention"}:
        raise ValueError(
            f"rl_kernel: layer types {sorted(kinds)} are not supported (supported: full_attention, sliding_attention)"
        )
    window = getattr(config, "sliding_window", None)
    slides = "sliding_attention" in kinds or (not kinds and window is not None)
    if slides and not (isinstance(window, int) and window > 0):
        raise ValueError(f"rl_kernel: a sliding window must be a positive number of keys, got {window!r}")


def _rope_parameters(config: Any) -> dict:
    """The rope settings (transformers 5's config.rope_parameters, else rope_theta + rope_scaling)."""
    rope = dict(getattr(config, "rope_parameters", None) or {})
    rope.setdefault("rope_theta", getattr(config, "rope_theta", 10000.0))
    rope.update({k: v for k, v in (getattr(config, "rope_scaling", None) or {}).items() if k not in rope})
    if "type" in rope and "rope_type" not in rope:
        rope["rope_type"] = rope["type"]
    return rope


def _head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


# ---- patch / unpatch -------------------------------------------------------------------------------
def patch(model: nn.Module, tier: str | tiers.Tier = "exact") -> nn.Module:
    """Put a loaded Llama / Qwen2 / Qwen3 / Mistral / Qwen3-MoE / OLMoE / GPT-OSS causal LM (transformers 5) in an
    rl_kernel tier (rl_kernel.tiers: "exact" by default, "fast"), in place; returns it. unpatch(model) restores it.
    Raises TypeError / ValueError naming what is supported otherwise (an unknown tier names the available ones)."""
    try:
        desc = tiers.resolve(tier)
    except tiers.TierError as exc:
        raise ValueError(str(exc)) from exc
    if hasattr(model, _STATE):
        raise ValueError("rl_kernel: this model is already patched (unpatch it first)")
    _supported(model, desc)
    layers = desc.namespace()
    attention = ATTENTION.format(tier=desc.name)
    ALL_ATTENTION_FUNCTIONS.register(attention, functools.partial(tier_attention, layers))
    rope = _rope_parameters(model.config)
    yarn = rope.get("rope_type") == "yarn"
    inv_freq = None if yarn else layers.rope_inv_freq(_head_dim(model.config), float(rope["rope_theta"]), rope)
    for module in model.modules():
        kind = _kind(module)
        if kind is None:
            continue
        if kind == "rotary":
            module._rl_inv_freq = module.inv_freq.detach().float().cpu().clone() if yarn else inv_freq
        if kind == "router":
            experts.probe_router(module)
        module.__class__ = _tier_class(type(module), kind, desc.name)
        module._rl_layers = layers
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    base.forward = _model_forward(base.forward)
    setattr(model, _STATE, {"attn": model.config._attn_implementation, "base": base, "tier": desc, "layers": layers})
    model.config._attn_implementation = attention
    # generate() with a static cache turns the 2-d mask into 4-d ones first; the patched forward derives all it
    # needs from the 2-d mask, so it gets that one (generate's running [batch, cache + new] mask), padded to the
    # cache's slots: one shape for every decode step, which a compiled forward (CUDA graphs) needs.
    model.create_masks_for_generate = generation.slot_mask
    model.get_compiled_call = functools.partial(generation.compiled_call, model)
    model.generate_batch = functools.partial(paged.generate_batch, model)  # continuous batching, the tier's attention
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Undo patch(model): the original layer classes, forward and attention implementation."""
    state = getattr(model, _STATE, None)
    if state is None:
        raise ValueError("rl_kernel: this model is not patched")
    for module in model.modules():
        original = type(module).__dict__.get("_rl_original")
        if original is not None:
            module.__class__ = original
            module.__dict__.pop("_rl_inv_freq", None)
            module.__dict__.pop("_rl_inv_freq_on", None)
            module.__dict__.pop("_rl_router", None)
            module.__dict__.pop("_rl_layers", None)
    del state["base"].forward
    for name in ("create_masks_for_generate", "get_compiled_call", "_rl_compiled", "generate_batch"):
        model.__dict__.pop(name, None)
    model.config._attn_implementation = state["attn"]
    delattr(model, _STATE)
    return model


# ---- log-probs straight from the hidden states -------------------------------------------------------
def completion_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    logits_to_keep: int,
    *,
    temperature: float | None = None,
    entropy: bool = False,
    vocab_chunk: int = head.VOCAB_CHUNK,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The log-probs [B, logits_to_keep] (and entropies) of the last logits_to_keep tokens of input_ids under a
    patched model, from the decoder's hidden states through rl_kernel.lm_head_logprobs: never the logits. Bit for
    bit token_logprobs of the model's own logits for those positions (divided by temperature as generate()
    divides: divide_by_temperature), i.e. of generate()'s scores; differentiable. Peak memory: a vocab_chunk
    slice of the logits instead of all of them."""
    tier = descriptor_of(model)
    if tier is None:
        raise ValueError("rl_kernel: completion_logprobs needs a model patched with rl_kernel (patch(model, tier=...))")
    if not 0 < logits_to_keep < input_ids.shape[-1]:
        raise ValueError(
            f"rl_kernel: logits_to_keep must be in [1, {input_ids.shape[-1] - 1}] (tokens scored from the position "
            f"before them), got {logits_to_keep}"
        )
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    hidden = decoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    lm_head = model.get_output_embeddings()
    return head.lm_head_logprobs(
        hidden[:, -logits_to_keep - 1 : -1],
        lm_head.weight,
        input_ids[:, -logits_to_keep:],
        tier=tier,
        bias=lm_head.bias,
        temperature=temperature,
        entropy=entropy,
        vocab_chunk=vocab_chunk,
    )


# ---- sampling --------------------------------------------------------------------------------------
class GumbelSampler(LogitsProcessor):
    """A logits processor that draws the next token with rl_kernel.gumbel_argmax and leaves only it finite,
    so greedy decoding (do_sample=False) takes it: the same whole sequences on every device.

    Row b's draw is a function of (seed, keys[b], its step) and its scores. keys default to the row numbers;
    pass one key per sample: distinct for every sequence of the batch, and the same each time that sample is
    rolled out again (a replay, another batch or device). For a GRPO group of G samples of one prompt, use
    key = prompt_id * G + member (member 0 .. G-1) or a per-sample uid. Never one key per prompt: rows with the
    same key, step and prompt draw the same tokens, so the G samples of a group would be identical and every
    advantage zero. With pad_token_id the step is the sequence's own length (its left padding not counted),
    so a sequence draws the same tokens whatever batch, order or padding it is generated in; without, the
    step is the padded length. temperature divides the scores first, as frameworks do, by a true division
    (integrations.divide_by_temperature: the same bits everywhere)."""

    def __init__(
        self, seed: int, temperature: float = 1.0, keys: torch.Tensor | None = None, pad_token_id: int | None = None
    ) -> None:
        if not temperature > 0:
            raise ValueError(f"rl_kernel: temperature must be > 0, got {temperature}")
        self.seed, self.temperature, self.keys, self.pad = int(seed), float(temperature), keys, pad_token_id

    def steps(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Each row's step: its length without the leading pad tokens (or the padded length, without pad)."""
        width = torch.full(input_ids.shape[:1], input_ids.shape[1], dtype=torch.int64, device=input_ids.device)
        if self.pad is None:
            return width
        return width - (input_ids == self.pad).long().cumprod(dim=1).sum(dim=1)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.temperature != 1.0:
            scores = divide_by_temperature(scores, self.temperature)
        keys = None if self.keys is None else self.keys.to(scores.device)
        token = gumbel_argmax(scores, self.seed, self.steps(input_ids), keys)
        return torch.full_like(scores, float("-inf")).scatter_(1, token[:, None], 0.0)


__all__ = [
    "ARCHITECTURES",
    "ATTENTION",
    "TRANSFORMERS_RANGE",
    "GumbelSampler",
    "descriptor_of",
    "is_patched",
    "layers_of",
    "patch",
    "positions",
    "tier_attention",
    "tier_of",
    "transformers",
    "unpatch",
]
