"""Bitwise self-check of the rl_kernel build on the devices this machine has.

    python -m rl_kernel.selfcheck [--vocabs 7,257,...] [--require-gpu] [--json PATH]

For every vocabulary size and dtype: run-to-run equality, batch invariance (a
row alone, the batch reversed), and, where a CUDA/ROCm device and the GPU build
are present, CPU bits == GPU bits for every output and gradient. Prints a table;
exits 1 on any mismatch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
from rich.console import Console
from rich.table import Table

import rl_kernel
from rl_kernel import bitwise, inputs


def case_inputs(vocab: int, dtype: torch.dtype, seed: int):
    """Random rows plus the edge-case rows, token ids (every 5th ignored), upstream grads."""
    n = 64 if vocab <= 32000 else 16
    x = inputs.logits(n, vocab, dtype, seed)
    if vocab >= 8:
        x = torch.cat([x, inputs.edge_rows(vocab, dtype)])
    tok = inputs.tokens(x.shape[0], vocab, seed)
    tok[::5] = -100
    g = torch.Generator().manual_seed(seed + 7)
    return x, tok, torch.randn(x.shape, generator=g), torch.randn(x.shape[:-1], generator=g)


def outputs(x, tok, gx, gr) -> dict[str, torch.Tensor]:
    """Every forward output and gradient of the public API, moved to the CPU."""
    dev = x.device
    res = {}
    for name, fn, g in (
        ("log_softmax", rl_kernel.log_softmax, gx),
        ("token_logprobs", lambda t: rl_kernel.token_logprobs(t, tok.to(dev)), gr),
        ("entropy", rl_kernel.entropy, gr),
    ):
        xr = x.clone().requires_grad_(True)
        y = fn(xr)
        y.backward(g.to(dev))
        res[name], res[f"{name}.grad"] = y.detach(), xr.grad
    res["row_stats"] = rl_kernel.row_stats(x)
    return {k: v.cpu() for k, v in res.items()}


def check_case(vocab: int, dtype: torch.dtype, gpu: bool) -> dict:
    x, tok, gx, gr = case_inputs(vocab, dtype, seed=vocab)
    cpu = outputs(x, tok, gx, gr)
    checks = {f"{k} cpu run-to-run": bitwise.diff(cpu[k], v) for k, v in outputs(x, tok, gx, gr).items()}
    dev = torch.device("cuda") if gpu else torch.device("cpu")
    xs, ts = x.to(dev), tok.to(dev)
    full = rl_kernel.token_logprobs(xs, ts).cpu()
    alone = rl_kernel.token_logprobs(xs[3:4].clone(), ts[3:4]).cpu()
    rev = rl_kernel.token_logprobs(xs.flip(0), ts.flip(0)).flip(0).cpu()
    checks[f"token_logprobs {dev.type} row alone == in batch"] = bitwise.diff(alone, full[3:4])
    checks[f"token_logprobs {dev.type} reversed batch"] = bitwise.diff(rev, full)
    if gpu:
        g1 = outputs(xs, tok, gx, gr)
        g2 = outputs(xs, tok, gx, gr)
        for k in cpu:
            checks[f"{k} cpu == gpu"] = bitwise.diff(cpu[k], g1[k])
            checks[f"{k} gpu run-to-run"] = bitwise.diff(g1[k], g2[k])
    return {
        "vocab": vocab,
        "dtype": str(dtype).replace("torch.", ""),
        "rows": x.shape[0],
        "checks": len(checks),
        "mismatches": {k: d.summary() for k, d in checks.items() if not d.equal},
        "digest_token_logprobs": bitwise.digest(cpu["token_logprobs"]),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="bitwise self-check of rl_kernel")
    ap.add_argument("--vocabs", default=",".join(map(str, inputs.VOCABS)), help="comma-separated vocabulary sizes")
    ap.add_argument("--require-gpu", action="store_true", help="fail when no GPU build and device are present")
    ap.add_argument("--json", help="write the records here")
    args = ap.parse_args(argv)
    gpu = torch.cuda.is_available() and rl_kernel.has_gpu_kernels()
    if args.require_gpu and not gpu:
        print("selfcheck: --require-gpu, but no CUDA/ROCm device with the GPU build is available", file=sys.stderr)
        return 2
    console = Console()
    device = torch.cuda.get_device_name() if gpu else "cpu only (no CUDA/ROCm device here)"
    console.print(f"rl_kernel {rl_kernel.TIER} tier, torch {torch.__version__}, devices: cpu + {device}")
    table = Table("vocab", "dtype", "rows", "comparisons", "mismatches", "seconds", title="bitwise self-check")
    records = []
    for vocab in (int(v) for v in args.vocabs.split(",")):
        for dtype in inputs.DTYPES:
            t0 = time.perf_counter()
            rec = check_case(vocab, dtype, gpu)
            rec["seconds"] = round(time.perf_counter() - t0, 2)
            records.append(rec)
            bad = len(rec["mismatches"])
            table.add_row(
                str(vocab),
                rec["dtype"],
                str(rec["rows"]),
                str(rec["checks"]),
                "[green]0[/]" if not bad else f"[red]{bad}[/]",
                f"{rec['seconds']:.2f}",
            )
            for k, s in rec["mismatches"].items():
                console.print(f"[red]MISMATCH[/] V={vocab} {rec['dtype']}: {k}: {s}")
    console.print(table)
    total = sum(r["checks"] for r in records)
    failed = sum(len(r["mismatches"]) for r in records)
    console.print(f"{total - failed}/{total} comparisons bitwise equal")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "device": device,
                    "torch": torch.__version__,
                    "cuda": torch.version.cuda,
                    "hip": torch.version.hip,
                    "cases": records,
                },
                f,
                indent=1,
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
