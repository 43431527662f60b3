"""The locator itself: forward hooks on every module record each output (Recorder); locate() runs a model's
rollout path (a prefill, then decode steps over the KV cache) and its training path (one teacher-forced forward)
and compares the records at the same positions; locate_paths() compares two arbitrary callables' records."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from rl_kernel import bitwise
from rl_kernel.locator.report import LABELS, ROOT, LayerShare, ModuleResult, Report


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
