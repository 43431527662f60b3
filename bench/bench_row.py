"""Row kernels against the read floor and every baseline a user would pick, side by side in one process.

    python bench/bench_row.py [--vocab 151936] [--json out.json]

For each dtype and row count, every contender is timed two ways: queued (CUDA events around each call,
all repetitions round-robin, one synchronisation at the end) and synced (a host synchronisation before
and after every call, wall clock). Figures are medians. The read floor is half a device copy of the
logits (a copy reads and writes them once; a log-prob kernel only reads them), so x floor = floor time /
contender time, 1.0 being the memory system's limit. Contenders: the device copy, rl_kernel's
token_logprobs, entropy and log_softmax, stock PyTorch (log_softmax + gather), torch.compile of
gather - logsumexp (static shapes), and Liger's fused cross-entropy (reduction none; it writes its
gradient into its input, so it gets a copy of the logits of its own). Then a vocab-parallel rank's own
kernel (bf16, 4096 rows, Megatron's cut at tp 2, 4, 8) against a copy of its slice.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

import rl_kernel  # noqa: F401  (registers torch.ops.rl_kernel)

ROWS = {torch.bfloat16: (1, 16, 256, 4096, 16384), torch.float32: (1, 256, 4096)}
QUICK = {torch.bfloat16: (1, 4096), torch.float32: (4096,)}


def queued(fns: dict, reps: int) -> dict[str, float]:
    events: dict[str, list] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            events[k].append((a, b))
    torch.cuda.synchronize()
    return {k: statistics.median(a.elapsed_time(b) * 1e-3 for a, b in v) for k, v in events.items()}


def synced(fns: dict, reps: int) -> dict[str, float]:
    times: dict[str, list] = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            times[k].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def liger():
    try:
        from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
    except Exception as exc:
        print(f"liger-kernel not available: {exc}", file=sys.stderr)
        return None

    def ce(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        out = LigerCrossEntropyFunction.apply(x, t, None, -100, 0.0, 0.0, "none")
        return out[0] if isinstance(out, tuple) else out

    return ce


def contenders(x: torch.Tensor, t: torch.Tensor, lig) -> dict:
    ops = torch.ops.rl_kernel
    dst = torch.empty_like(x)
    xl = x.clone()

    def gather_lse(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return xf.gather(-1, t[:, None]).squeeze(-1) - torch.logsumexp(xf, -1)

    compiled = torch.compile(gather_lse, dynamic=False)
    fns = {
        "copy": lambda: dst.copy_(x),
        "rl token_logprobs": lambda: ops.token_logprobs(x, t, -100),
        "rl entropy": lambda: ops.entropy(x),
        "rl log_softmax": lambda: ops.log_softmax(x),
        "torch log_softmax+gather": lambda: torch.log_softmax(x.float(), -1).gather(-1, t[:, None]),
        "torch log_softmax": lambda: torch.log_softmax(x.float(), -1),
        "torch.compile gather-logsumexp": lambda: compiled(x, t),
    }
    if lig is not None:
        fns["liger cross_entropy"] = lambda: lig(xl, t)
    return fns


def measure(dtype: torch.dtype, rows: int, vocab: int, lig, rl_only: bool = False) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(rows)
    x = (torch.randn(rows, vocab, device="cuda", generator=g) * 2.5).to(dtype)
    t = torch.randint(0, vocab, (rows,), device="cuda", generator=g)
    fns = contenders(x, t, lig)
    if rl_only:
        fns = {k: v for k, v in fns.items() if k == "copy" or k.startswith("rl ")}
    for fn in fns.values():  # warm-up (compiles, autotunes)
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    reps = 200 if rows <= 256 else 40
    q, s = queued(fns, reps), synced(fns, reps)
    name = str(dtype).removeprefix("torch.")
    out = []
    for k in fns:
        out.append(
            {
                "dtype": name,
                "rows": rows,
                "vocab": vocab,
                "contender": k,
                "queued_ms": q[k] * 1e3,
                "synced_ms": s[k] * 1e3,
                "x_floor_queued": (q["copy"] / 2) / q[k],
                "x_floor_synced": (s["copy"] / 2) / s[k],
                "vs_copy_synced": s[k] / s["copy"],
            }
        )
    del x, fns
    torch.cuda.empty_cache()
    return out


def measure_ranks(dtype: torch.dtype, rows: int, vocab: int, tps: tuple[int, ...]) -> list[dict]:
    """A vocab-parallel rank's own kernel (rl_kernel.rowtree.local_stats on its contiguous slice, Megatron's
    cut) against a copy of that slice, for rank 0 (the widest) and the last rank of each tp."""
    from rl_kernel import parallel, rowtree

    g = torch.Generator(device="cuda").manual_seed(rows)
    x = (torch.randn(rows, vocab, device="cuda", generator=g) * 2.5).to(dtype)
    out = []
    for tp in tps:
        widths = parallel.megatron_widths(vocab, tp)
        _, slices = parallel.simulate(x, widths)
        for rank in (0, tp - 1):
            own = slices[rank]
            local = x[:, own.start : own.start + own.width].contiguous()
            dst = torch.empty_like(local)
            fns = {"copy": lambda d=dst, v=local: d.copy_(v), "rank": lambda v=local, o=own: rowtree.local_stats(v, o)}
            for fn in fns.values():
                fn()
            torch.cuda.synchronize()
            q, s = queued(fns, 40), synced(fns, 40)
            out.append(
                {
                    "dtype": str(dtype).removeprefix("torch."),
                    "rows": rows,
                    "vocab": vocab,
                    "contender": f"rl parallel tp{tp} rank {rank} local_stats ({own.width} columns, "
                    f"{len(own.nodes)} nodes)",
                    "queued_ms": q["rank"] * 1e3,
                    "synced_ms": s["rank"] * 1e3,
                    "x_floor_queued": (q["copy"] / 2) / q["rank"],
                    "x_floor_synced": (s["copy"] / 2) / s["rank"],
                    "vs_copy_synced": s["rank"] / s["copy"],
                }
            )
    del x
    torch.cuda.empty_cache()
    return out


def report(r: dict) -> None:
    print(
        f"{r['dtype']:8} {r['rows']:6} {r['contender']:32} queued {r['queued_ms']:8.4f} ms "
        f"({r['x_floor_queued']:.3f} x floor)  synced {r['synced_ms']:8.4f} ms "
        f"({r['x_floor_synced']:.3f} x floor, {r['vs_copy_synced']:.2f} x the copy's time)",
        flush=True,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true", help="bf16 1 and 4096 rows, fp32 4096 rows; rl_kernel and the copy")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no GPU", file=sys.stderr)
        return 2
    lig = liger()
    results = []
    shapes = QUICK if args.quick else ROWS
    for dtype, rows_list in shapes.items():
        for rows in rows_list:
            rows_out = measure(dtype, rows, args.vocab, lig, rl_only=args.quick)
            results += rows_out
            for r in rows_out:
                report(r)
    for r in measure_ranks(torch.bfloat16, 4096, args.vocab, (2, 4, 8)):
        results.append(r)
        report(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, f, indent=1
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
