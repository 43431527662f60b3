"""`rlparity locate`: where a model's rollout path (a prefill, then decode steps over the KV cache) and its training
path (one teacher-forced forward) first part: the first module whose output bits differ, its max |a-b| and ulp,
and the share of differing elements per decoder layer.

The host never imports torch or rl_kernel: this runs `python -m rl_kernel.locate` (rl_kernel/locate.py) as a
subprocess and prints its report. The model is a tiny random Llama / Qwen2 / Qwen3 built as the model workload
builds it (stock, or patched in a tier), or a user's own with --model pkg.module:factory. Exit 0 when the two paths
agree bit for bit, 1 when they differ (the report names the module), 3 for bad arguments, 2 when it crashed."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

from rlparity import gate
from rlparity.config import ConfigError
from rlparity.ui import console

FAMILIES = ("llama", "qwen2", "qwen3")  # rl_kernel.locate.FAMILIES (the host cannot import it)
DTYPES = ("fp32", "bf16", "fp16")
FACTORY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("locate", help="name the first module where a model's rollout and training paths differ")
    p.add_argument("--family", choices=FAMILIES, default="qwen3")
    p.add_argument("--layers", type=_positive, default=2)
    p.add_argument("--hidden", type=_positive, default=64)
    p.add_argument("--heads", type=_positive, default=4)
    p.add_argument("--vocab", type=_positive, default=128)
    p.add_argument("--dtype", choices=DTYPES, default="fp32")
    p.add_argument("--tier", default="exact", help="stock (unpatched) or a tier: exact, fast")
    p.add_argument("--batch", type=_positive, default=4)
    p.add_argument("--prompt", type=_positive, default=8, help="prompt width (2 .. PROMPT tokens a row, left padded)")
    p.add_argument("--new", type=_positive, default=4, help="decode steps compared with the forward")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--model",
        metavar="PKG.MODULE:FACTORY",
        help="a user's model: a factory returning the model (Hugging Face's KV-cache calling convention) "
        "or (run_a, run_b, model[, kwargs]) for two callables",
    )
    p.add_argument(
        "--scored",
        action="store_true",
        help="compare the positions whose logits score the completion (the prefill's last, then the decode steps "
        "but the last) instead of the decode positions",
    )
    p.add_argument("--json", metavar="OUT", help="also write the report as JSON")
    p.set_defaults(func=cmd_locate)


def argv(args: argparse.Namespace) -> list[str]:
    """The arguments of `python -m rl_kernel.locate` for these options (checked here: bad ones are exit 3)."""
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.device):
        raise ConfigError(f"--device {args.device!r}: cpu, cuda or cuda:N")
    if args.model is not None and not FACTORY.match(args.model):
        raise ConfigError(f"--model {args.model!r}: expected pkg.module:factory")
    out = []
    for name in ("family", "layers", "hidden", "heads", "vocab", "dtype", "tier", "batch", "prompt", "new",
                 "device", "seed", "model", "json"):  # fmt: skip
        value = getattr(args, name)
        if value is not None:
            out += [f"--{name}", str(value)]
    return out + (["--scored"] if args.scored else [])


def cmd_locate(args: argparse.Namespace) -> int:
    proc = subprocess.run([sys.executable, "-m", "rl_kernel.locate", *argv(args)], capture_output=True, text=True)
    if proc.stdout:
        console.print(proc.stdout.rstrip(), markup=False, highlight=False)
    if proc.returncode in (gate.OK, gate.MISMATCH, gate.CONFIG):
        if proc.returncode == gate.CONFIG:
            console.print(f"[red]configuration error:[/] {proc.stderr.strip()[-2000:]}")
        return proc.returncode
    console.print(f"[red]rl_kernel.locate failed (exit {proc.returncode}):[/]")
    console.print(proc.stderr.rstrip()[-4000:], markup=False, highlight=False)
    return gate.ERROR
