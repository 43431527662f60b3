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

Bits are compared on integer views (rl_kernel.bitwise), never with a tolerance. `python -m rl_kernel.locate`
(below) builds a tiny random Llama / Qwen2 / Qwen3 (or imports a user's factory) and prints the report; exit 0
when the paths agree, 1 when they differ, 3 for bad arguments. transformers is imported only there.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import math
import re
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from rl_kernel import bitwise

ROOT = "(root)"  # the name of the model itself (named_modules' "")
LABELS = ("rollout", "training")


# ---- what one module did on both paths ------------------------------------------------------------------
@dataclass(frozen=True)
class ModuleResult:
    """One module's output on the two paths, aligned: its digests and, when the bits differ, by how much."""

    name: str  # qualified module name (ROOT for the model), "#k" appended for its k-th call (k >= 1) in one forward
    order: int  # position in forward call (output) order
    shape: tuple[int, ...]
    dtype: str
    digest_a: str  # rl_kernel.bitwise.digest of the aligned output on path a (rollout)
    digest_b: str  # ... on path b (training)
    count: int  # elements whose bits differ
    total: int
    max_abs: float
    max_ulp: int  # in the output dtype's own ulps
    first_index: tuple[int, ...] | None = None
    a: torch.Tensor | None = field(default=None, repr=False, compare=False)  # with keep_tensors
    b: torch.Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def equal(self) -> bool:
        return self.count == 0

    @property
    def share(self) -> float:
        return self.count / self.total if self.total else 0.0

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "order": self.order,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "equal": self.equal,
            "digest_a": self.digest_a,
            "digest_b": self.digest_b,
            "count": self.count,
            "total": self.total,
            "share": self.share,
            "max_abs": None if math.isinf(self.max_abs) else self.max_abs,
            "max_ulp": self.max_ulp,
            "first_index": None if self.first_index is None else list(self.first_index),
        }


@dataclass(frozen=True)
class LayerShare:
    """One decoder layer (an item of the model's layer list): the share of its output's elements that differ
    (over its modules' outputs when its own output was not comparable), and its first divergent module."""

    index: int
    name: str
    count: int
    total: int
    first: str | None  # the layer's first divergent module

    @property
    def share(self) -> float:
        return self.count / self.total if self.total else 0.0

    def to_dict(self) -> dict:
        return {"index": self.index, "name": self.name, "count": self.count, "total": self.total,
                "share": self.share, "first": self.first}  # fmt: skip


@dataclass
class Report:
    """The locator's answer: every compared module in forward call order, the skipped ones with why, and the
    per-layer shares. `first` is the first module whose bits differ (None: the two paths agree)."""

    labels: tuple[str, str]
    modules: list[ModuleResult]
    skipped: list[tuple[str, str]]
    layers: list[LayerShare]
    context: dict[str, Any] = field(default_factory=dict)

    @property
    def first(self) -> ModuleResult | None:
        return next((m for m in self.modules if not m.equal), None)

    @property
    def equal(self) -> bool:
        return self.first is None

    @property
    def divergent(self) -> list[ModuleResult]:
        return [m for m in self.modules if not m.equal]

    def module(self, name: str) -> ModuleResult:
        for m in self.modules:
            if m.name == name:
                return m
        raise KeyError(f"no compared module named {name!r}")

    def layer_shares(self) -> dict[str, float]:
        return {layer.name: layer.share for layer in self.layers}

    def summary(self) -> str:
        a, b = self.labels
        ctx = ", ".join(f"{k} {v}" for k, v in self.context.items())
        lines = [f"{a} vs {b}" + (f" ({ctx})" if ctx else "") + f": {len(self.modules)} module outputs compared"]
        first = self.first
        if first is None:
            lines.append("  bitwise equal: every compared module output has the same bits on both paths")
        else:
            lines.append(
                f"  first divergent module: {first.name} (output {list(first.shape)} {first.dtype}): "
                f"{first.count}/{first.total} elements differ, max |a-b| {first.max_abs:.3e}, max {first.max_ulp} ulp"
            )
            lines.append(f"  {len(self.divergent)} of {len(self.modules)} module outputs differ")
        if self.layers:
            lines.append("  per layer, share of elements that differ (first divergent module):")
            for layer in self.layers:
                lines.append(f"    {layer.name:<28} {layer.share:8.2%}" + (f"  {layer.first}" if layer.first else ""))
        if self.skipped:
            lines.append(f"  skipped {len(self.skipped)} module output(s):")
            for name, why in self.skipped[:20]:
                lines.append(f"    {name}: {why}")
            if len(self.skipped) > 20:
                lines.append(f"    ... and {len(self.skipped) - 20} more")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        first = self.first
        return {
            "labels": list(self.labels),
            "equal": self.equal,
            "first": None if first is None else first.to_dict(),
            "modules": [m.to_dict() for m in self.modules],
            "layers": [layer.to_dict() for layer in self.layers],
            "skipped": [{"name": n, "reason": r} for n, r in self.skipped],
            "context": dict(self.context),
        }


# ---- recording --------------------------------------------------------------------------------------------
def first_tensor(output: Any) -> torch.Tensor | None:
    """A module output's first tensor: the tensor itself, else the first tensor of a tuple / list / dict (a
    ModelOutput lists only its set fields), one level deep."""
    if isinstance(output, torch.Tensor):
        return output
    values = output.values() if isinstance(output, dict) else output if isinstance(output, (tuple, list)) else ()
    for v in values:
        if isinstance(v, torch.Tensor):
            return v
    return None


def display(name: str, call: int) -> str:
    base = name or ROOT
    return base if call == 0 else f"{base}#{call}"


class Recorder:
    """Forward hooks on every module of a model; each forward (start() .. the next start()) keeps, per
    (name, call), what `capture(tensor)` returns (or a string: why it was not kept), in output order."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.forwards: list[dict[tuple[str, int], torch.Tensor | str]] = []
        self.capture: Callable[[torch.Tensor], torch.Tensor | str] | None = None
        self._calls: dict[str, int] = {}
        self._handles: list[Any] = []

    def start(self, capture: Callable[[torch.Tensor], torch.Tensor | str] | None) -> None:
        """A new forward; capture None records nothing (a prefill)."""
        self.capture = capture
        self._calls = {}
        if capture is not None:
            self.forwards.append({})

    def _hook(self, name: str) -> Callable:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if self.capture is None:
                return
            call = self._calls.get(name, 0)
            self._calls[name] = call + 1
            t = first_tensor(output)
            if t is None:
                kept: torch.Tensor | str = f"no tensor output ({type(output).__name__})"
            elif t.dtype.is_complex:
                kept = f"a {t.dtype} output (no integer view)"
            else:
                kept = self.capture(t.detach())
            self.forwards[-1][(name, call)] = kept

        return hook

    def __enter__(self) -> Recorder:
        for name, module in self.model.named_modules():
            self._handles.append(module.register_forward_hook(self._hook(name)))
        return self

    def __exit__(self, *exc: Any) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()


def layer_list(model: nn.Module) -> str | None:
    """The name of the model's decoder layer list: the first nn.ModuleList (in module order) with children,
    e.g. model.layers (Hugging Face) or blocks (a user's model)."""
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and len(module) > 0:
            return name
    return None


def _compare(key: tuple[str, int], order: int, a: torch.Tensor, b: torch.Tensor, keep: bool) -> ModuleResult | str:
    if a.shape != b.shape:
        return f"shapes differ: {tuple(a.shape)} vs {tuple(b.shape)}"
    if a.dtype != b.dtype:
        return f"dtypes differ: {a.dtype} vs {b.dtype}"
    try:
        d = bitwise.diff(a, b)
        da, db = bitwise.digest(a), bitwise.digest(b)
    except TypeError as exc:  # no integer view (a complex output)
        return str(exc)
    max_ulp = ulp_distance(a, b) if d.count else 0
    return ModuleResult(
        name=display(*key),
        order=order,
        shape=tuple(a.shape),
        dtype=str(a.dtype).removeprefix("torch."),
        digest_a=da,
        digest_b=db,
        count=d.count,
        total=d.total,
        max_abs=d.max_abs,
        max_ulp=max_ulp,
        first_index=d.first_index,
        a=a.cpu() if keep else None,
        b=b.cpu() if keep else None,
    )


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest distance in units in the last place of the outputs' own dtype (a bf16 output's ulp is bf16's,
    not float32's as in bitwise.diff), over elements whose bits differ; integers: the largest |a - b|."""
    ia, ib = (bitwise.int_view(t.detach().cpu()).to(torch.int64) for t in (a, b))
    if a.dtype.is_floating_point:
        low = -(2 ** (a.element_size() * 8 - 1))  # sign-magnitude bits to integers whose difference counts ulps
        ia, ib = (torch.where(v < 0, low - v, v) for v in (ia, ib))
    return int((ia - ib).abs().max())


_INDEX = re.compile(r"^(\d+)(\.|#|$)")


def _layers(modules: list[ModuleResult], prefix: str | None) -> list[LayerShare]:
    if prefix is None:
        return []
    start = f"{prefix}." if prefix else ""
    groups: dict[int, list[ModuleResult]] = {}
    for m in modules:
        if m.name.startswith(start) and (hit := _INDEX.match(m.name[len(start) :])):
            groups.setdefault(int(hit.group(1)), []).append(m)
    out = []
    for index, group in sorted(groups.items()):
        name = f"{start}{index}"
        own = [m for m in group if m.name == name]
        counted = own or group
        first = next((m.name for m in group if not m.equal), None)
        out.append(LayerShare(index, name, sum(m.count for m in counted), sum(m.total for m in counted), first))
    return out


def _join(
    a: dict[tuple[str, int], torch.Tensor | str],
    b: dict[tuple[str, int], torch.Tensor | str],
    keep: bool,
    labels: tuple[str, str],
) -> tuple[list[ModuleResult], list[tuple[str, str]]]:
    """Compare the records of two forwards key by key, in b's output order (then a's keys b lacks)."""
    modules: list[ModuleResult] = []
    skipped: list[tuple[str, str]] = []
    for key in list(b) + [k for k in a if k not in b]:
        name = display(*key)
        ra, rb = a.get(key), b.get(key)
        if ra is None or rb is None:
            side = labels[0] if ra is None else labels[1]
            skipped.append((name, f"not called on the {side} path"))
            continue
        if isinstance(ra, str) or isinstance(rb, str):
            skipped.append((name, ra if isinstance(ra, str) else rb))  # type: ignore[arg-type]
            continue
        res = _compare(key, len(modules), ra, rb, keep)
        if isinstance(res, str):
            skipped.append((name, res))
        else:
            modules.append(res)
    return modules, skipped


# ---- the rollout path against the training path -----------------------------------------------------
def _cache_of(output: Any) -> Any:
    for attr in ("cache", "past_key_values"):
        cache = getattr(output, attr, None)
        if cache is not None:
            return cache
    if isinstance(output, dict):
        return output.get("cache", output.get("past_key_values"))
    return None


def _forward_kwargs(model: nn.Module) -> tuple[str, bool]:
    """The model's cache keyword (transformers 5.2x renamed past_key_values to cache) and whether its forward
    takes position_ids."""
    params = inspect.signature(model.forward).parameters
    if "cache" in params:
        key = "cache"
    elif "past_key_values" in params:
        key = "past_key_values"
    else:
        raise TypeError(
            f"rl_kernel.locate: {type(model).__name__}.forward takes no past_key_values / cache: locate() needs a "
            "model with Hugging Face's KV-cache calling convention; compare two callables with locate_paths()"
        )
    return key, "position_ids" in params


def locate(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    new_tokens: int = 1,
    *,
    keep_tensors: bool = False,
    layers: str | None = None,
    scored: bool = False,
) -> Report:
    """Run the rollout path (prefill of input_ids[:, :S - new_tokens], then new_tokens decode steps over the KV
    cache) and the training path (one forward over input_ids) under forward hooks; compare every module's
    output at the last new_tokens positions (the decode positions). scored=True compares instead the positions
    whose logits score the completion tokens, S - new - 1 .. S - 2: the prefill's last position, then the decode
    steps but the last; the rollout's log-probs come from exactly these. `layers` names the decoder layer list
    (default: layer_list)."""
    if input_ids.dim() != 2:
        raise ValueError(f"rl_kernel.locate: input_ids must be [batch, seq], got {tuple(input_ids.shape)}")
    batch, seq = input_ids.shape
    if not 1 <= new_tokens < seq:
        raise ValueError(f"rl_kernel.locate: new_tokens must be in [1, {seq - 1}] for a sequence of {seq}")
    prompt = seq - new_tokens
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if tuple(attention_mask.shape) != (batch, seq):
        raise ValueError(f"rl_kernel.locate: attention_mask {tuple(attention_mask.shape)} != input_ids {(batch, seq)}")
    if not bool((attention_mask[:, prompt:] != 0).all()):
        raise ValueError("rl_kernel.locate: the last new_tokens positions must be tokens (mask 1), not padding")
    cache_key, takes_pos = _forward_kwargs(model)
    positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)

    def call(lo: int, hi: int, **extra: Any) -> Any:
        kw = {"input_ids": input_ids[:, lo:hi], "attention_mask": attention_mask[:, :hi], **extra}
        if takes_pos:
            kw["position_ids"] = positions[:, lo:hi]
        return model(**kw)

    def decode_capture(t: torch.Tensor) -> torch.Tensor | str:
        if t.dim() < 2 or t.shape[0] != batch or t.shape[1] != 1:
            return f"no sequence dim at 1 in a decode step (output {tuple(t.shape)})"
        return t.clone()

    def prefill_capture(t: torch.Tensor) -> torch.Tensor | str:
        if t.dim() < 2 or t.shape[0] != batch or t.shape[1] != prompt:
            return f"no sequence dim at 1 in the prefill (output {tuple(t.shape)})"
        return t[:, -1:].clone()

    lo, hi = (prompt - 1, seq - 1) if scored else (prompt, seq)  # the compared positions

    def train_capture(t: torch.Tensor) -> torch.Tensor | str:
        if t.dim() < 2 or t.shape[0] != batch or t.shape[1] != seq:
            return f"no sequence dim at 1 in the forward (output {tuple(t.shape)})"
        return t[:, lo:hi].clone()

    with torch.no_grad(), Recorder(model) as rec:
        rec.start(prefill_capture if scored else None)
        cache = _cache_of(call(0, prompt, use_cache=True))
        if cache is None:
            raise TypeError(f"rl_kernel.locate: {type(model).__name__} returned no cache with use_cache=True")
        for t in range(prompt, hi):
            rec.start(decode_capture)
            cache = _cache_of(call(t, t + 1, use_cache=True, **{cache_key: cache}))
        rec.start(train_capture)
        call(0, seq, use_cache=False)
    steps, (training,) = rec.forwards[:-1], rec.forwards[-1:]
    rollout: dict[tuple[str, int], torch.Tensor | str] = {}
    for key in steps[0]:
        parts = [s.get(key) for s in steps]
        why = next((p for p in parts if isinstance(p, str)), None)
        if why is not None or any(p is None for p in parts):
            rollout[key] = why or "not called in every step of the rollout"
        else:
            rollout[key] = torch.cat(parts, dim=1)  # type: ignore[arg-type]
    modules, skipped = _join(rollout, training, keep_tensors, LABELS)
    if not modules:
        raise ValueError("rl_kernel.locate: no module output could be compared (no [batch, seq, ...] outputs)")
    context = {"batch": batch, "prompt": prompt, "new": new_tokens, "positions": f"{lo}..{hi - 1}",
               "device": str(input_ids.device)}  # fmt: skip
    return Report(LABELS, modules, skipped, _layers(modules, layers or layer_list(model)), context)


def locate_paths(
    run_a: Callable[[], Any],
    run_b: Callable[[], Any],
    model: nn.Module,
    *,
    view_a: Callable[[torch.Tensor], torch.Tensor] | None = None,
    view_b: Callable[[torch.Tensor], torch.Tensor] | None = None,
    labels: tuple[str, str] = ("a", "b"),
    keep_tensors: bool = False,
    layers: str | None = None,
) -> Report:
    """Call run_a() then run_b() (each one or more forwards of model) under forward hooks and compare every
    module's output (its k-th call over the whole run), each mapped by its view first (e.g. a row of the
    batch: view_b=lambda t: t[1:2]). An output a view cannot take, or whose shapes then differ, is skipped."""

    def capture(view: Callable[[torch.Tensor], torch.Tensor] | None) -> Callable[[torch.Tensor], torch.Tensor | str]:
        def keep(t: torch.Tensor) -> torch.Tensor | str:
            try:
                return (view(t) if view else t).clone()
            except (IndexError, RuntimeError, ValueError) as exc:
                return f"the view does not apply to output {tuple(t.shape)}: {exc}"

        return keep

    records = []
    with torch.no_grad(), Recorder(model) as rec:
        for run, view in ((run_a, view_a), (run_b, view_b)):
            rec.start(capture(view))
            run()
            records.append(rec.forwards[-1])
    modules, skipped = _join(records[0], records[1], keep_tensors, labels)
    if not modules:
        raise ValueError("rl_kernel.locate: no module output could be compared")
    return Report(tuple(labels), modules, skipped, _layers(modules, layers or layer_list(model)), {})


# ---- python -m rl_kernel.locate: a tiny random model, or a user's factory --------------------------------
FAMILIES = ("llama", "qwen2", "qwen3")
PAD = 0


def tiny_config(
    family: str, vocab: int, layers: int = 2, hidden: int = 64, heads: int = 4, intermediate: int | None = None
) -> Any:
    """A small config of the family (the harness's model workload builds its models from it) with what it has
    that others lack: Llama 3's rope scaling, Qwen2's q/k/v biases and tied embeddings, Qwen3's q/k norms;
    grouped-query with heads / 2 KV heads; the MLP twice the hidden size unless `intermediate` says."""
    import transformers

    common = dict(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate or 2 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=hidden // heads,
        max_position_embeddings=4096, pad_token_id=PAD, bos_token_id=None, eos_token_id=None, attention_dropout=0.0,
    )  # fmt: skip
    if family == "llama":
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64, "rope_theta": 500000.0}  # fmt: skip
        return transformers.LlamaConfig(**common, rope_parameters=rope)
    if family == "qwen2":
        return transformers.Qwen2Config(**common, tie_word_embeddings=True, use_sliding_window=False)
    if family == "qwen3":
        return transformers.Qwen3Config(**common, use_sliding_window=False)
    raise ValueError(f"unknown model family {family!r} (known: {', '.join(FAMILIES)})")


def tiny_weights(family: str, vocab: int, seed: int, **shape: Any) -> nn.Module:
    """The family's model (tiny_config's shape arguments) in float32 on the CPU, its weights drawn from seed:
    norms near 1, small biases, matrices scaled by fan-in (a tied embedding too: Qwen2's is its output layer, and
    at std 1 its softmax is nearly one-hot, so samples would equal greedy ones)."""
    import transformers

    torch.manual_seed(seed)  # from_config's own init, overwritten below
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(family, vocab, **shape))
    g = torch.Generator().manual_seed(seed)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            w = torch.randn(p.shape, generator=g)
            if name.endswith("norm.weight"):
                w = 1.0 + 0.1 * w
            elif name.endswith("bias"):
                w = 0.1 * w
            elif p.dim() == 2 and ("embed" not in name or tied):
                w = w * p.shape[1] ** -0.5
            p.copy_(w)
    return model


def tiny_model(
    family: str, vocab: int, layers: int = 2, hidden: int = 64, heads: int = 4, *, dtype: str = "fp32",
    seed: int = 0, device: str = "cpu", tier: str = "stock",
) -> nn.Module:  # fmt: skip
    """A random-weight model as the harness's model workload builds it (tiny_weights: drawn on the CPU in float32,
    then cast and moved), in eval mode; patched in `tier` unless "stock"."""
    from rl_kernel.inputs import DTYPE_NAMES

    model = tiny_weights(family, vocab, seed, layers=layers, hidden=hidden, heads=heads)
    model = model.to(DTYPE_NAMES[dtype]).to(device).eval()
    if tier != "stock":
        from rl_kernel.integrations.transformers import patch

        patch(model, tier=tier)
    return model


def sequences(batch: int, prompt: int, new: int, vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[batch, prompt + new] token ids and mask: row b's prompt is 2 .. prompt tokens (seeded), left padded with
    PAD to `prompt`, then `new` completion tokens (random: the paths are compared on the same tokens)."""
    g = torch.Generator().manual_seed(seed + 11)
    ids = torch.full((batch, prompt + new), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for b in range(batch):
        n = int(torch.randint(min(2, prompt), prompt + 1, (1,), generator=g))
        ids[b, prompt - n :] = torch.randint(1, vocab, (n + new,), generator=g)
        mask[b, prompt - n :] = 1
    return ids, mask


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


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m rl_kernel.locate", description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--family", choices=FAMILIES, default="qwen3")
    p.add_argument("--layers", type=_positive, default=2)
    p.add_argument("--hidden", type=_positive, default=64)
    p.add_argument("--heads", type=_positive, default=4)
    p.add_argument("--vocab", type=_positive, default=128)
    p.add_argument("--dtype", choices=("fp32", "bf16", "fp16"), default="fp32")
    p.add_argument("--tier", default="exact", help="stock (unpatched) or an rl_kernel tier: exact, fast")
    p.add_argument("--batch", type=_positive, default=4)
    p.add_argument(
        "--prompt", type=_positive, default=8, help="prompt width (rows are 2 .. PROMPT tokens, left padded)"
    )
    p.add_argument("--new", type=_positive, default=4, help="decode steps compared")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--model",
        metavar="PKG.MODULE:FACTORY",
        help="a factory (no arguments) returning a model with Hugging Face's KV-cache calling convention, "
        "or a tuple (run_a, run_b, model[, locate_paths keyword arguments]) for locate_paths",
    )
    p.add_argument(
        "--scored",
        action="store_true",
        help="compare the positions whose logits score the completion (the prefill's last, then the decode steps "
        "but the last) instead of the decode positions",
    )
    p.add_argument("--json", metavar="OUT", help="also write the report as JSON")
    return p


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
            model = tiny_model(args.family, args.vocab, args.layers, args.hidden, args.heads, dtype=args.dtype,
                               seed=args.seed, device=args.device, tier=args.tier)  # fmt: skip
            ids, mask = sequences(args.batch, args.prompt, args.new, args.vocab, args.seed)
            run = lambda: locate(model, ids.to(device), mask.to(device), args.new, scored=args.scored)  # noqa: E731
    except (ValueError, TypeError, RuntimeError) as exc:
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
    report.context = {"model": what, **report.context}
    print(report.summary())
    code = 0 if report.equal else 1
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**report.to_dict(), "exit": code}, f, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main())
