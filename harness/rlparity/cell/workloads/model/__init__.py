"""The model workload: an RL step over a real Hugging Face model, as the frameworks run it, in two engines over
shared data: the rollout (rollout.py: generate() and a continuous-batching replay -> Rollout) and the trainer
(trainer.py: GRPO steps over the Rollout -> StepResult). Its descriptor is workload.py, its suite
rlparity/cell/suite/test_model.py, which checks that the rollout's logits equal the training forward's bit for
bit, that every importance ratio of the first step is exactly 1.0, and that two runs give the same weights; the
unpatched model beside it is the stock control. A shape [batch, new tokens, vocab] runs for every family.
"""

from __future__ import annotations

import importlib
from typing import Any

# Where each public name lives. Resolved on first use (PEP 562): the device probe imports this package for its
# descriptor (workload.py) and must not pay for transformers.
_MODULES = {
    "rollout": (
        "BATCHED", "CLIP", "FAMILIES", "MAX_PROMPT", "PAD", "EngineRollout", "Prompts", "Rollout", "build",
        "completion_logits", "config", "continuous_batching", "drift", "engine_rollout", "forward_views", "full_mask",
        "generate", "padded", "patched", "prompts", "stock", "unpadded",
    ),
    "trainer": (
        "GOLDEN_OUTPUTS", "LEARNING_RATE", "StepResult", "advantages", "completion_mask", "golden_outputs",
        "grpo_loss", "micro_logprobs", "train",
    ),
    "step": ("rl_step",),
    "workload": ("MODEL_DEFAULTS",),
}  # fmt: skip
_WHERE = {name: module for module, names in _MODULES.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
