"""Where a rollout spends its time: the device time per kernel family of generate(), and how busy the device is.

    python -m bench profile_rollout [--model qwen3-1.7b] [--tiers stock,fast] [--mode eager|static|compiled]
                                    [--layers N]
                                    [--prompts 32,128] [--new 32] [--json out.json] [--markdown out.md]

For each tier and prompt count (prompts of 64..256 tokens left padded, greedy, the mode's cache and compile
arguments of bench.rollout_modes): one warm-up generate() of --new tokens, one synced unprofiled call (its wall
time), then one profiled call (bench.timing.trace). Per generated token (the prefill included): the device ms of
each kernel family (profile_step's attribution), the kernels launched, and the device's busy ms (the sum of its
kernels) against the unprofiled wall ms. A rollout whose busy time is far below its wall time is bound by the host
(the launch path, Python, host syncs); one whose busy time fills it is bound by its kernels, and the families say
which. Where the host waits for the device (timing.syncs) is counted too. The host's own top costs
(torch.profiler's CPU self time per op and runtime call) are printed beside it.
Without a GPU the CPU ops' self time stands in for the device's (a check of the script, --model tiny).
"""

from __future__ import annotations

import json

import torch

from bench import environment, model_shapes, parser, publish, rollout, timing
from bench.profile_step import LABEL, device_times, hook_modules, is_kernel
from bench.rollout_modes import MODES, mode_kwargs

ROWS = (
    ("wall_ms_per_token", "wall (unprofiled)"),
    ("busy_ms_per_token", "device busy"),
    ("busy_fraction", "busy / wall"),
    ("launches_per_token", "kernels launched"),
    ("host_syncs_per_token", "host syncs"),
)


def launches(prof) -> int:
    """Device kernels in the profile, the device's side of host syncs left out (0 without a GPU)."""
    if not timing.gpu():
        return 0
    return sum(1 for e in prof.events() if is_kernel(e))


def host_top(prof, per: int, top: int = 12) -> dict[str, float]:
    """The host's largest self CPU times (ms per generated token) by op or runtime call."""
    rows = {e.key[:80]: e.self_cpu_time_total / 1e3 / per for e in prof.key_averages()
            if e.self_cpu_time_total > 0 and not e.key.startswith(LABEL)}  # fmt: skip
    return dict(sorted(rows.items(), key=lambda kv: -kv[1])[:top])


def profile_one(model, ids: torch.Tensor, mask: torch.Tensor, new: int, mode: str) -> dict:
    kw = mode_kwargs(mode)
    call = lambda: rollout.generate(model, ids, mask, new, keep_logits=False, **kw)  # noqa: E731
    wall = timing.synced({"call": call}, 1, warmup=1)["call"]  # the warm-up compiles (Triton, the decode step)
    handles = hook_modules(model)
    try:
        prof = timing.trace(call)
    finally:
        for h in handles:
            h.remove()
    syncs = timing.syncs(call)
    families = device_times(prof, new)
    busy = sum(families.values())
    wall_ms = wall * 1e3 / new
    return {
        "wall_ms_per_token": wall_ms,
        "busy_ms_per_token": busy,
        "busy_fraction": busy / wall_ms if wall_ms else 0.0,
        "launches_per_token": launches(prof) / new,
        "families_ms_per_token": families,
        "host_top_ms_per_token": host_top(prof, new),
        "host_syncs_per_token": sum(syncs.values()) / new,
        "host_syncs": syncs,
    }


def table(record: dict) -> str:
    lines = []
    for prompts, by_tier in record["runs"].items():
        tiers = list(by_tier)
        fams = sorted({f for t in tiers for f in by_tier[t]["families_ms_per_token"]},
                      key=lambda f: -max(by_tier[t]["families_ms_per_token"].get(f, 0.0) for t in tiers))  # fmt: skip
        lines += [f"\n{prompts} prompts, {record['args']['mode']} ({record['args']['new']} new tokens; ms per token)",
                  "| | " + " | ".join(tiers) + " |", "|---|" + "---:|" * len(tiers)]  # fmt: skip
        for key, label in ROWS:
            lines.append(f"| {label} | " + " | ".join(f"{by_tier[t][key]:.2f}" for t in tiers) + " |")
        for f in fams:
            vals = [by_tier[t]["families_ms_per_token"].get(f, 0.0) for t in tiers]
            lines.append(f"| {f} | " + " | ".join(f"{v:.3f}" for v in vals) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__)
    ap.add_argument("--model", default="qwen3-1.7b", choices=sorted(model_shapes.SHAPES))
    ap.add_argument("--tiers", default=None, help="default stock,fast (stock,exact without a GPU)")
    ap.add_argument("--mode", default="eager", choices=MODES)
    ap.add_argument("--layers", type=int, default=None, help="override the model's layers")
    ap.add_argument("--prompts", default="32,128")
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    device = "cuda" if timing.gpu() else "cpu"
    args.tiers = args.tiers or ("stock,fast" if timing.gpu() else "stock,exact")
    shape = model_shapes.shape(args.model, layers=args.layers)
    model = model_shapes.build(shape, "bf16" if timing.gpu() else "fp32", 0, device)
    record: dict = {"args": vars(args), "environment": environment(), "runs": {}}
    for b in sorted(int(p) for p in args.prompts.split(",")):
        ids, mask = rollout.prompts(b, 64, 256, shape.vocab, seed=b)
        record["runs"][b] = {}
        for tier in args.tiers.split(","):
            with model_shapes.in_tier(model, tier):
                r = profile_one(model, ids, mask, args.new, args.mode)
                torch.compiler.reset()
            record["runs"][b][tier] = r
            print(f"{b} prompts, {tier}: {json.dumps(r)}", flush=True)
    publish(table(record), record, args.json, args.markdown)
    return 0
