"""Throughput of rl_kernel's row kernels against a device copy and stock PyTorch, and the promised floor.

    python -m bench token_logprobs [--rows 4096] [--vocab 151936] [--reps 50] [--json out.json]

Every contender is timed queued (bench.timing: device events around each call, round robin, one sync at the end;
medians after a warm-up), so launch overhead is not counted for anyone. Bandwidth counts bytes read plus bytes
written, for the copy and for the kernels alike. The floor this project promises for bf16 4096 x 151936
token_logprobs: >= 0.6 x copy bandwidth and >= 3 x stock PyTorch (exit 1 when not met).
"""

from __future__ import annotations

import json

import torch

from bench import contenders as C
from bench import environment, gpu_missing, parser, timing

TOKEN_LOGPROBS = ("rl token_logprobs (op)", "rl token_logprobs (API, validate=False)", "rl token_logprobs (API)")


def contenders(x: torch.Tensor, t: torch.Tensor) -> dict:
    op = {name: C.registered_op(name) for name in ("token_logprobs", "entropy", "log_softmax")}
    api = C.tier_op("exact", "token_logprobs")
    return {
        "copy": C.copy(x),
        "rl token_logprobs (op)": lambda: op["token_logprobs"](x, t, -100),
        "rl token_logprobs (API, validate=False)": lambda: api(x, t, validate=False),
        "rl token_logprobs (API)": lambda: api(x, t),
        "torch log_softmax(x.float()).gather": lambda: C.stock_token_logprobs(x, t),
        "rl entropy": lambda: op["entropy"](x),
        "rl log_softmax": lambda: op["log_softmax"](x),
        "torch log_softmax(x.float())": lambda: C.stock_log_softmax(x),
    }


def bytes_moved(x: torch.Tensor, rows: int) -> dict[str, int]:
    xb = x.numel() * x.element_size()
    token_bytes = xb + rows * (8 + 4 + 12)  # logits, token ids, log-probs, row stats
    moved = {"copy": 2 * xb, "rl entropy": 2 * xb + rows * 16, "rl log_softmax": 2 * xb + 4 * x.numel()}
    return moved | dict.fromkeys(TOKEN_LOGPROBS, token_bytes)  # (entropy: its second pass reads the row again)


def measure(dtype: torch.dtype, rows: int, vocab: int, reps: int, g: torch.Generator) -> list[dict]:
    """Times every contender on one dtype; returns a row per contender and a summary row."""
    x = (torch.randn(rows, vocab, device="cuda", generator=g) * 2.5).to(dtype)
    t = torch.randint(0, vocab, (rows,), device="cuda", generator=g)
    med = timing.queued(contenders(x, t), reps)
    moved = bytes_moved(x, rows)
    copy_bw = moved["copy"] / med["copy"]
    name = str(dtype).replace("torch.", "")
    out = []
    for k, sec in med.items():
        bw = moved[k] / sec if k in moved else None
        out.append({"dtype": name, "shape": [rows, vocab], "contender": k, "median_ms": sec * 1e3,
                    "bytes": moved.get(k), "GBps": bw / 1e9 if bw else None,
                    "x_copy_bw": bw / copy_bw if bw else None})  # fmt: skip
    ratio = {k: moved[k] / med[k] / copy_bw for k in TOKEN_LOGPROBS}
    out.append(
        {
            "dtype": name,
            "summary": True,
            "token_logprobs_x_copy_bw": ratio["rl token_logprobs (op)"],
            "token_logprobs_api_novalidate_x_copy_bw": ratio["rl token_logprobs (API, validate=False)"],
            "token_logprobs_api_x_copy_bw": ratio["rl token_logprobs (API)"],
            "token_logprobs_speedup_vs_torch": med["torch log_softmax(x.float()).gather"]
            / med["rl token_logprobs (op)"],
            "log_softmax_speedup_vs_torch": med["torch log_softmax(x.float())"] / med["rl log_softmax"],
        }
    )
    return out


def show(results: list[dict]) -> None:
    print(f"{'dtype':<9}{'contender':<42}{'median ms':>10}{'GB/s':>9}{'x copy':>8}")
    for r in results:
        if r.get("summary"):
            print(
                f"{r['dtype']:<9}token_logprobs: {r['token_logprobs_x_copy_bw']:.3f} x copy bandwidth (API "
                f"{r['token_logprobs_api_novalidate_x_copy_bw']:.3f}, validating ids "
                f"{r['token_logprobs_api_x_copy_bw']:.3f}), {r['token_logprobs_speedup_vs_torch']:.2f} x torch; "
                f"log_softmax {r['log_softmax_speedup_vs_torch']:.2f} x torch"
            )
            continue
        gb = f"{r['GBps']:.0f}" if r["GBps"] else "-"
        xc = f"{r['x_copy_bw']:.3f}" if r["x_copy_bw"] else "-"
        print(f"{r['dtype']:<9}{r['contender']:<42}{r['median_ms']:>10.3f}{gb:>9}{xc:>8}")


def main(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__)
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if gpu_missing("token_logprobs"):
        return 2
    g = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for dtype in (torch.bfloat16, torch.float32):
        results += measure(dtype, args.rows, args.vocab, args.reps, g)
        torch.cuda.empty_cache()
    show(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": environment() | {"reps": args.reps}, "results": results}, f, indent=1)
    bf = next(r for r in results if r.get("summary") and r["dtype"] == "bfloat16")
    ok = bf["token_logprobs_x_copy_bw"] >= 0.6 and bf["token_logprobs_speedup_vs_torch"] >= 3.0
    print("performance floor (bf16 token_logprobs >= 0.6 x copy, >= 3 x torch):", "MET" if ok else "NOT MET")
    return 0 if ok else 1
