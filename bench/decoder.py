"""The decoder layers against cuBLAS/hipBLAS and scaled_dot_product_attention, side by side in one process.

    python -m bench decoder [--quick] [--json out.json]

linear (N = K = 4096, M in 1, 16, 256, 4096): the exact tier's linear in fp32 and bf16 against F.linear in fp32
with TF32 off (SGEMM) and in bf16 (with the matrix cores), and a device copy of x and the weight (the read
floor). Attention: prefill (batch 4, 32 query heads over 8 KV heads, head_dim 128, T = 2048, causal) and decode
(batch 64, one query over a cache of 2048) against F.scaled_dot_product_attention (bf16, GQA by enable_gqa).
Every contender is timed queued and synced (bench.timing), medians of many runs.
"""

from __future__ import annotations

import json

import torch

from bench import contenders as C
from bench import environment, gpu_missing, parser, timing

MS = (1, 16, 256, 4096)


def timed(fns: dict, reps: int) -> dict[str, dict[str, float]]:
    t = timing.both(fns, reps, warmup=1)
    return {k: {"queued_us": v["queued_s"] * 1e6, "synced_us": v["synced_s"] * 1e6} for k, v in t.items()}


def linear_contenders(x: torch.Tensor, w: torch.Tensor) -> dict:
    wf, xf = w.float(), x.float()
    xb, wb = x.to(torch.bfloat16), w.to(torch.bfloat16)
    linear = C.tier_op("exact", "linear")
    return {
        "copy": C.copy(w, x),
        "rl_kernel": lambda: linear(x, w),
        "cublas_sgemm_fp32": lambda: C.stock_linear(xf, wf),
        "cublas_bf16": lambda: C.stock_linear(xb, wb),
    }


def bench_linear(reps: int) -> list[dict]:
    rows = []
    g = torch.Generator(device="cuda").manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    for m in MS:
        for dtype in (torch.float32, torch.bfloat16):
            x = torch.randn(m, 4096, device="cuda", generator=g).to(dtype)
            w = (torch.randn(4096, 4096, device="cuda", generator=g) * 0.02).to(dtype)
            t = timed(linear_contenders(x, w), reps if m < 4096 else max(10, reps // 5))
            flops = 2 * m * 4096 * 4096
            rec = {"op": "linear", "M": m, "dtype": str(dtype).removeprefix("torch."), "times": t}
            rec["tflops_rl_kernel"] = flops / (t["rl_kernel"]["synced_us"] * 1e-6) / 1e12
            rec["x_sgemm_synced"] = t["cublas_sgemm_fp32"]["synced_us"] / t["rl_kernel"]["synced_us"]
            rec["x_sgemm_queued"] = t["cublas_sgemm_fp32"]["queued_us"] / t["rl_kernel"]["queued_us"]
            rec["x_bf16_synced"] = t["cublas_bf16"]["synced_us"] / t["rl_kernel"]["synced_us"]
            rows.append(rec)
            print(json.dumps(rec), flush=True)
    return rows


def attention_contenders(q, k, v, q_pos, k_start, causal: bool) -> dict:
    attention = C.tier_op("exact", "attention")
    return {
        "copy_kv": C.copy(k, v),
        "rl_kernel": lambda: attention(q, k, v, q_pos, k_start, validate=False),
        "sdpa": lambda: C.sdpa(q, k, v, causal),
    }


def bench_attention(reps: int) -> list[dict]:
    rows = []
    g = torch.Generator(device="cuda").manual_seed(1)
    hq, hkv, dh = 32, 8, 128
    for name, b, tq, tk in (("prefill", 4, 2048, 2048), ("decode", 64, 1, 2048)):
        q = torch.randn(b, hq, tq, dh, device="cuda", generator=g).to(torch.bfloat16)
        k = torch.randn(b, hkv, tk, dh, device="cuda", generator=g).to(torch.bfloat16)
        v = torch.randn(b, hkv, tk, dh, device="cuda", generator=g).to(torch.bfloat16)
        q_pos = (torch.arange(tq, device="cuda") + (tk - tq)).expand(b, tq).contiguous()
        k_start = torch.zeros(b, dtype=torch.long, device="cuda")
        causal = tq > 1
        fns = attention_contenders(q, k, v, q_pos, k_start, causal)
        t = timed(fns, max(10, reps // (10 if causal else 1)))
        rec = {"op": f"attention_{name}", "batch": b, "q_len": tq, "kv_len": tk, "dtype": "bfloat16", "times": t}
        rec["x_sdpa_synced"] = t["sdpa"]["synced_us"] / t["rl_kernel"]["synced_us"]
        rec["x_sdpa_queued"] = t["sdpa"]["queued_us"] / t["rl_kernel"]["queued_us"]
        rows.append(rec)
        print(json.dumps(rec), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__)
    ap.add_argument("--quick", action="store_true", help="20 repetitions instead of 100")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if gpu_missing("decoder"):
        return 2
    reps = 20 if args.quick else 100
    out = environment() | {"rows": bench_linear(reps) + bench_attention(reps)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0
