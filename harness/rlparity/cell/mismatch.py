"""Mismatch metrics between two sets of per-token log-probs (the rollout's `old` and the trainer's `new`), as the
RL frameworks report them (verl's rollout_corr, prime-rl's mismatch_kl): what a rollout/training mismatch does to
PPO/GRPO. Pure: tensors in, a flat {name: float} out (for Recorder.metric), computed in float64 on the CPU.

- mean_abs_dlogp, max_abs_dlogp: |d| with d = new - old
- k3_kl: mean(exp(d) - 1 - d), Schulman's k3 estimator of KL(old || new) from the sampled tokens
- clipped_share: the share of importance ratios exp(d) outside [1 - clip, 1 + clip]
- hist_dlogp/<bin>: how many tokens' |d| fall in each fixed bin (HIST_BINS: 0, then decades of log10 |d|)
"""

from __future__ import annotations

import itertools

import torch

CLIP = 0.2
# Fixed |dlogp| bins, so that histograms of different cells and nights add up: exactly 0, the decades
# [1e-k, 1e-(k-1)) for k = 9 .. 1 (below 1e-9: "lt_1e-9"), and ">= 1".
DECADES = tuple(range(-9, 1))  # bin edges 1e-9 .. 1e0
HIST_BINS = ("eq_0", "lt_1e-9", *(f"1e{lo}_1e{lo + 1}" for lo in DECADES[:-1]), "ge_1e0")


def histogram(abs_d: torch.Tensor) -> dict[str, int]:
    """Counts of |dlogp| (float64, >= 0) in HIST_BINS."""
    x = abs_d.flatten().double()
    zero = x == 0
    out = {"eq_0": int(zero.sum())}
    rest = x[~zero]
    edges = [10.0**e for e in DECADES]
    out["lt_1e-9"] = int((rest < edges[0]).sum())
    for lo, (a, b) in zip(DECADES[:-1], itertools.pairwise(edges), strict=True):
        out[f"1e{lo}_1e{lo + 1}"] = int(((rest >= a) & (rest < b)).sum())
    out["ge_1e0"] = int((rest >= edges[-1]).sum())
    return out


def metrics(old: torch.Tensor, new: torch.Tensor, mask: torch.Tensor | None = None, clip: float = CLIP) -> dict:
    """The mismatch of `new` against `old` (same shape) over the positions of `mask` (all when None)."""
    if old.shape != new.shape:
        raise ValueError(f"log-probs of different shapes: {tuple(old.shape)} vs {tuple(new.shape)}")
    old, new = old.detach().double().cpu(), new.detach().double().cpu()
    if mask is not None:
        keep = mask.detach().cpu().bool()
        old, new = old[keep], new[keep]
    d = (new - old).flatten()
    if d.numel() == 0:
        raise ValueError("no tokens to compare")
    abs_d, ratio = d.abs(), torch.exp(d)
    out = {
        "tokens": float(d.numel()),
        "mean_abs_dlogp": float(abs_d.mean()),
        "max_abs_dlogp": float(abs_d.max()),
        "k3_kl": float((ratio - 1 - d).mean()),
        "clipped_share": float(((ratio < 1 - clip) | (ratio > 1 + clip)).double().mean()),
    }
    out.update({f"hist_dlogp/{k}": float(v) for k, v in histogram(abs_d).items()})
    return out
