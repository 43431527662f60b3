"""Shared test set-up: the devices to run on, and the GPU skip.

A test that takes a `device` argument runs once per entry of `devices()`: on the CPU
always, and also on the GPU when there is one and rl_kernel was built with GPU kernels.
A test marked `@pytest.mark.gpu` is skipped on a machine without a CUDA/ROCm GPU.
"""

from __future__ import annotations

import pytest
import torch

import rl_kernel

NO_GPU = "no CUDA/ROCm GPU on this machine"
requires_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_GPU)


def devices() -> list[str]:
    """ "cpu", plus "cuda" (which is also ROCm/HIP) when a GPU and the GPU kernels are there."""
    found = ["cpu"]
    if torch.cuda.is_available() and rl_kernel.has_gpu_kernels():
        found.append("cuda")
    return found


@pytest.fixture(params=devices())
def device(request: pytest.FixtureRequest) -> str:
    return request.param


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(requires_gpu)
