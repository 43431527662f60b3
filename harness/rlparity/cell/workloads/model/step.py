"""One RL step of the model workload: the rollout engine, then the trainer, on a fresh model patched in a tier."""

from __future__ import annotations

from rlparity.cell.workloads.model.rollout import Rollout, generate, patched, prompts
from rlparity.cell.workloads.model.trainer import StepResult, train
from rlparity.cell.workloads.model.workload import MODEL_DEFAULTS


def rl_step(
    family: str, shape: tuple[int, int, int], dtype: str, seed: int, device, tier: str = "exact", **params: int | str
) -> tuple[Rollout, StepResult]:
    """The whole step for one family and shape [batch, new tokens, vocab]: a fresh model patched in the tier, a
    sampled rollout, GRPO steps (params: MODEL_DEFAULTS' keys, the defaults where not given)."""
    p = prompts(shape[0], shape[2], seed)
    model = patched(family, shape[2], dtype, seed, device, tier, **params)
    r = generate(model, p, shape[1], seed + 1, device, {**MODEL_DEFAULTS, **params}["rollout"])
    steps = {k: v for k, v in {**MODEL_DEFAULTS, **params}.items() if k in ("steps", "micro")}
    return r, train(model, r, p, device, seed, **steps)
