"""Where an RL training step spends its time: the device time per kernel family, stock against the fast tier.

    python -m bench profile_step [--model qwen3-1.7b|qwen3-8b|tiny] [--train-batch 8] [--train-len 1024]
                                 [--steps 2] [--mode] [--only stock,mode-fast] [--top 12] [--json out.json]
                                 [--markdown out.md]

One training step (model_step.train_step: forward over --train-batch x --train-len tokens with autograd, token
log-probs, the GRPO loss, backward, AdamW) of three contenders on the same weights: stock transformers, the fast tier
with the unfused head (the logits, then rl_kernel.token_logprobs) and the fast tier through the fused head
(rl_kernel.lm_head_logprobs). Each runs one warm-up step, then --steps steps profiled (bench.timing.trace); every device
kernel's time is put in a family:
  1. by the kernel's name (GEMMs of cuBLAS or the fast tier's Triton linear, attention forward / backward, the exact
     tier's RMSNorm, rotary, SwiGLU and log-prob kernels, the optimizer's foreach kernels);
  2. else by where it was launched: the innermost model module (forward hooks name RMSNorm, the MLP's activation,
     the attention's glue and rotary, the embedding), or the autograd node of a backward (PowBackward,
     SiluBackward, EmbeddingBackward, ...);
  3. else "other" (the loss's elementwise work, copies).
The table gives milliseconds per step per family and the fast tier's ratio to stock; the synced step times (bench
.timing, median of --reps) are printed beside it. Without a GPU it profiles the CPU (a check of the script).
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Callable

import torch
from torch import nn

import rl_kernel
from bench import contenders, environment, model_shapes, parser, publish, timing
from bench.model_step import fused_loss, fused_scorer, logits_scorer, scored_loss, train_step
from rl_kernel.head import loss as head_loss

LABEL = "family:"  # the prefix of the profiler ranges the module hooks open
# Family by kernel name, first match wins (cuBLAS, CUTLASS and nvjet GEMMs; the fast tier's Triton kernels; the
# exact tier's CUDA/HIP kernels; flash / cuDNN attention).
BY_KERNEL = (
    ("experts gemm", r"grouped"),  # torch._grouped_mm's CUTLASS kernels, the fast tier's _grouped_*_kernel
    ("linear", r"gemm|cutlass(?!.*fmha)|nvjet|xmma|cublas|linear_kernel|linear_skinny|_colsum_kernel|aten::(add)?mm$"),
    ("attention fwd", r"attn_fwd|flash_fwd|fmha.*fwd|sdpa.*fwd|fprop|^attention_kernel"),
    ("attention bwd", r"attn_bwd|bwd_delta|flash_bwd|fmha.*(bwd|dgrad)|bprop|dgrad|attention_d(q|kv)_kernel|row_grad"),
    ("rms_norm", r"rms_norm|layer_norm"),
    ("rotary", r"rotary|rope"),
    ("swiglu", r"silu"),
    ("log-prob head", r"token_logprobs|log_softmax|entropy|node_stats|node_entropy|join_stats|join_sum|softmax"),
    ("embedding", r"embedding|indexing_backward|embedding_backward"),
    ("optimizer", r"multi_tensor|adam|foreach"),
)
# Family by the launching module (forward hooks) or autograd node (backward), for kernels the name leaves open.
BY_CONTEXT = (
    ("experts glue", r"Experts|SparseMoe|MoeBlock|Router|IndexAddBackward|IndexPutBackward|TopkBackward"),
    ("rms_norm", r"RMSNorm|RmsNorm|PowBackward|RsqrtBackward|MeanBackward"),
    ("swiglu", r"MLP|Silu|SiluMul"),
    ("rotary", r"Rotary|rotary|CatBackward|NegBackward|SliceBackward"),
    ("attention glue", r"Attention|ScaledDotProduct"),
    ("embedding", r"Embedding"),
    ("log-prob head", r"Softmax|Gather|TokenLogprobs|Entropy|_Head|LogProb|lm_head"),
    ("optimizer", r"Optimizer|AdamW|adam"),
)
SYNC = re.compile(r"\bSync\b")  # the device's side of a host sync (Context / Stream / Event Sync): a wait, no kernel
# The model's module classes whose forward opens a range.
HOOKED = r"RMSNorm|MLP|Attention|Embedding|Rotary|Experts|SparseMoe|MoeBlock|Router"


def is_kernel(event) -> bool:
    """A device event that is a kernel or a copy: not the device's side of a host sync, nor a profiler range's
    shadow on the device's timeline (the profiler puts each record_function range there as a
    gpu_user_annotation, spanning the kernels it holds: counted as a kernel, the hooked modules' ranges would count
    their time twice)."""
    return event.device_type == torch.autograd.DeviceType.CUDA and not (
        SYNC.search(event.name) or event.name.startswith(LABEL)
    )


def family(kernel: str, context: list[str]) -> str:
    for name, pattern in BY_KERNEL:
        if re.search(pattern, kernel, re.I):
            return name
    for label in context:
        for name, pattern in BY_CONTEXT:
            if re.search(pattern, label):
                return name
    return "other"


def hook_modules(model: nn.Module) -> list:
    """Forward hooks that open a profiler range per hooked module (innermost wins in the attribution)."""
    handles = []
    for module in model.modules():
        kind = type(module).__name__
        if not re.search(HOOKED, kind):
            continue

        def enter(mod, args, kind=kind):
            mod._bench_range = torch.autograd.profiler.record_function(LABEL + kind)
            mod._bench_range.__enter__()

        def leave(mod, args, out):
            mod._bench_range.__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    return handles


def context_of(event) -> list[str]:
    """The names of the event and its CPU ancestors, innermost first (module ranges without their prefix)."""
    names = []
    while event is not None:
        names.append(event.name.removeprefix(LABEL))
        event = event.cpu_parent
    return names


def own_kernels(event) -> Counter:
    """The kernels an op launched itself: its kernels less its children's (an op's list also holds what the ops
    inside it launched; counted there, they would count twice)."""
    mine = Counter((k.name, k.duration) for k in getattr(event, "kernels", ()))
    for child in event.cpu_children:
        mine -= Counter((k.name, k.duration) for k in getattr(child, "kernels", ()))
    return mine


def device_times(prof, steps: int, other: dict[str, float] | None = None) -> dict[str, float]:
    """Milliseconds per step per family: each kernel, once (with the op that launched it), attributed by its name,
    then by that op's context. Without a GPU, the CPU ops' self time (attributed the same way). `other`, if given,
    collects the "other" family's milliseconds by kernel and the op that launched it (what the families leave open)."""
    found: dict[str, float] = defaultdict(float)
    unclaimed = Counter()  # every kernel, less those an op claims: a Triton launch outside any op has no parent

    def add(name: str, context: list[str], ms: float) -> None:
        fam = family(name, context)
        found[fam] += ms
        if other is not None and fam == "other":
            key = f"{name[:60]} <- {' < '.join(context[:3])[:80]}"
            other[key] = other.get(key, 0.0) + ms

    for event in prof.events():
        if timing.gpu():
            if is_kernel(event):
                unclaimed[(event.name, event.device_time_total)] += 1
            for (name, duration), count in own_kernels(event).items():
                add(name, context_of(event), count * duration / 1e3 / steps)
                unclaimed[(name, duration)] -= count
        elif event.self_cpu_time_total and not event.name.startswith(LABEL):
            add(event.name, context_of(event), event.self_cpu_time_total / 1e3 / steps)
    for (name, duration), count in unclaimed.items():
        if count > 0:
            add(name, [], count * duration / 1e3 / steps)
    return dict(found)


def profile(step: Callable[[], None], model: nn.Module, steps: int, other: dict | None = None) -> dict[str, float]:
    step()  # warm-up (Triton compiles, cuBLAS handles, the allocator)
    timing.sync()
    handles = hook_modules(model)
    try:
        prof = timing.trace(step, steps)
    finally:
        for h in handles:
            h.remove()
    return device_times(prof, steps, other)


def contender_steps(model: nn.Module, ids: torch.Tensor, mode: bool = False) -> dict[str, tuple[str, Callable]]:
    """name -> (tier, loss_of): stock; the fast tier unfused, through the fused head and through the fused loss
    (exact without a GPU, and no fused loss); with mode, also the unpatched model under rl_kernel.mode(tier)
    (mode-TIER, unfused head)."""
    tier = "fast" if timing.gpu() else "exact"
    steps = {
        "stock": ("stock", scored_loss(logits_scorer(contenders.stock_token_logprobs))),
        f"{tier}": (tier, scored_loss(logits_scorer(rl_kernel.token_logprobs))),
        f"{tier} fused head": (tier, scored_loss(fused_scorer(tier))),
    }
    if head_loss.computes_in_forward(tier):
        steps[f"{tier} fused loss"] = (tier, fused_loss(tier))
    if mode:
        steps[f"mode-{tier}"] = (f"mode-{tier}", scored_loss(logits_scorer(rl_kernel.token_logprobs)))
    return steps


def chosen(steps: dict[str, tuple[str, Callable]], only: str) -> dict[str, tuple[str, Callable]]:
    """The contenders `only` names (comma-separated; all where empty), stock first: the table's ratios are to it."""
    names = [n.strip() for n in only.split(",") if n.strip()] or list(steps)
    unknown = [n for n in names if n not in steps]
    if unknown or names[0] != "stock":
        raise SystemExit(f"profile_step --only {only!r}: contenders are {', '.join(steps)}, stock first"
                         + (f" (unknown: {', '.join(unknown)})" if unknown else ""))  # fmt: skip
    return {n: steps[n] for n in names}


def table(record: dict) -> str:
    names = list(record["families"])
    fams = sorted(
        {f for n in names for f in record["families"][n]}, key=lambda f: -record["families"]["stock"].get(f, 0)
    )
    head = "| family | " + " | ".join(f"{n} ms" for n in names) + " | " + " | ".join(f"{n} / stock" for n in names[1:])
    lines = [head + " |", "|---|" + "---:|" * (2 * len(names) - 1)]
    for f in [*fams, "total (device)"]:
        vals = [record["families"][n].get(f, 0.0) if f != "total (device)" else sum(record["families"][n].values())
                for n in names]  # fmt: skip
        ratios = [f"{v / vals[0]:.2f}x" if vals[0] else "-" for v in vals[1:]]
        lines.append(f"| {f} | " + " | ".join(f"{v:.2f}" for v in vals) + " | " + " | ".join(ratios) + " |")
    step = record["step_synced_s"]
    lines.append("| step, synced (s) | " + " | ".join(f"{step[n]:.3f}" for n in names) + " | "
                 + " | ".join(f"{step[n] / step['stock']:.2f}x" for n in names[1:]) + " |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = parser(__name__, __doc__)
    ap.add_argument("--model", default="qwen3-1.7b", choices=sorted(model_shapes.SHAPES))
    ap.add_argument("--layers", type=int, default=None, help="override the model's layers")
    ap.add_argument("--train-batch", type=int, default=8)
    ap.add_argument("--train-len", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=2, help="profiled steps per contender")
    ap.add_argument("--reps", type=int, default=3, help="synced step timings per contender (median)")
    ap.add_argument("--mode", action="store_true", help="also the unpatched model under rl_kernel.mode (mode-TIER)")
    ap.add_argument(
        "--only",
        default="",
        help="comma-separated contenders to run (e.g. stock,mode-fast: a model the "
        "patch does not take), stock first; default all",
    )
    ap.add_argument("--top", type=int, default=12, help='the largest kernels of the "other" family to list')
    ap.add_argument("--json")
    ap.add_argument("--markdown")
    args = ap.parse_args(argv)
    shape = model_shapes.shape(args.model, layers=args.layers)
    device = "cuda" if timing.gpu() else "cpu"
    model = model_shapes.build(shape, "bf16" if timing.gpu() else "fp32", 0, device)
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1, shape.vocab, (args.train_batch, args.train_len), generator=g).to(device)
    record: dict = {"shape": vars(shape), "env": environment(), "args": vars(args), "families": {}, "step_synced_s": {}}
    for name, (tier, loss_of) in chosen(contender_steps(model, ids, args.mode), args.only).items():
        model.load_state_dict(initial)
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
        step = lambda loss_of=loss_of, opt=opt: train_step(model, ids, opt, loss_of)  # noqa: E731
        with model_shapes.in_tier(model, tier):
            other: dict[str, float] = {}
            record["families"][name] = profile(step, model, args.steps, other)
            record.setdefault("other_top", {})[name] = dict(sorted(other.items(), key=lambda kv: -kv[1])[: args.top])
            for where, ms in record["other_top"][name].items():
                print(f"{name}: other {ms:8.2f} ms  {where}", flush=True)
            record["step_synced_s"][name] = timing.synced({name: step}, args.reps, warmup=1)[name]
        print(f"{name}: step {record['step_synced_s'][name]:.3f} s; {json.dumps(record['families'][name])}", flush=True)
        del opt
        if timing.gpu():
            torch.cuda.empty_cache()
    publish(table(record), record, args.json, args.markdown)
    return 0
