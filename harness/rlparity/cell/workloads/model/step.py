"""One RL step of the model workload: the rollout engine, then the trainer, on a fresh model patched in a tier."""

from __future__ import annotations

from rl_kernel.tiers import Tier
from rlparity.cell.workloads.model.rollout import BATCHED, Rollout, generate, patched, prompts
from rlparity.cell.workloads.model.trainer import StepResult, train
from rlparity.cell.workloads.model.workload import MODEL_DEFAULTS


def rl_step(
    family: str,
    shape: tuple[int, int, int],
    dtype: str,
    seed: int,
    device,
    tier: str | Tier = "exact",
    **params: int | str,
) -> tuple[Rollout, StepResult]:
    """The whole step for one family and shape [batch, new tokens, vocab]: a fresh model patched in the tier, a
    sampled rollout, GRPO steps (params: MODEL_DEFAULTS' keys, the defaults where not given)."""
    p = prompts(shape[0], shape[2], seed)
    model = patched(family, shape[2], dtype, seed, device, tier, **params)
    # The step's rollout is sampled by rl_kernel's Gumbel sampler, which transformers' engine does not run: a batched
    # cell trains on generate()'s rollout (its engine's rollout is test_model's check against the forward).
    mode = {**MODEL_DEFAULTS, **params}["rollout"]
    r = generate(model, p, shape[1], seed + 1, device, "eager" if mode == BATCHED else mode)
    steps = {k: v for k, v in {**MODEL_DEFAULTS, **params}.items() if k in ("steps", "micro")}
    return r, train(model, r, p, device, seed, **steps)
