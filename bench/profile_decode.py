"""Where a decode-sized call spends its time: torch.profiler's per-kernel device times, the host time of
one call, and one synchronised replay of a CUDA graph of it, for rl_kernel's token_logprobs and a device
copy at 1, 16 and 256 rows of 151936 (bf16).

    python bench/profile_decode.py [--vocab 151936] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import rl_kernel  # noqa: F401  (registers torch.ops.rl_kernel)


def host_us(fn, reps: int = 200) -> float:
    """Median host time of one call (no synchronisation inside: the launch path only)."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def kernels_us(fn, reps: int = 50) -> dict[str, float]:
    """Mean device time per call of each kernel fn launches."""
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            out[e.key[:90]] = t / reps
    return out


def graph_us(fn, reps: int = 200) -> float:
    """Median wall time of one replay of a CUDA graph of fn, synchronised (how a rollout engine that captures
    its decode step in a graph pays for it: no launch path on the host)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        g.replay()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no GPU", file=sys.stderr)
        return 2
    ops = torch.ops.rl_kernel
    results = []
    for rows in (1, 16, 256):
        x = (torch.randn(rows, args.vocab, device="cuda") * 2.5).to(torch.bfloat16)
        t = torch.randint(0, args.vocab, (rows,), device="cuda")
        dst = torch.empty_like(x)
        fns = {
            "copy": lambda d=dst, v=x: d.copy_(v),
            "rl token_logprobs": lambda v=x, k=t: ops.token_logprobs(v, k, -100),
        }
        for name, fn in fns.items():
            for _ in range(5):
                fn()
            r = {"rows": rows, "contender": name, "host_us": host_us(fn), "kernels_us": kernels_us(fn)}
            r["graph_replay_synced_us"] = graph_us(fn)
            results.append(r)
            ks = ", ".join(f"{k} {v:.1f}" for k, v in r["kernels_us"].items())
            print(
                f"{rows:4} {name:20} host {r['host_us']:6.1f} us  graph replay (synced) "
                f"{r['graph_replay_synced_us']:6.1f} us  device: {ks}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
