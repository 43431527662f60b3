"""Row kernels against the read floor and every baseline a user would pick, side by side in one process.

    python -m bench row [--vocab 151936] [--quick] [--json out.json]

For each dtype and row count, every contender is timed synced and queued (bench.timing: medians after a warm-up).
The read floor is half a device copy of the logits (a copy reads and writes them once; a log-prob kernel only
reads them), so x floor = floor time / contender time, 1.0 being the memory system's limit. Contenders
(bench.contenders): the device copy, rl_kernel's token_logprobs, entropy and log_softmax (the exact tier's
registered ops), stock PyTorch (log_softmax + gather), torch.compile of gather - logsumexp (static shapes), and
Liger's cross-entropy (reduction none; it writes its gradient into its input, so it gets a copy of the logits of
its own). Then a vocab-parallel rank's own kernel (bf16, 4096 rows, Megatron's cut at tp 2, 4, 8) against a copy
of its slice.
"""

from __future__ import annotations

import json

import torch

from bench import contenders as C
from bench import environment, gpu_missing, parser, timing

ROWS = {torch.bfloat16: (1, 16, 256, 4096, 16384), torch.float32: (1, 256, 4096)}
QUICK = {torch.bfloat16: (1, 4096), torch.float32: (4096,)}


def row_contenders(x: torch.Tensor, t: torch.Tensor, liger) -> dict:
    ops = {name: C.registered_op(name) for name in ("token_logprobs", "entropy", "log_softmax")}
    compiled = C.compiled_token_logprobs()
    fns = {
        "copy": C.copy(x),
        "rl token_logprobs": lambda: ops["token_logprobs"](x, t, -100),
        "rl entropy": lambda: ops["entropy"](x),
        "rl log_softmax": lambda: ops["log_softmax"](x),
        "torch log_softmax+gather": lambda: C.stock_token_logprobs(x, t),
        "torch log_softmax": lambda: C.stock_log_softmax(x),
        "torch.compile gather-logsumexp": lambda: compiled(x, t),
    }
    if liger is not None:
        xl = x.clone()
        fns["liger cross_entropy"] = lambda: liger(xl, t)
    return fns


def record(dtype: torch.dtype, rows: int, vocab: int, name: str, q: dict, s: dict, key: str) -> dict:
    """One result row: contender `key`'s times, named `name`, against the copy's."""
    return {
        "dtype": str(dtype).removeprefix("torch."),
        "rows": rows,
        "vocab": vocab,
        "contender": name,
        "queued_ms": q[key] * 1e3,
        "synced_ms": s[key] * 1e3,
        "x_floor_queued": (q["copy"] / 2) / q[key],
        "x_floor_synced": (s["copy"] / 2) / s[key],
        "vs_copy_synced": s[key] / s["copy"],
    }


def measure(dtype: torch.dtype, rows: int, vocab: int, liger, rl_only: bool = False) -> list[dict]:
    g = torch.Generator(device="cuda").manual_seed(rows)
    x = (torch.randn(rows, vocab, device="cuda", generator=g) * 2.5).to(dtype)
    t = torch.randint(0, vocab, (rows,), device="cuda", generator=g)
    fns = row_contenders(x, t, liger)
    if rl_only:
        fns = {k: v for k, v in fns.items() if k == "copy" or k.startswith("rl ")}
    times = timing.both(fns, 200 if rows <= 256 else 40)
    q = {k: v["queued_s"] for k, v in times.items()}
    s = {k: v["synced_s"] for k, v in times.items()}
    out = [record(dtype, rows, vocab, k, q, s, k) for k in fns]
    del x, fns
    torch.cuda.empty_cache()
    return out


def measure_ranks(dtype: torch.dtype, rows: int, vocab: int, tps: tuple[int, ...]) -> list[dict]:
    """A vocab-parallel rank's own kernel (rl_kernel.head.rowtree.local_stats on its contiguous slice, Megatron's
    cut) against a copy of that slice, for rank 0 (the widest) and the last rank of each tp."""
    from rl_kernel.head import parallel, rowtree

    g = torch.Generator(device="cuda").manual_seed(rows)
    x = (torch.randn(rows, vocab, device="cuda", generator=g) * 2.5).to(dtype)
    out = []
    for tp in tps:
        _, slices = parallel.simulate(x, parallel.megatron_widths(vocab, tp))
        for rank in (0, tp - 1):
            own = slices[rank]
            local = x[:, own.start : own.start + own.width].contiguous()
            fns = {"copy": C.copy(local), "rank": lambda v=local, o=own: rowtree.local_stats(v, o)}
            q, s = timing.queued(fns, 40, warmup=1), timing.synced(fns, 40, warmup=0)
            name = f"rl parallel tp{tp} rank {rank} local_stats ({own.width} columns, {len(own.nodes)} nodes)"
            out.append(record(dtype, rows, vocab, name, q, s, "rank"))
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


def main(argv: list[str] | None = None) -> int:
    p = parser(__name__, __doc__)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--json", default=None)
    p.add_argument("--quick", action="store_true", help="bf16 1 and 4096 rows, fp32 4096 rows; rl_kernel and the copy")
    args = p.parse_args(argv)
    if gpu_missing("row"):
        return 2
    liger = None if args.quick else C.liger_cross_entropy()
    results = []
    for dtype, rows_list in (QUICK if args.quick else ROWS).items():
        for rows in rows_list:
            for r in measure(dtype, rows, args.vocab, liger, rl_only=args.quick):
                results.append(r)
                report(r)
    for r in measure_ranks(torch.bfloat16, 4096, args.vocab, (2, 4, 8)):
        results.append(r)
        report(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**environment(), "skipped": C.SKIPPED, "results": results}, f, indent=1)
    return 0
