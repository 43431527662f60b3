"""The fast tier on this GPU (NVIDIA or AMD): bitwise properties, accuracy, a tile sweep, speed against the BLAS.

    python -m bench fast_tier [--sweep] [--sweep2] [--tma] [--no-speed] [--small] [--json out.json]

The checks (bench.fast_checks: bits compared as integer views) run first: linear forward/dX rows equal across M
buckets, batch order, run to run, dW/db run to run, accuracy against float64, autograd, torch.compile; attention
decode == prefill rows, chunks, a sequence alone, another left padding, run to run, backward. --sweep and --sweep2
time candidate tiles (bench.fast_sweep: what chose configs.toml's buckets; every tile must give the same bits).
Then the speed with the pinned configs (bench.fast_speed) against the vendor BLAS and SDPA's flash backend. The
configs are this GPU's target's (rl_kernel.fast.configs for rl_kernel.tiers.target_of: sm_90, gfx942, ...). The
JSON goes to --json, else to $OUT/fast.json ($OUT/fast_small.json for --small) when $OUT is set. Exit 1 when a
check failed. The record of the first H200 run: bench/fast_notes.md.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from pathlib import Path

import torch

from bench import environment, gpu_missing, parser
from bench.fast_checks import (
    FAILED,
    RESULTS,
    attention_correctness,
    linear_autograd_and_compile,
    linear_correctness,
    target,
)
from bench.fast_speed import speed_attention, speed_linear, table
from bench.fast_sweep import sweep2, sweep_attention, sweep_linear, sweep_tma


def arguments(argv: list[str] | None):
    p = parser(__name__, __doc__)
    p.add_argument("--sweep", action="store_true", help="time candidate tiles (chooses configs.toml's buckets)")
    p.add_argument("--sweep2", action="store_true", help="forward BLOCK_K 64/128 tiles, dW tiles, D=64/256")
    p.add_argument("--tma", action="store_true", help="the persistent TMA GEMM against the pinned kernel and cuBLAS")
    p.add_argument("--no-speed", action="store_true")
    p.add_argument("--small", action="store_true", help="only the linear's speed at M = 1, 16, 64, 256 (no checks)")
    p.add_argument("--json", help="where the results go (default: $OUT/fast.json when $OUT is set)")
    return p.parse_args(argv)


def write(results: dict, path: str | None, default: str) -> None:
    out = path or (os.path.join(os.environ["OUT"], default) if os.environ.get("OUT") else None)
    if out:
        Path(out).write_text(json.dumps(results, indent=1))


def main(argv: list[str] | None = None) -> int:
    args = arguments(argv)
    if gpu_missing("fast_tier"):
        return 2
    import triton

    RESULTS["env"] = environment() | {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "target": target(),
        "triton": triton.__version__,
    }
    print(RESULTS["env"], flush=True)
    t0 = time.time()
    if args.small:
        speed_linear((1, 16, 64, 256))
        print(table())
        print("graph errors:", list(RESULTS.get("graph_errors", {}).items())[:3])
        write(RESULTS, args.json, "fast_small.json")
        return 0
    linear_correctness()
    linear_correctness(torch.float16, ((4096, 4096),))
    linear_autograd_and_compile()
    attention_correctness()
    print(f"correctness: {time.time() - t0:.0f} s", flush=True)
    if args.sweep:
        sweep_linear()
        sweep_attention()
        print(f"sweep done: {time.time() - t0:.0f} s", flush=True)
    if args.tma:
        sweep_tma()
        print(f"tma sweep done: {time.time() - t0:.0f} s", flush=True)
    if args.sweep2:
        sweep2()
        print(f"sweep2 done: {time.time() - t0:.0f} s", flush=True)
    if not args.no_speed:
        speed_linear()
        speed_attention()
    RESULTS["failed"] = FAILED
    print(table())
    print(f"FAILED checks: {FAILED}" if FAILED else "all checks passed", f"({time.time() - t0:.0f} s)")
    write(RESULTS, args.json, "fast.json")
    return 1 if FAILED else 0
