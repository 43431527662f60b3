"""The Hugging Face models the benchmarks build, by name: random weights from a seed, no download.

    qwen3-1.7b  Qwen3-1.7B's shape: 28 layers, hidden 2048, 16 query / 8 KV heads of 128, MLP 6144, vocab 151936
    qwen3-8b    Qwen3-8B's shape: 36 layers, hidden 4096, 32 query / 8 KV heads of 128, MLP 12288, vocab 151936,
                the LM head tied to the embedding
    tiny        2 layers, hidden 64, 4 / 2 heads, MLP 128, vocab 512: a CPU run that checks a script, not a speed

Each config is rl_kernel.models.tiny_config's (the family's own features: Qwen3's q/k norms), with the KV heads and
the tying the shape names where tiny_config's defaults (heads / 2 KV heads, Qwen3 untied) differ. A shape
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

    def dims(self) -> dict[str, int]:
        """tiny_config's shape arguments."""
        return dict(layers=self.layers, hidden=self.hidden, heads=self.heads, intermediate=self.intermediate)


SHAPES = {
    "qwen3-1.7b": Shape("qwen3", 151936, layers=28, hidden=2048, heads=16, kv_heads=8, intermediate=6144),
    "qwen3-8b": Shape("qwen3", 151936, layers=36, hidden=4096, heads=32, kv_heads=8, intermediate=12288, tied=True),
    "tiny": Shape("qwen3", 512, layers=2, hidden=64, heads=4, kv_heads=2, intermediate=128),
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
    return cfg


def _tiny_configs_own(s: Shape) -> bool:
    base = tiny_config(s.family, s.vocab, **s.dims())
    return (base.num_key_value_heads, bool(base.tie_word_embeddings)) == (s.kv_heads, s.tied)


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
