"""bench: the GPU benchmarks and diagnoses of rl_kernel, one entry point for all of them.

    python -m bench --list                 # every benchmark with its one-line description
    python -m bench <benchmark> [args]     # e.g. python -m bench row --quick; <benchmark> --help for its options
    make bench BENCH=<benchmark> ARGS="..."

A benchmark is a module of this package that defines `main(argv) -> int` (its exit status); `python -m bench`
finds it by its module name, so adding one edits no list. The other modules serve them: timing.py (the one timer:
synced and queued medians, in seconds), contenders.py (the baselines, by name), model_shapes.py (the Qwen3-shaped
models by name), rollout.py (prompts, generate() keeping its logits, the training forward's views) and the fast
tier's checks, sweep and speed (fast_checks, fast_sweep, fast_speed). gpu_round.sh is one device call's round on an
NVIDIA or AMD machine (build, parity, gate, benchmarks).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def parser(module: str, doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's argument parser: `python -m bench <name>` as its program, its module docstring as the help."""
    name = module.rpartition(".")[2]
    return argparse.ArgumentParser(
        prog=f"python -m bench {name}", description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def environment() -> dict[str, Any]:
    """What a result records of where it ran: the device, torch, and its CUDA or HIP version."""
    import torch

    gpu = torch.cuda.is_available()
    return {
        "device": torch.cuda.get_device_name() if gpu else "cpu",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
    }


def publish(text: str, record: dict, json_path: str | None, markdown_path: str | None = None) -> None:
    """Print a benchmark's table, then write its record as JSON and the table as Markdown where asked."""
    import json

    print(text)
    if json_path:
        with open(json_path, "w") as f:
            json.dump(record, f, indent=1)
    if markdown_path:
        with open(markdown_path, "w") as f:
            f.write(text + "\n")


def gpu_missing(name: str) -> bool:
    """True (with the reason on stderr) when no CUDA or ROCm device is present: the benchmark then exits 2."""
    import torch

    if torch.cuda.is_available():
        return False
    print(f"bench {name}: needs a CUDA or ROCm GPU (torch.cuda.is_available() is False)", file=sys.stderr)
    return True
