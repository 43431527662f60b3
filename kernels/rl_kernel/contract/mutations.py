"""The contract-mutation build: one alternative library that carries every mutation of
build_flags.mutation_names() behind compile-time points (`-DRL_MUTATIONS`), one of which is switched on
per process by RL_KERNEL_MUTATION (unset: none, and the library gives the golden bits).

    python -m rl_kernel.contract.mutations build [--gpu] [--cache DIR]   # prints the library's path
    RL_KERNEL_LIBRARY=PATH RL_KERNEL_MUTATION=tree_order python -m rl_kernel.contract.golden   # exit 1: drift seen

The golden digests must see every mutation but max_no_nan (docs/architecture.md, "Mutations"), which
tests/kernels/test_mutations.py proves. `rlparity selftest --mutations` uses build() below.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from rl_kernel import build_flags

LIBRARY_NAME = "rl_kernel_mutations"


def default_cache() -> Path:
    return build_flags.user_cache()


def build_spec(gpu: bool = False, hip: bool | None = None) -> dict:
    """Sources and flags of the mutated build: the normal build's (build_flags) plus MUTATION_FLAGS."""
    if hip is None:
        import torch

        hip = bool(torch.version.hip)
    sources = [str(build_flags.REPO / s) for s in build_flags.sources(gpu)]
    cxx = [*build_flags.CXX_FLAGS, *build_flags.MUTATION_FLAGS]
    device: list[str] = []
    if gpu:
        device = [*(build_flags.HIP_FLAGS if hip else build_flags.NVCC_FLAGS), *build_flags.MUTATION_FLAGS]
    return {"sources": sources, "cxx": cxx, "device": device}


def build(gpu: bool = False, cache: Path | None = None) -> Path:
    """Compile the mutated library (CPU operators; with gpu=True also the CUDA/HIP kernels) and return its
    path (build_variant: cached, so a second call is instant)."""
    return build_variant(f"mutations-{'gpu' if gpu else 'cpu'}", LIBRARY_NAME, build_spec(gpu), cache)


def variant_key(spec: dict) -> str:
    """A variant build's cache key: every contract file's bytes and the spec, the checkout's own folder left out of
    the spec's source paths (another clone of the same sources shares the build)."""
    text = b"".join(p.read_bytes() for p in build_flags.contract_files())
    where = json.dumps(spec, sort_keys=True).replace(str(build_flags.REPO), "<repo>")
    return hashlib.sha256(text + where.encode()).hexdigest()[:12]


def build_variant(kind: str, name: str, spec: dict, cache: Path | None = None) -> Path:
    """Compile a variant of the library, spec = {"sources", "cxx", "device"} (the mutated build, the harness's
    contracted-FMA control), and return the shared library's path. Built in a subprocess (loading it into this
    process would register torch.ops.rl_kernel twice) with torch.utils.cpp_extension.load, and cached under
    cache (default ~/.cache/rl_kernel) by a hash of every C++/CUDA/HIP file of the compiled tiers and of the
    spec (variant_key)."""
    out = (default_cache() if cache is None else Path(cache)) / f"{kind}-{variant_key(spec)}"
    lib = out / f"{name}.so"
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:  # one build per key, however many processes ask at once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not lib.exists():
            _compile(name, spec, out, lib)
    return lib


def _compile(name: str, spec: dict, out: Path, lib: Path) -> None:
    code = (
        "import json, sys, torch.utils.cpp_extension as E; s = json.loads(sys.argv[1]); "
        "E.load(name=sys.argv[3], sources=s['sources'], extra_cflags=s['cxx'], "
        "extra_cuda_cflags=s['device'], build_directory=sys.argv[2], is_python_module=False, verbose=False)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec), str(out), name], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0 or not lib.exists():
        raise RuntimeError(f"building {name} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")


def env(library: Path, mutation: str | None) -> dict[str, str]:
    """The environment of a process that runs the mutated library with one mutation (None: none)."""
    if mutation is not None and mutation not in build_flags.mutation_names():
        raise ValueError(f"unknown mutation {mutation!r}; known: {', '.join(build_flags.mutation_names())}")
    e = dict(os.environ, RL_KERNEL_LIBRARY=str(library))
    e.pop("RL_KERNEL_MUTATION", None)
    if mutation is not None:
        e["RL_KERNEL_MUTATION"] = mutation
    return e


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="compile the mutated library and print its path")
    b.add_argument("--gpu", action="store_true", help="also the CUDA/HIP kernels")
    b.add_argument("--cache", type=Path, default=None, help=f"cache directory (default {default_cache()})")
    sub.add_parser("list", help="print the mutation names")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for name, what in build_flags.MUTATIONS.items():
            print(f"{name}: {what}")
        return 0
    print(build(gpu=args.gpu, cache=args.cache))
    return 0


if __name__ == "__main__":
    sys.exit(main())
