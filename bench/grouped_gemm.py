"""A mixture of experts' grouped GEMM alone: torch._grouped_mm (stock) against the same call under rl_kernel.mode.

    python -m bench grouped_gemm [--tier fast] [--tokens 8192,32] [--hidden 2048] [--expert 1024] [--experts 64]
                                 [--top 8] [--reps 20] [--tiles BMxBNxWARPSxSTAGES;...] [--json out.json]

The sizes: one layer of OLMoE-1B-7B (hidden 2048, 64 experts of 1024, top-8) over --tokens tokens: 8192 is a training
step's 8 x 1024, 32 one decode step of 32 prompts. Each token's experts are a router's top-k of random logits with a
skew (some experts get many more rows than others, as routers' do), the rows sorted by expert, as transformers' default
experts implementation hands them to aten::_grouped_mm. The four products of a layer's experts, in transformers'
layouts:
    gate_up  x [S, hidden] by the fused gate/up weight [E, 2 expert, hidden] transposed (the forward);
    down     h [S, expert] by the down weight [E, hidden, expert] transposed (the forward);
    down dX  grad [S, hidden] by the down weight [E, hidden, expert] (its input's gradient);
    down dW  h^T [expert, S] by grad [S, hidden], one [expert, hidden] per expert (its weight's gradient).
Each figure: stock's time over the tier's, synced and queued, medians of --reps after a warm-up (bench.timing), the
tier's calls inside one rl_kernel.mode (as a training step holds it; entering the mode is not a call's cost). The
bits: every expert's rows equal the tier's product of those rows alone (torch.mm under the mode: the linear's bits,
whatever other rows the call held), run to run; and how many of stock's rows differ from its own per-expert product
(stock's grouped GEMM is not batch invariant where that count is not 0). On a machine without a GPU, --tier exact and
small sizes check the script.

--tiles "64x128x4x4;128x128x8x3" (a GPU; block_m x block_n x warps x stages): a sweep of the fast grouped kernels'
tiles at each size and form, called directly (validate off, as the mode and the patch call them), each against the
configured tile's bits (BLOCK_K is the config's: a tile changes no bit) and timed beside stock: the data to choose a
grouped bucket in configs.toml.
"""

from __future__ import annotations

import json

import torch

import rl_kernel
from bench import environment, parser, timing
from rl_kernel.bitwise import int_view
from rl_kernel.inputs import DTYPE_NAMES

FORMS = ("gate_up", "down", "down dX", "down dW")


def routed_offsets(tokens: int, experts: int, top: int, seed: int) -> torch.Tensor:
    """offs [E] (int32, each expert's end row) of tokens x top rows routed by a skewed router's top-k."""
    g = torch.Generator().manual_seed(seed)
    skew = torch.linspace(0.0, 2.0, experts)  # later experts are picked more often
    picked = (torch.randn(tokens, experts, generator=g) + skew).topk(top, dim=-1).indices
    counts = torch.bincount(picked.flatten(), minlength=experts)
    return counts.cumsum(0).to(torch.int32)


def operands(form: str, rows: int, hidden: int, expert: int, experts: int, dtype: torch.dtype, device: str,
             seed: int) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(a, b) of a form, in the layouts transformers' experts and autograd hand to aten::_grouped_mm."""
    g = torch.Generator(device=device).manual_seed(seed)

    def draw(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=device) / shape[-1] ** 0.5).to(dtype)

    if form == "gate_up":
        return draw(rows, hidden), draw(experts, 2 * expert, hidden).transpose(-2, -1)
    if form == "down":
        return draw(rows, expert), draw(experts, hidden, expert).transpose(-2, -1)
    if form == "down dX":
        return draw(rows, hidden), draw(experts, hidden, expert)
    if form == "down dW":
        return draw(rows, expert).t(), draw(rows, hidden)
    raise ValueError(f"unknown form {form!r} (forms: {', '.join(FORMS)})")


def per_expert(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, form: str) -> list[torch.Tensor | None]:
    """Each expert's product of its rows alone (torch.mm: under a mode, the tier's; None for an expert of no rows),
    the grouped call's slices."""
    ends = offs.tolist()
    spans = list(zip([0, *ends[:-1]], ends, strict=True))
    if form == "down dW":
        return [a[:, s:e] @ b[s:e] if e > s else None for s, e in spans]
    return [a[s:e] @ b[g] if e > s else None for g, (s, e) in enumerate(spans)]


def differing(out: torch.Tensor, alone: list[torch.Tensor], offs: torch.Tensor, form: str) -> int:
    """Elements of the grouped call that differ from each expert's product alone (integer views of the bits)."""
    if form == "down dW":
        parts = list(out)
    else:
        ends = offs.tolist()
        parts = [out[s:e] for s, e in zip([0, *ends[:-1]], ends, strict=True)]
    return sum(int((int_view(p) != int_view(w)).sum()) for p, w in zip(parts, alone, strict=True) if w is not None)


def measure(form: str, tokens: int, args, device: str) -> dict:
    offs = routed_offsets(tokens, args.experts, args.top, seed=tokens).to(device)
    a, b = operands(form, tokens * args.top, args.hidden, args.expert, args.experts, DTYPE_NAMES[args.dtype],
                    device, seed=1)  # fmt: skip

    def call() -> torch.Tensor:
        return torch._grouped_mm(a, b, offs=offs)

    # The tier timed inside one mode, as a training step holds it: entering the mode registers its kernels (about
    # 2 ms of host time), which a per-call `with` would add to every call.
    times = timing.both({"stock": call}, args.reps)
    with rl_kernel.mode(args.tier):
        times |= timing.both({args.tier: call}, args.reps)
        got, again = call(), call()
        alone = per_expert(a, b, offs, form)
    counts = torch.diff(offs, prepend=offs.new_zeros(1))
    row = {"form": form, "tokens": tokens, "rows": tokens * args.top, "a": list(a.shape), "b": list(b.shape),
           "rows_per_expert": [int(counts.min()), int(counts.max())], "stock": times["stock"],
           args.tier: times[args.tier],
           "speed_synced": times["stock"]["synced_s"] / times[args.tier]["synced_s"],
           "speed_queued": times["stock"]["queued_s"] / times[args.tier]["queued_s"],
           "tier_differs_from_alone": differing(got, alone, offs, form),
           "tier_run_to_run_differs": int((int_view(got) != int_view(again)).sum()),
           "stock_differs_from_alone": differing(call(), per_expert(a, b, offs, form), offs, form),
           "elements": got.numel()}  # fmt: skip
    return row


def parse_tiles(text: str) -> list[dict]:
    """'BMxBNxWARPSxSTAGES;...' -> the grouped kernels' `tiles` overrides."""
    tiles = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        try:
            bm, bn, warps, stages = (int(v) for v in part.split("x"))
        except ValueError:
            raise SystemExit(f"grouped_gemm --tiles: {part!r} is not BLOCK_MxBLOCK_NxWARPSxSTAGES") from None
        tiles.append({"block_m": bm, "block_n": bn, "num_warps": warps, "num_stages": stages})
    return tiles


def sweep(form: str, tokens: int, args, tiles: list[dict], stock_s: float) -> list[dict]:
    """Each tile's queued time and whether it gives the configured tile's bits, for one form and size."""
    from rl_kernel.fast import grouped_kernels

    offs = routed_offsets(tokens, args.experts, args.top, seed=tokens).cuda()
    a, b = operands(form, tokens * args.top, args.hidden, args.expert, args.experts, DTYPE_NAMES[args.dtype],
                    "cuda", seed=1)  # fmt: skip
    kernel = grouped_kernels.grouped_dw if form == "down dW" else grouped_kernels.grouped_mm
    pinned = kernel(a, b, offs, validate=False)
    rows = []
    for tile in tiles:
        name = "x".join(str(tile[k]) for k in ("block_m", "block_n", "num_warps", "num_stages"))
        t = timing.both({name: lambda tile=tile: kernel(a, b, offs, validate=False, tiles=tile)}, args.reps)[name]
        same = bool(torch.equal(int_view(kernel(a, b, offs, validate=False, tiles=tile)), int_view(pinned)))
        rows.append({"form": form, "tokens": tokens, "tile": name, "queued_s": t["queued_s"],
                     "speed_queued": stock_s / t["queued_s"], "same_bits": same})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__)
    ap.add_argument("--tier", default="fast")
    ap.add_argument("--tokens", default="8192,32")
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--expert", type=int, default=1024)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tiles", default="", help="a sweep of the fast grouped tiles: BMxBNxWARPSxSTAGES;... (a GPU)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    device = "cuda" if timing.gpu() else "cpu"
    tiles = parse_tiles(args.tiles)
    if tiles and (device != "cuda" or args.tier != "fast"):
        raise SystemExit("grouped_gemm --tiles sweeps the fast tier's kernels: it needs a GPU and --tier fast")
    record: dict = {"args": vars(args), "environment": environment(), "rows": [], "sweep": []}
    for tokens in (int(t) for t in args.tokens.split(",")):
        for form in FORMS:
            row = measure(form, tokens, args, device)
            record["rows"].append(row)
            print(json.dumps(row), flush=True)
            record["sweep"] += sweep(form, tokens, args, tiles, row["stock"]["queued_s"]) if tiles else []
    print(f"\n| form | tokens | rows (per expert) | stock ms | {args.tier} ms | speed vs stock (synced, queued) | "
          f"{args.tier} differs from alone / run to run | stock differs from alone |")  # fmt: skip
    print("|---|---:|---|---:|---:|---|---|---:|")
    for r in record["rows"]:
        lo, hi = r["rows_per_expert"]
        print(f"| {r['form']} | {r['tokens']} | {r['rows']} ({lo}..{hi}) | {r['stock']['queued_s'] * 1e3:.3f} | "
              f"{r[args.tier]['queued_s'] * 1e3:.3f} | {r['speed_synced']:.2f}x, {r['speed_queued']:.2f}x | "
              f"{r['tier_differs_from_alone']} / {r['tier_run_to_run_differs']} of {r['elements']} | "
              f"{r['stock_differs_from_alone']} |")  # fmt: skip
    if tiles:
        print("\n| form | tokens | tile (BMxBNxWARPSxSTAGES) | fast ms (queued) | speed vs stock | bits vs pinned |")
        print("|---|---:|---|---:|---:|---|")
        for r in record["sweep"]:
            same = "same" if r["same_bits"] else "DIFFER"
            print(f"| {r['form']} | {r['tokens']} | {r['tile']} | {r['queued_s'] * 1e3:.3f} | "
                  f"{r['speed_queued']:.2f}x | {same} |")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(record, f, indent=1)
    return 0
