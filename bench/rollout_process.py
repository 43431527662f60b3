"""Rollout in a user's process: stock and a patched copy of the same weights side by side, stock compiled first.

    python -m bench rollout_process [--model qwen3-1.7b] [--tier fast] [--prompts 32,128,512] [--new 128,256]
                                    [--fullgraph off,on] [--modes compiled,eager,batched] [--reps 2] [--json out.json]

What bench rollout_modes measures one model at a time (patched, then unpatched, torch.compiler.reset() between), this
measures as a trainer's process holds them: two models of one class in one process, never reset, each compiled
decode step under an explicit transformers.CompileConfig (fullgraph off and on, the rest transformers' default:
reduce-overhead), stock's compile first, then the tier's, for every prompt count and completion length in turn.
Each figure: the median of --reps synced generate() calls (greedy, exactly --new tokens, prompts of 64..256 left
padded) after a warm-up call of the same length. Beside each: the graphs dynamo compiled and the graph breaks it
took during that model's calls (torch._dynamo.utils.counters), so a break or a recompile per layer shows as a count,
not only as a slow figure. The bits: at --check-at prompts, the tier's compiled and eager generate() logits against
its training forward (bench.rollout_modes.bits). On a machine without a GPU, --model tiny checks the script.
"""

from __future__ import annotations

import copy
import json

import torch
import transformers
from torch._dynamo.utils import counters

from bench import environment, model_shapes, parser, rollout, timing
from bench.rollout_modes import BATCHED, batched_bits, bits, generate_batched, warmup_tokens
from rl_kernel.integrations import transformers as hf

MODES = ("compiled", "eager", BATCHED)  # batched: transformers' continuous batching (generate_batch)


def compile_kwargs(mode: str, fullgraph: bool) -> dict:
    """generate()'s arguments of a mode: compiled, the static cache with an explicit CompileConfig (on the CPU it must
    ask to compile: _compile_all_devices); eager, none."""
    if mode in ("eager", BATCHED):
        return {}
    if mode != "compiled":
        raise ValueError(f"unknown mode {mode!r} (modes: {', '.join(MODES)})")
    config = transformers.CompileConfig(fullgraph=fullgraph)
    if not timing.gpu():
        config._compile_all_devices = True
    return {"cache_implementation": "static", "compile_config": config}


def dynamo_counts() -> tuple[int, int]:
    """(graphs compiled, graph breaks) so far in this process."""
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def timed(model, ids: torch.Tensor, mask: torch.Tensor, new: int, reps: int, mode: str, kwargs: dict) -> dict:
    """A warm-up call (the compiled mode's: of the timed length, its compile; eager's: a few tokens), then the median
    of `reps` synced calls, with the graphs and breaks dynamo counted across them."""
    graphs, breaks = dynamo_counts()

    def call(n: int = new) -> object:
        if mode == BATCHED:
            return generate_batched(model, ids, mask, n)
        return rollout.generate(model, ids, mask, n, keep_logits=False, **kwargs)

    call(warmup_tokens(mode, new, None))
    s = timing.synced({"call": call}, reps, 0)["call"]
    graphs2, breaks2 = dynamo_counts()
    return {"synced_s": s, "tokens_per_s": ids.shape[0] * new / s, "graphs": graphs2 - graphs,
            "breaks": breaks2 - breaks}  # fmt: skip


def runs(args) -> list[tuple[str, bool]]:
    """(mode, fullgraph) of every run: the compiled mode once per --fullgraph value, eager once."""
    return [(m, fg) for m in args.modes for fg in (args.fullgraph if m == "compiled" else [False])]


def main(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__)
    ap.add_argument("--model", default="qwen3-1.7b", choices=sorted(model_shapes.SHAPES))
    ap.add_argument("--tier", default="fast")
    ap.add_argument("--modes", default="compiled,eager")
    ap.add_argument("--prompts", default="32,128,512")
    ap.add_argument("--new", default="128,256")
    ap.add_argument("--fullgraph", default="off,on")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--check-at", type=int, default=32, help="prompts of the bits check (0: none)")
    ap.add_argument("--check-new", type=int, default=32)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    args.modes = args.modes.split(",")
    args.fullgraph = [{"on": True, "off": False}[v] for v in args.fullgraph.split(",")]
    for mode, fg in runs(args):
        compile_kwargs(mode, fg)  # an unknown mode fails before the models are built
    device = "cuda" if timing.gpu() else "cpu"
    shape = model_shapes.shape(args.model)
    stock = model_shapes.build(shape, "bf16", 0, device)
    tiered = hf.patch(copy.deepcopy(stock), tier=args.tier)
    counters.clear()
    record: dict = {"args": vars(args), "environment": environment(), "runs": []}
    for mode, fg in runs(args):
        for b in (int(p) for p in args.prompts.split(",")):
            ids, mask = rollout.prompts(b, 64, 256, shape.vocab, seed=b)
            for new in (int(n) for n in args.new.split(",")):
                row = {"mode": mode, "fullgraph": fg, "prompts": b, "new": new}
                for name, model in (("stock", stock), (args.tier, tiered)):
                    row[name] = timed(model, ids, mask, new, args.reps, mode, compile_kwargs(mode, fg))
                row["ratio"] = row[args.tier]["tokens_per_s"] / row["stock"]["tokens_per_s"]
                print(json.dumps(row), flush=True)
                record["runs"].append(row)
    if args.check_at:
        ids, mask = rollout.prompts(args.check_at, 64, 256, shape.vocab, seed=args.check_at)
        for mode in args.modes:  # rollout_modes' generate() arguments: compiled takes transformers' CompileConfig
            check = batched_bits if mode == BATCHED else lambda *a, mode=mode: bits(*a, mode)
            record[f"{mode} bits"] = found = check(tiered, ids, mask, args.check_new)
            print(f"{args.tier} {mode}: logits differing from the forward at {args.check_at} prompts: {found}")
    record["dynamo"] = dict(zip(("graphs", "breaks"), dynamo_counts(), strict=True))
    table(record, args.tier)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0


def table(record: dict, tier: str) -> None:
    print(f"\n| mode | fullgraph | prompts | new | stock tokens/s | {tier} tokens/s | {tier} / stock | graphs (stock, "
          f"{tier}) | breaks |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---|---|")
    for r in record["runs"]:
        s, t = r["stock"], r[tier]
        print(f"| {r['mode']} | {'on' if r['fullgraph'] else 'off'} | {r['prompts']} | {r['new']} | "
              f"{s['tokens_per_s']:,.0f} | {t['tokens_per_s']:,.0f} | {r['ratio']:.2f}x | {s['graphs']}, "
              f"{t['graphs']} | {s['breaks'] + t['breaks']} |")  # fmt: skip
