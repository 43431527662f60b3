"""A small Llama / Qwen2 / Qwen3-shaped decoder built from the exact tier's layers alone (no transformers): the decoder
family's check model, and a model class written in plain PyTorch as an engine's would be.

It exists to check the layers together the way RL uses them: a rollout decodes one token at a time
over a KV cache (GEMMs with M = batch, attention over the cache, left-padded prompts), while training
runs one forward over whole sequences. With these layers both give the same logits bit for bit, on
every device:

    model = TinyDecoder(DecoderConfig(), dtype=torch.bfloat16, seed=0)
    full, _ = model(ids, mask)                              # teacher-forced, [B, T, V]
    step, cache = model(ids[:, :4], mask[:, :4])            # prefill ...
    step, cache = model(ids[:, 4:5], mask[:, :5], cache)    # ... then one token at a time

The layer functions are attributes (linear, attention), so a check can swap in a wrong one (a split-K
linear, a split-KV decode attention) and see the check fail: rl_kernel.contract.selfcheck and
tests/kernels/test_decoder.py do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rl_kernel.exact.decoder import ops as L


@dataclass(frozen=True)
class DecoderConfig:
    vocab: int = 96
    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    intermediate: int = 96
    rope_base: float = 10000.0
    eps: float = 1e-6
    attention_bias: bool = False  # Qwen2: biases on q, k, v
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k

    def __post_init__(self) -> None:
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")


@dataclass
class Cache:
    """Per layer the keys and values so far, [B, Hkv, L, D], and the mask of those L positions."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    mask: torch.Tensor

    @property
    def length(self) -> int:
        return int(self.mask.shape[1])


def _weight(shape: tuple[int, ...], gen: torch.Generator, scale: float) -> torch.Tensor:
    return torch.randn(shape, generator=gen) * scale


class TinyDecoder:
    """Random weights from a seed (made on the CPU in float32, then cast and moved: the same bits on
    every device)."""

    def __init__(
        self,
        config: DecoderConfig,
        dtype: torch.dtype = torch.float32,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ) -> None:
        self.config, self.dtype, self.device = config, dtype, torch.device(device)
        c, g = config, torch.Generator().manual_seed(seed)
        q_out, kv_out = c.heads * c.head_dim, c.kv_heads * c.head_dim
        w: dict[str, torch.Tensor] = {"embed": _weight((c.vocab, c.hidden), g, 1.0)}
        for i in range(c.layers):
            p = f"layers.{i}."
            w[p + "in_norm"] = 1.0 + _weight((c.hidden,), g, 0.1)
            w[p + "q"] = _weight((q_out, c.hidden), g, c.hidden**-0.5)
            w[p + "k"] = _weight((kv_out, c.hidden), g, c.hidden**-0.5)
            w[p + "v"] = _weight((kv_out, c.hidden), g, c.hidden**-0.5)
            if c.attention_bias:
                for name, n in (("q_bias", q_out), ("k_bias", kv_out), ("v_bias", kv_out)):
                    w[p + name] = _weight((n,), g, 0.1)
            if c.qk_norm:
                w[p + "q_norm"] = 1.0 + _weight((c.head_dim,), g, 0.1)
                w[p + "k_norm"] = 1.0 + _weight((c.head_dim,), g, 0.1)
            w[p + "o"] = _weight((c.hidden, q_out), g, q_out**-0.5)
            w[p + "post_norm"] = 1.0 + _weight((c.hidden,), g, 0.1)
            w[p + "gate"] = _weight((c.intermediate, c.hidden), g, c.hidden**-0.5)
            w[p + "up"] = _weight((c.intermediate, c.hidden), g, c.hidden**-0.5)
            w[p + "down"] = _weight((c.hidden, c.intermediate), g, c.intermediate**-0.5)
        w["norm"] = 1.0 + _weight((c.hidden,), g, 0.1)
        w["lm_head"] = _weight((c.vocab, c.hidden), g, c.hidden**-0.5)
        self.weights = {k: v.to(dtype).to(self.device) for k, v in w.items()}
        self.inv_freq = L.rope_inv_freq(c.head_dim, c.rope_base).to(self.device)
        self.linear: Callable = L.linear
        self.attention: Callable = L.attention

    # ---- the forward ----------------------------------------------------------------------------
    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, cache: Cache | None = None) -> tuple[torch.Tensor, Cache]:
        """Logits [B, T, V] of the T new tokens ids [B, T]; mask [B, L] covers the cache and the new
        tokens (1 = a token, 0 = padding, one run per row). Returns the logits and the grown cache."""
        c, w = self.config, self.weights
        b, t = ids.shape
        past = 0 if cache is None else cache.length
        if mask.shape != (b, past + t):
            raise ValueError(f"mask must be [batch, cache + new] = [{b}, {past + t}], got {tuple(mask.shape)}")
        positions = (mask.long().cumsum(1) - 1).masked_fill(mask == 0, 1)[:, past:]
        cos, sin = L.rope_table(positions.contiguous(), self.inv_freq)
        _, k_start = L.positions_from_mask(mask)
        q_pos = (torch.arange(t, device=ids.device) + past).expand(b, t).contiguous()
        h = w["embed"][ids]
        keys, values = [], []
        for i in range(c.layers):
            p = f"layers.{i}."
            a, k, v = self._attention_block(p, h, cos, sin, cache, i, q_pos, k_start)
            h = h + a
            keys.append(k)
            values.append(v)
            h = h + self._mlp(p, L.rms_norm(h, w[p + "post_norm"], c.eps))
        logits = self.linear(L.rms_norm(h, w["norm"], c.eps), w["lm_head"])
        return logits, Cache(keys, values, mask)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n, self.config.head_dim).transpose(1, 2).contiguous()

    def _attention_block(self, p, h, cos, sin, cache, layer, q_pos, k_start):
        c, w = self.config, self.weights
        n = L.rms_norm(h, w[p + "in_norm"], c.eps)
        q = self._heads(self.linear(n, w[p + "q"], w.get(p + "q_bias")), c.heads)
        k = self._heads(self.linear(n, w[p + "k"], w.get(p + "k_bias")), c.kv_heads)
        v = self._heads(self.linear(n, w[p + "v"], w.get(p + "v_bias")), c.kv_heads)
        if c.qk_norm:
            q, k = L.rms_norm(q, w[p + "q_norm"], c.eps), L.rms_norm(k, w[p + "k_norm"], c.eps)
        q, k = L.rotary(q, cos, sin), L.rotary(k, cos, sin)
        if cache is not None:
            k = torch.cat([cache.keys[layer], k], dim=2)
            v = torch.cat([cache.values[layer], v], dim=2)
        o = self.attention(q, k, v, q_pos, k_start)
        b, _, t, _ = o.shape
        o = o.transpose(1, 2).reshape(b, t, c.heads * c.head_dim)
        return self.linear(o, w[p + "o"]), k, v

    def _mlp(self, p: str, x: torch.Tensor) -> torch.Tensor:
        w = self.weights
        return self.linear(L.silu_mul(self.linear(x, w[p + "gate"]), self.linear(x, w[p + "up"])), w[p + "down"])

    # ---- rollout --------------------------------------------------------------------------------
    def decode_logits(self, ids: torch.Tensor, mask: torch.Tensor, prompt_len: int) -> torch.Tensor:
        """The logits of positions prompt_len-1 .. T-2 (those that score tokens prompt_len .. T-1) as a
        rollout makes them: a prefill of the first prompt_len tokens, then one token at a time."""
        logits, cache = self(ids[:, :prompt_len], mask[:, :prompt_len])
        out = [logits[:, -1:]]
        for t in range(prompt_len, ids.shape[1] - 1):
            step, cache = self(ids[:, t : t + 1], mask[:, : t + 1], cache)
            out.append(step)
        return torch.cat(out, dim=1)


# ---- wrong layers, for the negative controls -----------------------------------------------------
def split_k_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """A linear whose K split depends on M, as a GEMM library's heuristics do: few rows (a decode step)
    sum two halves of K, many rows one chain. Each row's bits then depend on the batch shape."""
    rows = x.numel() // x.shape[-1]
    if rows > 8:
        return L.linear(x, weight, bias)
    half = x.shape[-1] // 2
    lo = L.linear(x[..., :half].contiguous(), weight[:, :half].contiguous())
    hi = L.linear(x[..., half:].contiguous(), weight[:, half:].contiguous(), bias)
    return lo + hi


def split_kv_attention(q, k, v, q_pos, k_start, scale: float | None = None, **_: object) -> torch.Tensor:
    """A decode attention (q_len = 1) over the cache in two halves merged afterwards (flash-decoding's
    split-KV), another order than the prefill's one pass; prefill keeps the one pass."""
    if q.shape[2] != 1:
        return L.attention(q, k, v, q_pos, k_start, scale)
    end = q_pos[:, 0]
    mid = torch.maximum(k_start, (k_start + end + 1) // 2)
    o1, s1 = L.attention_with_stats(q, k, v, (mid - 1).view(-1, 1).contiguous(), k_start, scale)
    o2, s2 = L.attention_with_stats(q, k, v, q_pos, mid.contiguous(), scale)
    m = torch.maximum(s1[..., 0], s2[..., 0])
    w1 = s1[..., 1] * torch.exp(s1[..., 0] - m)
    w2 = s2[..., 1] * torch.exp(s2[..., 0] - m)
    out = (o1.float() * w1[..., None] + o2.float() * w2[..., None]) / (w1 + w2)[..., None]
    return out.to(q.dtype)
