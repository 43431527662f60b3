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
from torch import nn

# ---- the Hugging Face tiny models --------------------------------------------------------------------
FAMILIES = ("llama", "qwen2", "qwen3")  # what patch() and the harness's model workload take
# Every architecture tiny_config builds: FAMILIES, and those only rl_kernel.mode reaches (docs/architecture.md).
ARCHITECTURES = (*FAMILIES, "mistral", "phi3", "olmo2", "qwen3_moe", "gemma2", "gemma3")
PAD = 0


def tiny_config(
    family: str, vocab: int, layers: int = 2, hidden: int = 64, heads: int = 4, intermediate: int | None = None
) -> Any:
    """A small config of the family (the harness's model workload builds its models from it) with what it has
    that others lack: Llama 3's rope scaling, Qwen2's q/k/v biases and tied embeddings, Qwen3's q/k norms;
    grouped-query with heads / 2 KV heads; the MLP twice the hidden size unless `intermediate` says."""
    import transformers

    common = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate or 2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=hidden // heads,
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
    return _mode_only_config(transformers, family, common, hidden // heads)


def _mode_only_config(transformers: Any, family: str, common: dict, head_dim: int) -> Any:
    """The architectures patch() does not know, each with what it adds: Mistral (a sliding window, here wider than
    any test's sequence, so it cuts no key), Phi-3 (fused qkv and gate/up projections), OLMo 2 (norms after the
    blocks, q/k norms over all heads), Qwen3-MoE (a top-k router and experts whose rows change with the batch),
    Gemma 2 (logit soft-capping in attention and at the head, (1 + w) norms, eager attention, alternating
    windows), Gemma 3 (q/k norms, local and global rope bases, 5 windowed layers to 1 global)."""
    window = 4096  # wider than every test's sequence: the window cuts no key (a narrower one is refused by name)
    if family == "mistral":
        return transformers.MistralConfig(**common, sliding_window=window)
    if family == "phi3":
        return transformers.Phi3Config(**common)
    if family == "olmo2":
        return transformers.Olmo2Config(**common)
    if family == "qwen3_moe":
        return transformers.Qwen3MoeConfig(
            **common, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=common["hidden_size"],
            decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True, use_sliding_window=False,
            experts_implementation="eager",  # the experts one by one: the mode refuses the grouped GEMM by name
        )  # fmt: skip
    if family == "gemma2":
        return transformers.Gemma2Config(
            **common, sliding_window=window, query_pre_attn_scalar=head_dim, attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh",
        )  # fmt: skip
    if family == "gemma3":
        return transformers.Gemma3TextConfig(
            **common, sliding_window=window, query_pre_attn_scalar=head_dim, hidden_activation="gelu_pytorch_tanh",
        )  # fmt: skip
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
    from rl_kernel.inputs import DTYPE_NAMES

    model = tiny_weights(family, vocab, seed, layers=layers, hidden=hidden, heads=heads)
    model = model.to(DTYPE_NAMES[dtype]).to(device).eval()
    if tier != "stock":
        from rl_kernel.integrations.transformers import patch

        patch(model, tier=tier)
    return model


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
