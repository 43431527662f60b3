"""The Hugging Face models the benchmarks build, by name: random weights from a seed, no download.

    qwen3-1.7b  Qwen3-1.7B's shape: 28 layers, hidden 2048, 16 query / 8 KV heads of 128, MLP 6144, vocab 151936
    qwen3-8b    Qwen3-8B's shape: 36 layers, hidden 4096, 32 query / 8 KV heads of 128, MLP 12288, vocab 151936,
                the LM head tied to the embedding
    olmoe-1b-7b OLMoE-1B-7B's shape: 16 layers, hidden 2048, 16 query / 16 KV heads of 128, 64 experts of 1024,
                top-8, vocab 50304 (transformers' default experts implementation: the grouped GEMM)
    mistral-7b  Mistral-7B's shape with a window that cuts keys: 32 layers (--layers cuts them to fit), hidden
                4096, 32 query / 8 KV heads of 128, MLP 14336, vocab 32000, sliding window 4096
    tiny        2 layers, hidden 64, 4 / 2 heads, MLP 128, vocab 512: a CPU run that checks a script, not a speed
    gpt-oss-20b GPT-OSS-20B's shape: 24 layers, hidden 2880, 64 query / 8 KV heads of 64 with attention sinks,
                128-key windows on alternate layers, 32 experts of 2880 with biases, top-4, YaRN, vocab 201088
    tiny-moe, tiny-window, tiny-gpt-oss  the same for the three above (8 experts top-2; a window of 16 keys;
                GPT-OSS's tiny config with YaRN)

Each config is rl_kernel.models.tiny_config's (the family's own features: Qwen3's q/k norms), with the KV heads and
the tying the shape names where tiny_config's defaults (heads / 2 KV heads, Qwen3 untied) differ, and the config's
other fields the shape sets (`extra`: experts, a window, the positions the rope serves). A shape
tiny_config makes as it is gets rl_kernel.models.tiny_weights (the weights every part of the project draws from
the seed, on the CPU in fp32); another gets transformers' own initialisation, seeded, drawn on the device in its
dtype (an 8B model in fp32 on the host would take 32 GB and minutes). in_tier puts a model in a tier for a block
(stock, patched, or unpatched under rl_kernel.mode: "mode-TIER"), as model_step and rollout_modes run them.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

import rl_kernel
from rl_kernel.inputs import DTYPE_NAMES
from rl_kernel.models import tiny_config, tiny_weights


@dataclass(frozen=True)
class Shape:
    family: str
    vocab: int
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    tied: bool = False
    head_dim: int | None = None  # hidden / heads unless set (GPT-OSS: 2880 over 64 heads of 64)
    extra: tuple[tuple[str, Any], ...] = ()  # more fields of the family's config, set after tiny_config's

    def dims(self) -> dict[str, int]:
        """tiny_config's shape arguments."""
        return dict(
            layers=self.layers,
            hidden=self.hidden,
            heads=self.heads,
            intermediate=self.intermediate,
            head_dim=self.head_dim,
        )


# GPT-OSS's rotary embedding: YaRN over 4096 original positions, factor 32 (its released config's).
YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 4096}  # fmt: skip

SHAPES = {
    "qwen3-1.7b": Shape("qwen3", 151936, layers=28, hidden=2048, heads=16, kv_heads=8, intermediate=6144),
    "qwen3-8b": Shape("qwen3", 151936, layers=36, hidden=4096, heads=32, kv_heads=8, intermediate=12288, tied=True),
    "olmoe-1b-7b": Shape(
        "olmoe",
        50304,
        layers=16,
        hidden=2048,
        heads=16,
        kv_heads=16,
        intermediate=1024,
        extra=(("num_experts", 64), ("num_experts_per_tok", 8)),
    ),
    "mistral-7b": Shape(
        "mistral",
        32000,
        layers=32,
        hidden=4096,
        heads=32,
        kv_heads=8,
        intermediate=14336,
        extra=(("sliding_window", 4096), ("max_position_embeddings", 32768)),
    ),
    "gpt-oss-20b": Shape(
        "gpt_oss",
        201088,
        layers=24,
        hidden=2880,
        heads=64,
        kv_heads=8,
        intermediate=2880,
        head_dim=64,
        extra=(
            ("num_local_experts", 32),
            ("num_experts_per_tok", 4),
            ("sliding_window", 128),
            ("rope_parameters", YARN),
        ),
    ),
    "tiny": Shape("qwen3", 512, layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128),
    "tiny-moe": Shape(
        "olmoe",
        512,
        layers=2,
        hidden=64,
        heads=4,
        kv_heads=4,
        intermediate=32,
        extra=(("num_experts", 8), ("num_experts_per_tok", 2)),
    ),
    "tiny-gpt-oss": Shape(
        "gpt_oss", 512, layers=2, hidden=64, heads=4, kv_heads=2, intermediate=32, extra=(("rope_parameters", YARN),)
    ),
    "tiny-window": Shape(
        "mistral", 512, layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128, extra=(("sliding_window", 16),)
    ),
}


def shape(name: str, **overrides: Any) -> Shape:
    """The named shape with the fields given (not None) replaced, e.g. shape("qwen3-1.7b", layers=8)."""
    if name not in SHAPES:
        raise ValueError(f"unknown model shape {name!r} (known: {', '.join(SHAPES)})")
    return dataclasses.replace(SHAPES[name], **{k: v for k, v in overrides.items() if v is not None})


def config(s: Shape) -> Any:
    cfg = tiny_config(s.family, s.vocab, **s.dims())
    cfg.num_key_value_heads = s.kv_heads
    cfg.tie_word_embeddings = s.tied
    for key, value in s.extra:
        if not hasattr(cfg, key):
            raise ValueError(f"model shape: {type(cfg).__name__} has no field {key!r}")
        setattr(cfg, key, value)
    return cfg


def _tiny_configs_own(s: Shape) -> bool:
    base = tiny_config(s.family, s.vocab, **s.dims())
    return (base.num_key_value_heads, bool(base.tie_word_embeddings), s.extra) == (s.kv_heads, s.tied, ())


def build(s: Shape, dtype: str, seed: int, device: str | torch.device) -> torch.nn.Module:
    """The model of the shape in `dtype` ("bf16", "fp16", "fp32") on `device`, in eval mode."""
    if _tiny_configs_own(s):
        return tiny_weights(s.family, s.vocab, seed, **s.dims()).to(DTYPE_NAMES[dtype]).to(device).eval()
    import transformers

    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config(s), dtype=DTYPE_NAMES[dtype])
    return model.eval()


@contextlib.contextmanager
def in_tier(model, tier: str) -> Iterator[str]:
    """The model in `tier` for the block: stock as it is, mode-TIER under rl_kernel.mode(TIER), else patched (and
    unpatched after); yields the tier whose kernels serve ("stock", or TIER)."""
    if tier == "stock":
        yield tier
    elif tier.startswith("mode-"):
        with rl_kernel.mode(tier.removeprefix("mode-")):
            yield tier.removeprefix("mode-")
    else:
        from rl_kernel.integrations import transformers as hf  # here: model_shapes' other users need no transformers

        hf.patch(model, tier=tier)
        try:
            yield tier
        finally:
            hf.unpatch(model)
