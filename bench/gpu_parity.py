"""CPU bits == GPU bits for every promised vocab size and dtype, plus GPU
run-to-run and batch-invariance equality. Needs the GPU build of rl_kernel.

    python bench/gpu_parity.py [--json out.json]

Exits 1 if any comparison is not bitwise equal.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import rl_kernel
import torch
from rl_kernel import bitwise, inputs


def rows_for(vocab: int) -> int:
    return 64 if vocab <= 32000 else 16


def case_inputs(vocab: int, dtype: torch.dtype, seed: int):
    n = rows_for(vocab)
    x = inputs.logits(n, vocab, dtype, seed)
    if vocab >= 8:
        x = torch.cat([x, inputs.edge_rows(vocab, dtype)])
    tok = inputs.tokens(x.shape[0], vocab, seed)
    tok[::5] = -100  # ignore_index padding
    g = torch.Generator().manual_seed(seed + 7)
    gx = torch.randn(x.shape, generator=g)
    gr = torch.randn(x.shape[:-1], generator=g)
    return x, tok, gx, gr


def outputs(x, tok, gx, gr) -> dict[str, torch.Tensor]:
    """Every forward and backward output of the public API for one input set."""
    res = {}
    xl = x.clone().requires_grad_(True)
    lsm = rl_kernel.log_softmax(xl)
    lsm.backward(gx.to(x.device))
    res["log_softmax"], res["log_softmax.grad"] = lsm.detach(), xl.grad
    xt = x.clone().requires_grad_(True)
    tlp = rl_kernel.token_logprobs(xt, tok.to(x.device))
    tlp.backward(gr.to(x.device))
    res["token_logprobs"], res["token_logprobs.grad"] = tlp.detach(), xt.grad
    xe = x.clone().requires_grad_(True)
    ent = rl_kernel.entropy(xe)
    ent.backward(gr.to(x.device))
    res["entropy"], res["entropy.grad"] = ent.detach(), xe.grad
    res["row_stats"] = rl_kernel.row_stats(x)
    return {k: v.cpu() for k, v in res.items()}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    args = ap.parse_args()
    assert torch.cuda.is_available() and rl_kernel.has_gpu_kernels(), "needs a GPU and the GPU build"
    records, failures = [], 0
    for vocab in inputs.VOCABS:
        for dtype in inputs.DTYPES:
            t0 = time.perf_counter()
            x, tok, gx, gr = case_inputs(vocab, dtype, seed=vocab)
            cpu = outputs(x, tok, gx, gr)
            gpu1 = outputs(x.cuda(), tok, gx, gr)
            gpu2 = outputs(x.cuda(), tok, gx, gr)
            # batch invariance on the GPU: row 3 alone, and the batch reversed
            xs = x.cuda()
            alone = rl_kernel.token_logprobs(xs[3:4], tok[3:4].cuda())
            rev = rl_kernel.token_logprobs(xs.flip(0), tok.flip(0).cuda()).flip(0)
            checks = {}
            for k in cpu:
                checks[f"{k} cpu==gpu"] = bitwise.diff(cpu[k], gpu1[k])
                checks[f"{k} gpu run-to-run"] = bitwise.diff(gpu1[k], gpu2[k])
            checks["token_logprobs row alone==in batch"] = bitwise.diff(alone.cpu(), gpu1["token_logprobs"][3:4])
            checks["token_logprobs reversed batch"] = bitwise.diff(rev.cpu(), gpu1["token_logprobs"])
            bad = {k: d.summary() for k, d in checks.items() if not d.equal}
            failures += len(bad)
            records.append({"vocab": vocab, "dtype": str(dtype).replace("torch.", ""), "rows": x.shape[0],
                            "checks": len(checks), "mismatches": bad,
                            "digest_token_logprobs": bitwise.digest(cpu["token_logprobs"]),
                            "seconds": round(time.perf_counter() - t0, 2)})
            print(f"V={vocab:>6} {records[-1]['dtype']:<8} rows={x.shape[0]:>3} checks={len(checks)} "
                  f"mismatches={len(bad)} {records[-1]['seconds']}s", flush=True)
            for k, s in bad.items():
                print(f"    {k}: {s}")
    total = sum(r["checks"] for r in records)
    print(f"gpu_parity: {total - failures}/{total} comparisons bitwise equal")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "cuda": torch.version.cuda, "hip": torch.version.hip, "cases": records}, f, indent=1)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
