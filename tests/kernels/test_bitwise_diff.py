"""rl_kernel.bitwise.diff's verdict and diagnostics: what a mismatch report tells a person."""

from __future__ import annotations

import pytest
import torch

from rl_kernel.bitwise import bits_equal, diff


def _bits(*values: int) -> torch.Tensor:
    """float32 values from their bit patterns (unsigned, as written)."""
    return torch.tensor(values, dtype=torch.int64).to(torch.int32).view(torch.float32)


def test_ulp_distance_counts_across_zero() -> None:
    """The distance is in ulps of the ordered bit patterns: -0 and +0 are 0 ulp apart (yet differ in bits), the
    smallest negative and positive denormals 2, 1.0 and its successor 1."""
    d = diff(_bits(0x3F800000, 0x80000000, 0x80000001), _bits(0x3F800001, 0x00000000, 0x00000001))
    assert not d.equal and d.count == 3 and d.max_ulp == 2
    assert d.first_index == (0,) and (d.first_a, d.first_b) == (1.0, _bits(0x3F800001).item())
    assert diff(_bits(0x80000000), _bits(0x00000000)).max_ulp == 0
    assert not bits_equal(_bits(0x80000000), _bits(0x00000000))


def test_max_abs_is_over_mismatched_finite_elements() -> None:
    """Only differing elements where both sides are finite count; none such gives inf, not a 0 from an equal one."""
    nan = float("nan")
    d = diff(torch.tensor([nan, 1.0, 3.0]), torch.tensor([1.0, 1.0, 3.5]))
    assert (d.count, d.max_abs, d.first_index) == (2, 0.5, (0,))
    assert diff(torch.tensor([nan, 1.0]), torch.tensor([1.0, 1.0])).max_abs == float("inf")


def test_equal_and_bad_input() -> None:
    a = torch.tensor([1.0, -0.0, float("nan")], dtype=torch.bfloat16)
    assert diff(a, a.clone()).equal and diff(a, a.clone()).summary() == "bitwise equal (3 elements)"
    with pytest.raises(ValueError, match="shapes"):
        diff(a, a[:2])
    with pytest.raises(ValueError, match="dtypes"):
        diff(a, a.float())
