"""rlparity.cell.mismatch: the mismatch metrics on log-probs whose differences are known exactly."""

from __future__ import annotations

import math

import pytest
import torch

from rlparity.cell import mismatch


def test_known_differences():
    old = torch.zeros(2, 3, dtype=torch.float64)
    new = torch.tensor([[0.0, 0.5, -0.5], [1e-10, 2e-3, -3.0]], dtype=torch.float64)
    m = mismatch.metrics(old, new)
    d = new.flatten().tolist()
    assert m["tokens"] == 6.0
    assert m["mean_abs_dlogp"] == pytest.approx(sum(abs(x) for x in d) / 6, rel=1e-15)
    assert m["max_abs_dlogp"] == 3.0
    assert m["k3_kl"] == pytest.approx(sum(math.exp(x) - 1 - x for x in d) / 6, rel=1e-15)
    # ratios exp(0.5)=1.65, exp(-0.5)=0.61, exp(-3)=0.05 fall outside [0.8, 1.2]; 1, 1+1e-10, 1.002 inside
    assert m["clipped_share"] == 3 / 6
    hist = {k.split("/", 1)[1]: v for k, v in m.items() if k.startswith("hist_dlogp/")}
    assert list(hist) == list(mismatch.HIST_BINS)
    want = dict.fromkeys(mismatch.HIST_BINS, 0.0) | {"eq_0": 1.0, "lt_1e-9": 1.0, "1e-3_1e-2": 1.0,
                                                      "1e-1_1e0": 2.0, "ge_1e0": 1.0}  # fmt: skip
    assert hist == want


def test_equal_log_probs_are_all_zero_and_the_mask_selects():
    old = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    m = mismatch.metrics(old, old.clone())
    assert m["mean_abs_dlogp"] == m["max_abs_dlogp"] == m["k3_kl"] == m["clipped_share"] == 0.0
    assert m["hist_dlogp/eq_0"] == 12.0
    new = old.clone()
    new[0, 0] += 5.0
    mask = torch.ones(3, 4, dtype=torch.bool)
    mask[0, 0] = False
    assert mismatch.metrics(old, new, mask)["max_abs_dlogp"] == 0.0
    assert mismatch.metrics(old, new)["max_abs_dlogp"] > 4.0


def test_shapes_must_agree():
    with pytest.raises(ValueError, match="different shapes"):
        mismatch.metrics(torch.zeros(2), torch.zeros(3))
