"""Loads the compiled operators (torch.ops.rl_kernel.*): the extension _C, or another
build of the same operators named by RL_KERNEL_LIBRARY."""

from __future__ import annotations

import importlib
import json
import os
import sysconfig
import warnings
from pathlib import Path

import torch

# The build record setup.py writes next to _C (compilers, flags, and the torch the extension was built against).
BUILD_RECORD = Path(__file__).with_name("_build.json")
# This interpreter's build of _C (a tree may hold another Python's too: _C.cpython-312-... beside -311-).
EXTENSION = Path(__file__).with_name(f"_C{sysconfig.get_config_var('EXT_SUFFIX')}")
REBUILD = (
    "rebuild rl_kernel against the installed torch from the repository root with `make build` "
    "(or `pip install --no-build-isolation -e .`), or install the torch it was built for"
)


def built_torch(record: Path = BUILD_RECORD) -> str | None:
    """The torch version the extension was built against (the build record's), None without a readable one."""
    try:
        return json.loads(record.read_text()).get("torch") or None
    except (OSError, ValueError, AttributeError):
        return None


def _major_minor(version: str) -> tuple[str, ...]:
    return tuple(version.split("+")[0].split(".")[:2])


def check_torch_version(built: str | None, running: str) -> None:
    """The extension's torch against the running one. A different major.minor is refused (ImportError): torch
    keeps no C++ ABI across minor releases, so _C fails to load or, worse, loads and misbehaves. A difference
    in the patch release or the local tag (+cpu, +cu128) is only warned about: the ABI holds within a minor
    release, but another build of torch is not the one the digests were checked with. Both name both versions."""
    if built is None or built == running:
        return
    what = f"rl_kernel's extension was built against torch {built}, but torch {running} is installed"
    if _major_minor(built) != _major_minor(running):
        raise ImportError(f"{what}: {REBUILD}")
    warnings.warn(f"{what} (same minor release; {REBUILD} to be sure)", RuntimeWarning, stacklevel=3)


# RL_KERNEL_LIBRARY loads another build of the same operators instead of _C: the harness's
# negative controls (rlparity selftest) use it to run a deliberately wrong build in a fresh process.
_library = os.environ.get("RL_KERNEL_LIBRARY")
if _library:
    if not os.path.isfile(_library):
        raise ImportError(f"RL_KERNEL_LIBRARY={_library!r} is not a file")
    torch.ops.load_library(_library)
else:
    check_torch_version(built_torch(), torch.__version__)  # before _C: a wrong torch's symbols fail to load there
    try:
        importlib.import_module(f"{__package__}._C")  # the compiled extension: registers torch.ops.rl_kernel
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
