"""Loads the compiled operators (torch.ops.rl_kernel.*): the extension _C, or another
build of the same operators named by RL_KERNEL_LIBRARY."""

from __future__ import annotations

import os

import torch

# RL_KERNEL_LIBRARY loads another build of the same operators instead of _C: the harness's
# negative controls (rlparity selftest) use it to run a deliberately wrong build in a fresh process.
_library = os.environ.get("RL_KERNEL_LIBRARY")
if _library:
    if not os.path.isfile(_library):
        raise ImportError(f"RL_KERNEL_LIBRARY={_library!r} is not a file")
    torch.ops.load_library(_library)
else:
    try:
        from rl_kernel import _C  # noqa: F401  (registers torch.ops.rl_kernel)
    except ImportError as exc:  # pragma: no cover - exercised only on a broken install
        raise ImportError(
            "rl_kernel's compiled extension is missing. Build it from the repository root with "
            "`make build` (or `pip install --no-build-isolation -e .`)."
        ) from exc

ops = torch.ops.rl_kernel

# torch < 2.4 calls it impl_abstract.
register_fake = getattr(torch.library, "register_fake", None) or torch.library.impl_abstract


def has_gpu_kernels() -> bool:
    """True when this build carries the CUDA/HIP kernels (torch's CUDA key serves both)."""
    return torch._C._dispatch_has_kernel_for_dispatch_key("rl_kernel::log_softmax", "CUDA")
