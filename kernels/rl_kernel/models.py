"""The tiny models every part of the project checks with: one owner, so the locator, the harness's model workload,
bench/, examples/ and the tests build the same weights from the same seed.

- `tiny_config` / `tiny_weights` / `tiny_model`: a small random Hugging Face Llama / Qwen2 / Qwen3 (what each family
  has that the others lack: Llama 3's rope scaling, Qwen2's biases and tied embeddings, Qwen3's q/k norms), and
  `sequences`: left-padded prompts with a completion. transformers is imported only when one is built.
The decoder family's own check model, built from the exact tier's layers without transformers, is
rl_kernel.exact.decoder.tiny.TinyDecoder.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

# ---- the Hugging Face tiny models --------------------------------------------------------------------
FAMILIES = ("llama", "qwen2", "qwen3")  # what the harness's model workload takes, patched
MIXTURES = ("qwen3_moe", "olmoe", "gpt_oss")  # patch()'s mixtures of experts (transformers' default implementation)
PATCHED = (*FAMILIES, "mistral", *MIXTURES)  # every tiny architecture patch() takes (the others: rl_kernel.mode)
# Every architecture tiny_config builds: PATCHED, and those only rl_kernel.mode reaches (docs/architecture.md).
ARCHITECTURES = (*PATCHED, "phi3", "olmo2", "gemma2", "gemma3")
PAD = 0
WINDOW = 6  # the windowed architectures' sliding window: prompts of up to 8 tokens and their completions exceed it


def tiny_config(
    family: str,
    vocab: int,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 4,
    intermediate: int | None = None,
    head_dim: int | None = None,
) -> Any:
    """A small config of the family (the harness's model workload builds its models from it) with what it has
    that others lack: Llama 3's rope scaling, Qwen2's q/k/v biases and tied embeddings, Qwen3's q/k norms;
    grouped-query with heads / 2 KV heads of hidden / heads (unless `head_dim` says: GPT-OSS's 2880 over 64 heads are
    heads of 64); the MLP twice the hidden size unless `intermediate` says."""
    import transformers

    common = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate or 2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=head_dim or hidden // heads,
        max_position_embeddings=4096, pad_token_id=PAD, bos_token_id=None, eos_token_id=None, attention_dropout=0.0,
    )  # fmt: skip
    if family == "llama":
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64, "rope_theta": 500000.0}  # fmt: skip
        return transformers.LlamaConfig(**common, rope_parameters=rope)
    if family == "qwen2":
        return transformers.Qwen2Config(**common, tie_word_embeddings=True, use_sliding_window=False)
    if family == "qwen3":
        return transformers.Qwen3Config(**common, use_sliding_window=False)
    return _mode_only_config(transformers, family, common, common["head_dim"])


def _mode_only_config(transformers: Any, family: str, common: dict, head_dim: int) -> Any:
    """The architectures patch() does not know, each with what it adds: Mistral (a sliding window of WINDOW keys,
    shorter than the tests' sequences), Phi-3 (fused qkv and gate/up projections), OLMo 2 (norms after the
    blocks, q/k norms over all heads), Qwen3-MoE (a top-k router and experts whose rows change with the batch),
    Gemma 2 (logit soft-capping in attention and at the head, so eager attention: bmm and softmax; (1 + w) norms,
    alternating windows), Gemma 3 (q/k norms, local and global rope bases, 5 windowed layers to 1 global), OLMoE
    (a mixture of experts with q/k norms), GPT-OSS (attention sinks, windows on alternate layers, biased experts).
    The mixtures of experts keep transformers' default experts implementation (the grouped GEMM)."""
    window = WINDOW  # shorter than the tests' sequences: the window cuts keys, as at the lengths users train
    if family == "mistral":
        return transformers.MistralConfig(**common, sliding_window=window)
    if family == "phi3":
        return transformers.Phi3Config(**common)
    if family == "olmo2":
        return transformers.Olmo2Config(**common)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(
            **common,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=common["hidden_size"],
            decoder_sparse_step=1,
            mlp_only_layers=[],
            norm_topk_prob=True,
            use_sliding_window=False,
        )  # fmt: skip  (transformers' default experts implementation: the grouped GEMM, aten::_grouped_mm)
    if family == "gemma2":
        return transformers.Gemma2Config(
            **common, sliding_window=window, query_pre_attn_scalar=head_dim, attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh",
        )  # fmt: skip
    if family == "gemma3":
        return transformers.Gemma3TextConfig(
            **common, sliding_window=window, query_pre_attn_scalar=head_dim, hidden_activation="gelu_pytorch_tanh",
        )  # fmt: skip
    if family == "olmoe":
        return transformers.OlmoeConfig(
            **common,
            num_experts=8,
            num_experts_per_tok=4,
            norm_topk_prob=False,
        )  # fmt: skip  (OLMoE: 64 experts top-8 at scale; q/k norms; the default grouped-GEMM experts)
    if family == "gpt_oss":
        return transformers.GptOssConfig(
            **common,
            num_local_experts=8,
            num_experts_per_tok=2,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "full_attention"] * max(1, common["num_hidden_layers"] // 2),
            rope_parameters={"rope_type": "default", "rope_theta": 150000.0},
        )  # fmt: skip  (GPT-OSS: attention sinks, windows on alternate layers, experts with biases)
    raise ValueError(f"unknown model family {family!r} (known: {', '.join(ARCHITECTURES)})")


def tiny_weights(family: str, vocab: int, seed: int, **shape: Any) -> nn.Module:
    """The family's model (tiny_config's shape arguments) in float32 on the CPU, its weights drawn from seed:
    norms near 1, small biases, matrices scaled by fan-in (a tied embedding too: Qwen2's is its output layer, and
    at std 1 its softmax is nearly one-hot, so samples would equal greedy ones)."""
    import transformers

    torch.manual_seed(seed)  # from_config's own init, overwritten below
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(family, vocab, **shape))
    g = torch.Generator().manual_seed(seed)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            w = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                w = 1.0 + 0.1 * w
            elif name.endswith("bias"):
                w = 0.1 * w
            elif p.dim() == 2 and ("embed" not in name or tied):
                w = w * p.shape[1] ** -0.5
            p.copy_(w)
    return model


def tiny_model(
    family: str, vocab: int, layers: int = 2, hidden: int = 64, heads: int = 4, *, dtype: str = "fp32",
    seed: int = 0, device: str = "cpu", tier: str = "stock",
) -> nn.Module:  # fmt: skip
    """A random-weight model as the harness's model workload builds it (tiny_weights: drawn on the CPU in float32,
    then cast and moved), in eval mode; patched in `tier` unless "stock"."""
    return _ready(tiny_weights(family, vocab, seed, layers=layers, hidden=hidden, heads=heads), dtype, device, tier)


def _ready(model: nn.Module, dtype: str, device: str, tier: str) -> nn.Module:
    """The model cast to dtype, on device, in eval mode, patched in `tier` unless "stock"."""
    from rl_kernel.inputs import DTYPE_NAMES

    model = model.to(DTYPE_NAMES[dtype]).to(device).eval()
    if tier != "stock":
        from rl_kernel.integrations.transformers import patch

        patch(model, tier=tier)
    return model


WINDOWED = ("mistral", "qwen2", "qwen3")  # patch()'s families with windows shorter than the tests' sequences


def tiny_windowed_model(
    family: str, vocab: int, *, dtype: str = "fp32", seed: int = 0, device: str = "cpu", tier: str = "stock"
) -> nn.Module:
    """A patch() family with windows of WINDOW keys: Mistral as tiny_model builds it (every layer windowed); Qwen2 /
    Qwen3 as tiny_model's weights with use_sliding_window, windows on every layer but the first (max_window_layers=1):
    full and windowed layers in one model, as Qwen2's long-context configs have."""
    import transformers

    if family not in WINDOWED:
        raise ValueError(f"unknown windowed family {family!r} (known: {', '.join(WINDOWED)})")
    if family == "mistral":
        return tiny_model(family, vocab, dtype=dtype, seed=seed, device=device, tier=tier)
    base = tiny_weights(family, vocab, seed)
    windows = {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1, "layer_types": None}
    config = type(base.config)(**(base.config.to_dict() | windows))
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.load_state_dict(base.state_dict())
    return _ready(model, dtype, device, tier)


def sequences(batch: int, prompt: int, new: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[batch, prompt + new] token ids and mask: row b's prompt is 2 .. prompt tokens (seeded), left padded with
    PAD to `prompt`, then `new` completion tokens (random: the paths are compared on the same tokens)."""
    g = torch.Generator().manual_seed(seed + 11)
    ids = torch.full((batch, prompt + new), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b in range(batch):
        n = int(torch.randint(min(2, prompt), prompt + 1, (1,), generator=g))
        ids[b, prompt - n :] = torch.randint(1, vocab, (n + new,), generator=g)
        mask[b, prompt - n :] = 1
    return ids, mask


# ---- a decoder in plain PyTorch, as an engine writes its own (no transformers, no rl_kernel) -------------------
class PlainDecoder(nn.Module):
    """A Llama-style decoder in plain torch: RMSNorm by mean and rsqrt, rotary embedding from the mask's positions,
    grouped-query attention by F.scaled_dot_product_attention over a growing key/value cache with a boolean mask,
    SwiGLU; `generate` is a greedy loop over left-padded prompts. What rl_kernel.mode must reach without a patch."""

    def __init__(self, vocab: int, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                 seed: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        g = torch.Generator().manual_seed(seed)

        def matrix(rows: int, cols: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(rows, cols, generator=g) * cols**-0.5)

        def norm(n: int) -> nn.Parameter:
            return nn.Parameter(1.0 + 0.1 * torch.randn(n, generator=g))

        kv = kv_heads * self.head_dim

        def block() -> nn.ParameterDict:
            mlp = 2 * hidden
            shapes = {"q": (hidden, hidden), "k": (kv, hidden), "v": (kv, hidden), "o": (hidden, hidden),
                      "gate": (mlp, hidden), "up": (mlp, hidden), "down": (hidden, mlp)}  # fmt: skip
            return nn.ParameterDict(
                {"attn_norm": norm(hidden), "mlp_norm": norm(hidden)} | {n: matrix(*s) for n, s in shapes.items()}
            )

        self.embed = nn.Parameter(torch.randn(vocab, hidden, generator=g))
        self.blocks = nn.ModuleList(block() for _ in range(layers))
        self.norm, self.head = norm(hidden), matrix(vocab, hidden)
        self.register_buffer("inv_freq", 10000.0 ** (-torch.arange(0, self.head_dim, 2).float() / self.head_dim))

    @staticmethod
    def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * w

    def _rotate(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        angles = pos[:, None, :, None].float() * self.inv_freq
        cos, sin = torch.cat([angles.cos()] * 2, -1).to(x.dtype), torch.cat([angles.sin()] * 2, -1).to(x.dtype)
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, cache: list | None = None) -> torch.Tensor:
        """Logits [B, T, V] of ids [B, T] after the cache's tokens; mask [B, cache + T] (1 token, 0 left padding).
        `cache`: a list this call appends each layer's keys and values to (None: no cache)."""
        b, t = ids.shape
        past = 0 if not cache else cache[0][0].shape[2]
        pos = (mask.cumsum(-1) - 1).clamp(min=0)[:, past:]
        slots = torch.arange(past + t, device=ids.device)
        seen = (slots[None, None, :] <= (past + torch.arange(t, device=ids.device))[None, :, None]) & mask[
            :, None, :
        ].bool()  # causal, and no padding key
        real = mask[:, past:, None].to(self.embed.dtype)
        h = F.embedding(ids, self.embed)
        for i, blk in enumerate(self.blocks):
            x = self._rms(h, blk["attn_norm"])
            q = (x @ blk["q"].t()).view(b, t, self.heads, -1).transpose(1, 2)
            k = (x @ blk["k"].t()).view(b, t, self.kv_heads, -1).transpose(1, 2)
            v = (x @ blk["v"].t()).view(b, t, self.kv_heads, -1).transpose(1, 2)
            q, k = self._rotate(q, pos), self._rotate(k, pos)
            if cache is not None:
                if len(cache) > i:
                    k, v = torch.cat([cache[i][0], k], 2), torch.cat([cache[i][1], v], 2)
                    cache[i] = (k, v)
                else:
                    cache.append((k, v))
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=seen[:, None], enable_gqa=True)
            h = h + (a.transpose(1, 2).reshape(b, t, -1) @ blk["o"].t()) * real  # padding rows stay 0
            x = self._rms(h, blk["mlp_norm"])
            h = h + (F.silu(x @ blk["gate"].t()) * (x @ blk["up"].t())) @ blk["down"].t()
        return self._rms(h, self.norm) @ self.head.t()

    @torch.no_grad()
    def generate(self, ids: torch.Tensor, mask: torch.Tensor, new: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy: (the `new` tokens [B, new], their logits [B, new, V]): a prefill, then one token a step."""
        cache: list = []
        logits = self(ids, mask, cache)[:, -1]
        tokens, steps = [], [logits]
        for _ in range(new - 1):
            tokens.append(logits.argmax(-1, keepdim=True))
            mask = torch.cat([mask, torch.ones_like(tokens[-1])], 1)
            logits = self(tokens[-1], mask, cache)[:, -1]
            steps.append(logits)
        tokens.append(logits.argmax(-1, keepdim=True))
        return torch.cat(tokens, 1), torch.stack(steps, 1)
