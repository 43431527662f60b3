"""The model workload: a Hugging Face model's rollout (generate) and its trainer (teacher-forced forwards and
GRPO steps) over the Rollout / StepResult data of rlparity.cell.workloads.model, for Llama, Qwen2 and Qwen3; its suite
is rlparity/cell/suite/test_model.py."""

from __future__ import annotations

from typing import Any

from rlparity.cell.workloads import SUITE_DIR, Workload

# The workload's parameters and their defaults: the model's shape (intermediate 0: twice the hidden size) and
# the trainer's GRPO steps and micro-batch size. (Here, not in rlparity.cell.workloads.model: the device probe reads
# this descriptor without importing transformers.)
# The rollout mode (rl_kernel.integrations.generation.ROLLOUT_MODES): eager generate(), a static cache, or the
# static cache with transformers' compiled decode step.
MODEL_DEFAULTS = {"layers": 2, "hidden": 64, "heads": 4, "intermediate": 0, "steps": 2, "micro": 3, "rollout": "eager"}


def golden(shape: tuple[int, int, int], dtype: str, seed: int, params: dict[str, Any], tier: str) -> dict[str, str]:
    """Every family's digests (sequences, rollout logits, first-step log-probs and weights) on the CPU."""
    from rlparity.cell.workloads import model as M

    out = {}
    for family in M.FAMILIES:
        for what, d in M.golden_outputs(*M.rl_step(family, shape, dtype, seed, "cpu", tier, **params)).items():
            out[f"{family}/{what}"] = d
    return out


WORKLOAD = Workload(
    name="model",
    suite=(SUITE_DIR / "test_model.py",),
    golden=golden,
    params=dict(MODEL_DEFAULTS),
    needs=("linear", "attention", "rms_norm", "token_logprobs"),
    description="a Hugging Face Llama / Qwen2 / Qwen3: generate() vs the training forward, and GRPO steps",
)
