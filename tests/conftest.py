"""Shared test set-up: the devices to run on, the GPU skip, and the Docker engine of the container tests.

A test that takes a `device` argument runs once per entry of `devices()`: on the CPU
always, and also on the GPU when there is one and rl_kernel was built with GPU kernels.
A test marked `@pytest.mark.gpu` is skipped on a machine without a CUDA/ROCm GPU.
"""

from __future__ import annotations

import fcntl
import os

import pytest
import torch

import rl_kernel
from rlparity import images

from tooling import require

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


CONTAINERS = {"client", "cpu_image"}  # fixtures of the container tests (the Docker engine): slow by nature


@pytest.hookimpl(tryfirst=True)  # before `-m`'s selection: `-m gpu` must find every test that needs the GPU
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if needs_gpu(item):
            item.add_marker(pytest.mark.gpu)
            item.add_marker(requires_gpu)
        if CONTAINERS & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    mark_the_loop(items)
    # The longest tests first (`slow(minutes=True)`: builds, containers, compiles for every target), then the slow
    # ones: xdist hands tests out one at a time in this order (--maxschedchunk 1), and a long test that starts
    # last would set the end of the run.
    items.sort(key=_order)


def mark_the_loop(items: list[pytest.Item]) -> None:
    """`loop` (make test-fast, the developer's loop): each test function's first case that is neither slow nor
    gpu, so every property of every family and harness module is tried once; `make test` runs every case."""
    seen: set[tuple[str, str]] = set()
    for item in items:
        key = (item.nodeid.split("::")[0], getattr(item, "originalname", item.name))
        if key in seen or item.get_closest_marker("slow") or item.get_closest_marker("gpu"):
            continue
        seen.add(key)
        item.add_marker(pytest.mark.loop)


def needs_gpu(item: pytest.Item) -> bool:
    """Marked `gpu` (the test, or one of its parameters), or run with a parameter device = "cuda"."""
    if item.get_closest_marker("gpu") is not None:
        return True
    spec = getattr(item, "callspec", None)
    return spec is not None and spec.params.get("device") == "cuda"


def _order(item: pytest.Item) -> int:
    slow = item.get_closest_marker("slow")
    return 2 if slow is None else 0 if slow.kwargs.get("minutes") else 1


# ---- the Docker engine (CI provides it: .ci/run) and the rlparity:cpu image built from this checkout ----
CPU_TAG = images.project_tag("cpu")


@pytest.fixture(scope="session")
def client():
    try:
        import docker

        c = docker.from_env()
        c.ping()
    except Exception as exc:
        require("a Docker engine", False, f"none reachable: {exc}")
    return c


@pytest.fixture(scope="session")
def cpu_image(client):
    """rlparity:cpu built from this checkout (by .ci/run, or here once, under a lock for xdist workers)."""
    with open("/tmp/rlparity-cpu-image.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return client.images.get(CPU_TAG)
        except Exception:
            pass
        extra = {"TORCH_INDEX_URL": os.environ.get("TORCH_INDEX_URL", "")}
        images.build(client, "cpu", extra)
        return client.images.get(CPU_TAG)
