"""Where a decode-sized call spends its time: per-kernel device time, host time, one synced graph replay.

    python -m bench profile_decode [--vocab 151936] [--json out.json]

For rl_kernel's token_logprobs (the exact tier's registered op and its public function), stock PyTorch's
log_softmax + gather and a device copy at 1, 16 and 256 rows of 151936 (bf16), bench.timing's: torch.profiler's
device time per kernel, the host time of one call (the launch path alone), and one synchronised replay of a
CUDA/HIP graph of the call (how a rollout engine that captures its decode step in a graph pays for it: no launch
path on the host).
"""

from __future__ import annotations

import json

import torch

import rl_kernel
from bench import contenders as C
from bench import environment, gpu_missing, parser, timing


def profile(name: str, fn, rows: int) -> dict:
    r = {"rows": rows, "contender": name}
    r["host_us"] = timing.host({name: fn}, 200, warmup=5)[name] * 1e6
    r["kernels_us"] = {k: s * 1e6 for k, s in timing.kernels(fn).items()}
    replay, why = timing.captured(fn)
    r["graph_replay_synced_us"] = timing.synced({name: replay}, 200)[name] * 1e6 if replay else None
    if why:
        r["graph_error"] = why
    ks = ", ".join(f"{k} {v:.1f}" for k, v in r["kernels_us"].items())
    graph = f"{r['graph_replay_synced_us']:6.1f}" if replay else f"- ({why})"
    print(f"{rows:4} {name:20} host {r['host_us']:6.1f} us  graph replay (synced) {graph} us  device: {ks}", flush=True)
    return r


def main(argv: list[str] | None = None) -> int:
    p = parser(__name__, __doc__)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if gpu_missing("profile_decode"):
        return 2
    token_logprobs = C.registered_op("token_logprobs")
    results = []
    for rows in (1, 16, 256):
        x = (torch.randn(rows, args.vocab, device="cuda") * 2.5).to(torch.bfloat16)
        t = torch.randint(0, args.vocab, (rows,), device="cuda")
        fns = {
            "copy": C.copy(x),
            "stock log_softmax": lambda v=x, k=t: C.stock_token_logprobs(v, k),
            "rl token_logprobs": lambda v=x, k=t: token_logprobs(v, k, -100),
            "rl public, no check": lambda v=x, k=t: rl_kernel.token_logprobs(v, k, validate=False),
        }
        results += [profile(name, fn, rows) for name, fn in fns.items()]
    if args.json:
        with open(args.json, "w") as f:
            json.dump(environment() | {"results": results}, f)
    return 0
