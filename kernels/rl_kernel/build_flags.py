"""Compiler flags that are part of the numerical contract (docs/numerics.md), and
the extension's sources.

Pure Python, importable before the extension is built: setup.py (through runpy),
`make kernels-check`, the FMA negative control and the environment fingerprint all
read it, so there is one list of flags. Sources are discovered, never listed: a
compiled tier's folder rl_kernel/<tier>/ holds common/ (the contract's headers and
common/*.cpp) and one folder per family whose <family>_cpu.cpp, <family>_gpu.cu and
<family>_check.cu are found by name.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import sysconfig
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
REPO = PACKAGE.parents[1]  # kernels/rl_kernel -> the repository root
SOURCE_SUFFIXES = (".h", ".cuh", ".cpp", ".cu")  # what a compiled tier's folders hold besides Python


def user_cache(*parts: str) -> Path:
    """$XDG_CACHE_HOME (else ~/.cache) / rl_kernel / parts: where builds and scans kept per user live (the variant
    builds, kernels-check's compiles, the fast tier's SASS), shared by every clone on the machine."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"), "rl_kernel", *parts)


# Host C++ (the CPU golden reference): every mul and add rounded on its own.
CXX_FLAGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-fno-finite-math-only"]

# nvcc: no FMA contraction on device code; IEEE division/sqrt (none is used on exact paths).
NVCC_FLAGS = [
    "-O3",
    "-std=c++17",
    "--fmad=false",
    "--prec-div=true",
    "--prec-sqrt=true",
    "--ftz=false",
    "-Xcompiler=-ffp-contract=off",
]

# hipcc / clang -x hip: the same rules for AMD targets.
HIP_FLAGS = ["-O3", "-std=c++17", "-ffp-contract=off", "-fno-fast-math", "-fno-gpu-flush-denormals-to-zero"]

DEFAULT_ROCM_ARCH = "gfx90a;gfx942;gfx1100"


def extra_flags() -> list[str]:
    """Flags appended from RL_KERNEL_EXTRA_FLAGS (the negative control uses it)."""
    return shlex.split(os.environ.get("RL_KERNEL_EXTRA_FLAGS", ""))


def rocm_arch() -> str:
    """GPU targets for a ROCm build: PYTORCH_ROCM_ARCH, else GPU_TARGETS, else the default."""
    return os.environ.get("PYTORCH_ROCM_ARCH") or os.environ.get("GPU_TARGETS") or DEFAULT_ROCM_ARCH


def _found(root: Path, patterns: tuple[str, ...]) -> list[Path]:
    """Files under root matching the patterns, each group sorted by path (a deterministic order)."""
    return [p for pattern in patterns for p in sorted(root.glob(pattern))]


def sources(gpu: bool, root: Path | None = None) -> list[str]:
    """The extension's sources, relative to the repository root (root, default this checkout): every compiled
    tier's common/*.cpp and every family's *_cpu.cpp, plus every family's *_gpu.cu when gpu."""
    root = REPO if root is None else Path(root)
    package = root / PACKAGE.relative_to(REPO)
    patterns = ("*/common/*.cpp", "*/*/*_cpu.cpp") + (("*/*/*_gpu.cu",) if gpu else ())
    return [p.relative_to(root).as_posix() for p in _found(package, patterns)]


def check_sources() -> list[Path]:
    """Every family's ATen-free kernel instantiations (<tier>/<family>/<family>_check.cu) for kernels-check."""
    return _found(PACKAGE, ("*/*/*_check.cu",))


def contract_files() -> list[Path]:
    """Every C++/CUDA/HIP file of the compiled tiers (headers included), sorted: what a build of them depends on
    (the mutated build's and the FMA control's cache keys hash them)."""
    return sorted(p for p in PACKAGE.glob("*/*/*") if p.suffix in SOURCE_SUFFIXES and p.is_file())


def contract_digest() -> str:
    """sha256 over what a build of the extension compiles: every contract file (its path and its bytes), this
    file and setup.py (the flags and which sources). setup.py records it in the build record (_build.json);
    the wheel test ships make build's extension only when its copy of the tree has the same digest."""
    h = hashlib.sha256()
    for p in [*contract_files(), PACKAGE / "build_flags.py", REPO / "setup.py"]:
        h.update(p.relative_to(REPO).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def prebuilt_differs(library: Path, record: dict) -> str | None:
    """Why the library (an extension built earlier, its build record _build.json next to it) is not what this
    build, whose record is `record`, would compile; None when it is: the records are equal but for the revision
    (the same digest of the compiled sources, flags, torch, compilers and targets), the library is named for this
    Python and was linked after its record was written (setup.py writes the record before compiling: a failed
    compile leaves an older library). setup.py's RL_KERNEL_PREBUILT reads it."""
    built_record = library.with_name("_build.json")
    try:
        built = json.loads(built_record.read_text())
        if library.stat().st_mtime < built_record.stat().st_mtime:
            return "it is older than its build record (its compile failed?)"
    except (OSError, ValueError) as exc:
        return f"no library or build record: {exc}"
    if not library.name.endswith(sysconfig.get_config_var("EXT_SUFFIX")):
        return f"it is not named for this Python ({sysconfig.get_config_var('EXT_SUFFIX')})"
    keys = sorted(k for k in record.keys() | built.keys() if k != "revision" and record.get(k) != built.get(k))
    return f"its build record differs in {', '.join(keys)}" if keys else None


# Contract mutations (rl_kernel.contract.mutations): one extra build, compiled with MUTATION_FLAGS, carries all of
# them behind RL_MUTATED(...) points of exact/common (numerics.h, reduce.h, warptile.cuh) and the families;
# the one to apply is read from RL_KERNEL_MUTATION when the library loads (unset: none). The normal build has
# no code for any of them. The order and spelling must match numerics.h's mutation_from_env().
MUTATIONS = {
    "tree_order": "the row tree's top nodes joined left to right instead of folded from the right "
    "(on the GPU also a warp's shuffle levels in reverse)",
    "flush_boundary": "flush |x| <= 2^-126 instead of |x| < 2^-126",
    "tie_rounding": "fp16/bf16 gradients round ties up instead of to even",
    "exp_constant": "exp_fold's E3 one ulp larger",
    "max_no_nan": "max(a, b) = b > a ? b : a, which drops a NaN b",
}
# Mutations no output can show, with what guards them instead. max_no_nan: a NaN in a row makes its sum of
# exps NaN whatever the max does, so the row is the canonical NaN either way; kernels_check's NaN-dropping
# max/min rule is its guard (on every target's assembly).
EQUIVALENT_MUTATIONS = {"max_no_nan": "kernels_check's NaN-dropping max/min rule (no output can show it)"}
MUTATION_FLAGS = ["-DRL_MUTATIONS"]


def mutation_names() -> tuple[str, ...]:
    """The contract mutations a mutated build (rl_kernel.contract.mutations.build) can apply, by RL_KERNEL_MUTATION."""
    return tuple(MUTATIONS)
