"""Where do two paths through a model first part? A divergence locator over any PyTorch module.

    from rl_kernel.locate import locate, locate_paths
    report = locate(model, input_ids, attention_mask, new_tokens=4)     # rollout (prefill + decode) vs training
    print(report.summary())          # the first module whose bits differ, its max |a-b| and ulp, per-layer shares
    report.first.name                # e.g. "model.layers.3.mlp.down_proj"; None when the paths agree
    report = locate_paths(lambda: model(x[1:2]), lambda: model(x), model, view_b=lambda t: t[1:2])

Forward hooks on every module record each module's output (the first tensor of what it returns: a tensor, the
first element of a tuple, the first tensor field of a ModelOutput), keyed by its qualified name and its call
number within one forward, in the order the outputs are produced (a module's children finish before it does,
so the first differing output is the op where the paths part, not the model that contains it).

locate() runs the two paths of an RL step over one batch of sequences [B, S] whose last `new_tokens` tokens are
the completion:
  rollout   a prefill of the prompt (the first S - new tokens) with use_cache=True, then `new` decode steps of one
            token each over the KV cache (Hugging Face's calling convention: input_ids, attention_mask,
            position_ids, use_cache and past_key_values / cache), each module's output kept at the decode positions;
  training  one teacher-forced forward over all S tokens, each module's output sliced at the same positions.
Position ids are passed to both paths from the mask (1s so far - 1), as generate() derives them, when the
model's forward takes position_ids. A module's outputs are compared where they have the sequence at dim 1
([B, 1, ...] per decode step, [B, S, ...] in the forward); any other output is skipped with a note.

locate_paths() compares two arbitrary callables' records (a model without a KV cache; one row alone vs in a
batch), with optional views that map each recorded output before the comparison.

Bits are compared on integer views (rl_kernel.bitwise), never with a tolerance. The locator itself is
rl_kernel.locator; this module is its face and its command line: `python -m rl_kernel.locate` (main(), below)
builds a tiny random Llama / Qwen2 / Qwen3 (rl_kernel.models; or imports a user's factory) and prints the report;
exit 0 when the paths agree, 1 when they differ, 3 for bad arguments. transformers is imported only there.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import traceback
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rl_kernel.locator import (
    LABELS,
    ROOT,
    LayerShare,
    ModuleResult,
    Recorder,
    Report,
    display,
    first_tensor,
    layer_list,
    locate,
    locate_paths,
    ulp_distance,
)
from rl_kernel.models import ARCHITECTURES, PATCHED, sequences, tiny_model
from rl_kernel.tiers import TierError

__all__ = [
    "LABELS",
    "ROOT",
    "LayerShare",
    "ModuleResult",
    "Recorder",
    "Report",
    "display",
    "first_tensor",
    "layer_list",
    "locate",
    "locate_paths",
    "main",
    "ulp_distance",
]


def _factory(spec: str) -> Callable[[], Any]:
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"--model takes pkg.module:factory, got {spec!r}")
    try:
        obj = importlib.import_module(module)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--model {spec}: cannot import it: {exc}") from exc
    if not callable(obj):
        raise ValueError(f"--model {spec}: not callable")
    return obj


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # bad arguments: exit 3 (as the harness's)
        self.print_usage(sys.stderr)
        self.exit(3, f"{self.prog}: error: {message}\n")


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


EPILOG = "Exit 0: the paths agree bit for bit; 1: they differ; 3: bad arguments; 2: a crash (pydoc rl_kernel.locate)."


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m rl_kernel.locate", description=__doc__.split("\n\n")[0], epilog=EPILOG)
    p.add_argument("--family", choices=ARCHITECTURES, default="qwen3", help=f"patch() takes {', '.join(PATCHED)}")
    p.add_argument("--layers", type=_positive, default=2)
    p.add_argument("--hidden", type=_positive, default=64)
    p.add_argument("--heads", type=_positive, default=4)
    p.add_argument("--vocab", type=_positive, default=128)
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument(
        "--tier",
        default=None,
        help="stock (unpatched) or an rl_kernel tier: exact, fast (default: exact; stock with --mode)",
    )
    p.add_argument("--batch", type=_positive, default=4)
    p.add_argument("--prompt", type=_positive, default=8, help="rows of 2 .. PROMPT tokens, left padded")
    p.add_argument("--new", type=_positive, default=4, help="decode steps compared")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--model",
        metavar="PKG.MODULE:FACTORY",
        help="a factory returning a model (Hugging Face's KV-cache convention) or (run_a, run_b, model[, kwargs])",
    )
    p.add_argument(
        "--scored",
        action="store_true",
        help="compare the positions whose logits score the completion, not the decode positions",
    )
    p.add_argument(
        "--mode",
        metavar="TIER",
        help="run the unpatched model under rl_kernel.mode(TIER) (every architecture), and audit a forward and "
        "backward of it: the operators the mode leaves to stock",
    )
    p.add_argument("--json", metavar="OUT", help="also write the report as JSON")
    return p


def _checked(args: argparse.Namespace) -> None:
    """Options that cannot go together, named."""
    if args.mode and args.tier not in (None, "stock"):
        raise ValueError(f"--mode {args.mode} runs the unpatched model: leave --tier out (got --tier {args.tier})")
    args.tier = args.tier or ("stock" if args.mode else "exact")
    if args.tier != "stock" and args.family not in PATCHED:
        raise ValueError(f"--family {args.family}: patch() takes {', '.join(PATCHED)}; try --mode {args.tier}")


def _audited(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor, tier: str):
    """rl_kernel.aten.mode.audit of one forward and backward of a Hugging Face model over the sequences."""
    from rl_kernel.aten import mode as aten_mode

    def step() -> None:
        logits = model(input_ids=ids, attention_mask=mask).logits
        logits.float().sum().backward()

    found = aten_mode.audit(step, tier)
    model.zero_grad(set_to_none=True)
    return found


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"--device {args.device}: no CUDA/ROCm device is available")
        device = torch.device(args.device)
        if args.model:
            made = _factory(args.model)()
            if isinstance(made, tuple):
                if len(made) not in (3, 4) or not isinstance(made[2], nn.Module):
                    raise ValueError(f"--model {args.model}: a tuple must be (run_a, run_b, model[, kwargs])")
                kwargs = made[3] if len(made) == 4 else {}
                if not isinstance(kwargs, dict):
                    raise ValueError(f"--model {args.model}: the tuple's 4th item is locate_paths' keyword arguments")
                run = lambda: locate_paths(made[0], made[1], made[2], **kwargs)  # noqa: E731
            elif isinstance(made, nn.Module):
                model = made.to(device).eval()
                vocab = getattr(getattr(model, "config", None), "vocab_size", None) or args.vocab
                ids, mask = sequences(args.batch, args.prompt, args.new, vocab, args.seed)
                run = lambda: locate(model, ids.to(device), mask.to(device), args.new, scored=args.scored)  # noqa: E731
            else:
                raise ValueError(f"--model {args.model} returned {type(made).__name__}, not a model or a tuple")
        else:
            _checked(args)
            model = tiny_model(args.family, args.vocab, args.layers, args.hidden, args.heads, dtype=args.dtype,
                               seed=args.seed, device=args.device, tier=args.tier)  # fmt: skip
            ids, mask = sequences(args.batch, args.prompt, args.new, args.vocab, args.seed)
            run = lambda: locate(model, ids.to(device), mask.to(device), args.new, scored=args.scored)  # noqa: E731
        if args.mode:
            import rl_kernel

            rl_kernel.tiers.get(args.mode)  # an unknown tier is a clear error here, before any work
            plain_run = run

            def run() -> Report:
                with rl_kernel.mode(args.mode):
                    report = plain_run()
                report.context["audit"] = _audited(model, ids.to(device), mask.to(device), args.mode).summary()
                return report
    except (ValueError, TypeError, RuntimeError, TierError) as exc:
        print(f"rl_kernel.locate: {exc}", file=sys.stderr)
        return 3
    try:
        report = run()
    except (ValueError, TypeError) as exc:  # a model the locator cannot take, or no comparable output
        print(f"rl_kernel.locate: {exc}", file=sys.stderr)
        return 3
    except Exception:  # a crash is exit 2, never 1 (which says the paths differ)
        traceback.print_exc()
        return 2
    what = args.model or f"{args.family} {args.tier} {args.dtype} layers {args.layers} hidden {args.hidden}"
    if args.mode:
        what += f" under rl_kernel.mode({args.mode!r})"
    report.context = {"model": what, **report.context}
    print(report.summary())
    if "audit" in report.context:
        print(f"audit: {report.context['audit']}")
    code = 0 if report.equal else 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**report.to_dict(), "exit": code}, f, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main())
