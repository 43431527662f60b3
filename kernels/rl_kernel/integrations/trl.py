"""TRL's GRPOTrainer made exact: the training forward's per-token log-probs equal, bit for bit, the log-probs of
generate()'s logits for the same completions (with the trainer's temperature), on a model patched with
rl_kernel.integrations.transformers.patch.

Where stock TRL breaks the equality (TRL 1.16): GRPOTrainer never calls `selective_log_softmax` on the training
side. It adds a fused LM head (`trl.trainer.utils.add_fused_lm_head`) and computes the log-probs with
`model(..., labels=labels, fused_lm_head=True)`, which runs the (patched) backbone and then TRL's own chunked
`hidden @ lm_head.weight.T` with an online logsumexp and the temperature folded in: the patched lm_head and its
backward are bypassed, and those chunks are another reduction than generate()'s logits go through. So swapping the
import of selective_log_softmax (rl_kernel.integrations.frameworks) does nothing for GRPOTrainer.

The fix, here and not in TRL, two ways:
- `ExactGRPOTrainer`, a GRPOTrainer whose `_get_per_token_logps_and_entropies` runs the patched decoder and scores
  the completions from its hidden states through rl_kernel's fused head (rl_kernel.lm_head_logprobs, via
  integrations.transformers.completion_logprobs: the logits are never materialised, as in TRL's head), with the
  temperature divided as generate()'s warper divides (frameworks.divide_by_temperature). TRL 1.10 and 1.16.
- `install()` (TRL >= 1.16): rl_kernel's `add_fused_lm_head` in place of TRL's, so the stock GRPOTrainer (and
  DPO/KTO, which call the same head) score a patched model exactly; an unpatched model keeps TRL's head.
`selective_log_softmax` is the same function in TRL 1.16's signature, for the rollout side (a user scoring
generate()'s logits); install() puts it in place of TRL's own too.

    from rl_kernel.integrations import transformers as rl_hf
    from rl_kernel.integrations.trl import ExactGRPOTrainer
    model = rl_hf.patch(model, tier="exact")
    trainer = ExactGRPOTrainer(model=model, reward_funcs=..., args=GRPOConfig(...), ...)
    # or: rl_kernel.integrations.trl.install(); trainer = trl.GRPOTrainer(model=model, ...)

Text-only dense models (no images, no MoE aux loss): anything else raises NotImplementedError rather than
silently falling back. Tested with TRL 1.10.0 and 1.16.0 (transformers 5.24, accelerate 1.16, datasets 5.2, torch
2.13, CPU) at TRL's defaults: bf16 autocast and gradient checkpointing on (tests/integrations/test_trl.py). TRL 1.10
still scores logits (`logits / self.temperature`, selective_log_softmax of two arguments); the override is the same.
"""

from __future__ import annotations

from typing import Any

import torch

from rl_kernel.exact.softmax.ops import token_logprobs
from rl_kernel.integrations.frameworks import divide_by_temperature

TESTED = ("1.10.0", "1.16.0")  # TRL versions tests/integrations/test_trl.py passed with (the range's two ends)


def selective_log_softmax(
    logits: torch.Tensor, index: torch.Tensor, temperature: float = 1.0, row_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """TRL 1.16's selective_log_softmax, exact: log softmax(logits / temperature)[index] in fp32 (a true division,
    rl_kernel's token_logprobs); rows where row_mask is 0 give 0. index of shape (...) only (not (..., K))."""
    if index.dim() != logits.dim() - 1:
        raise NotImplementedError("rl_kernel.integrations.trl.selective_log_softmax: index of shape (...) only")
    scaled = divide_by_temperature(logits, temperature) if temperature != 1.0 else logits.float()
    out = token_logprobs(scaled, index)
    return out if row_mask is None else out.masked_fill(row_mask == 0, 0.0)


def per_token_logps(model, input_ids, attention_mask, logits_to_keep: int, temperature: float, want_entropy: bool):
    """The last `logits_to_keep` tokens' log-probs (and entropies) of a patched model, through its fused head
    (integrations.transformers.completion_logprobs: the decoder's hidden states, never the logits): bit for bit
    selective_log_softmax of generate()'s logits with the same temperature."""
    from rl_kernel.integrations.transformers import completion_logprobs

    out = completion_logprobs(
        model, input_ids, attention_mask, logits_to_keep, temperature=_temperature(temperature), entropy=want_entropy
    )
    return out if want_entropy else (out, None)


def _temperature(t: float) -> float | None:
    return None if t == 1.0 else float(t)


def _make_trainer_class():
    from trl import GRPOTrainer

    class ExactGRPOTrainer(GRPOTrainer):
        """GRPOTrainer whose log-probs go through the patched model's own lm_head and rl_kernel's token_logprobs."""

        def _get_per_token_logps_and_entropies(
            self,
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size=None,
            compute_entropy=False,
            compute_aux_loss=False,
            **multimodal: Any,
        ):
            used = sorted(k for k, v in multimodal.items() if v is not None)
            if compute_aux_loss or used:
                raise NotImplementedError(
                    f"ExactGRPOTrainer: text-only dense models (got {'the MoE aux loss' if compute_aux_loss else used})"
                )
            batch_size = batch_size or input_ids.size(0)
            logps, entropies = [], []
            for start in range(0, input_ids.size(0), batch_size):
                rows = slice(start, start + batch_size)
                with self.accelerator.autocast():
                    lp, ent = per_token_logps(
                        model, input_ids[rows], attention_mask[rows], logits_to_keep, self.temperature, compute_entropy
                    )
                logps.append(lp)
                entropies.append(ent)
            return torch.cat(logps), (torch.cat(entropies) if compute_entropy else None), None

    return ExactGRPOTrainer


_CLASSES: dict[str, type] = {}


# ---- TRL's fused LM head (TRL >= 1.16), exact on a patched model -------------------------------------------
_FUSED_OUTPUTS = ("log_probs", "entropy")  # of TRL's FusedCausalLMOutput fields, the ones computed here
_TRL_ADD_FUSED: list[Any] = []  # TRL's own add_fused_lm_head, while install() has replaced it


def add_fused_lm_head(
    model, temperature: float = 1.0, cast_lm_head_to_fp32: bool = False, outputs: tuple[str, ...] = ("log_probs",)
) -> None:
    """TRL's add_fused_lm_head, exact for a model patched with rl_kernel: `model(..., labels=labels,
    fused_lm_head=True)` returns a FusedCausalLMOutput whose log_probs (and entropy) come from rl_kernel's fused
    head over the patched backbone's hidden states, bit for bit selective_log_softmax of generate()'s logits at the
    same temperature. A model that is not patched gets TRL's own head (nothing to be exact with)."""
    from rl_kernel.integrations.transformers import tier_of

    if tier_of(model) is None:
        return _trl_add_fused()(model, temperature, cast_lm_head_to_fp32, outputs)
    unknown = [o for o in outputs if o not in _FUSED_OUTPUTS]
    if unknown:
        raise NotImplementedError(f"rl_kernel's fused LM head computes {_FUSED_OUTPUTS}, not {unknown}")
    if cast_lm_head_to_fp32:
        raise ValueError(
            "rl_kernel: cast_lm_head_to_fp32 would score with another lm_head than generate() samples from; the "
            "patched model's head is already exact (set GRPOConfig(cast_lm_head_to_fp32=False))"
        )
    import functools
    import types

    original = model.forward

    @functools.wraps(type(model).forward)
    def forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None, **kw):
        if not fused_lm_head:
            extra = {"labels": labels, "shift_labels": shift_labels, "num_items_in_batch": num_items_in_batch}
            return original(*args, **kw, **{k: v for k, v in extra.items() if v is not None})
        return _fused_output(self, args, kw, labels, shift_labels, num_items_in_batch, temperature, outputs)

    model.forward = types.MethodType(forward, model)


def _fused_output(model, args, kw, labels, shift_labels, num_items_in_batch, temperature, outputs):
    from trl.trainer.utils import FusedCausalLMOutput

    from rl_kernel.head import lm_head_logprobs
    from rl_kernel.integrations.patched import descriptor_of

    used = sorted(k for k in ("output_router_logits", "pixel_values") if kw.get(k))
    if used:
        raise NotImplementedError(f"rl_kernel's fused LM head: text-only dense models (got {used})")
    kw["use_cache"] = False
    hidden = model.get_decoder()(*args, **kw).last_hidden_state
    if shift_labels is None:
        hidden, labels = hidden[:, :-1], labels[:, 1:]
    else:
        labels = shift_labels
    mask = labels != -100
    lm_head = model.get_output_embeddings()
    logp, ent = lm_head_logprobs(
        hidden, lm_head.weight, labels, tier=descriptor_of(model), bias=lm_head.bias,
        temperature=_temperature(temperature), entropy=True,
    )  # fmt: skip
    ent = ent.masked_fill(~mask, 0.0) if "entropy" in outputs else None
    count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
    return FusedCausalLMOutput(loss=-logp.sum() / count, log_probs=logp, entropy=ent, label_mask=mask)


def _trl_add_fused():
    import trl
    import trl.trainer.utils as tu

    if _TRL_ADD_FUSED:
        return _TRL_ADD_FUSED[0]
    if not hasattr(tu, "add_fused_lm_head"):
        raise NotImplementedError(
            f"TRL {trl.__version__} has no fused LM head (TRL >= 1.16): an unpatched model has no TRL head to keep"
        )
    return tu.add_fused_lm_head


# ---- install / uninstall -----------------------------------------------------------------------------------
_REPLACED: list[tuple[Any, str, Any]] = []  # (module, name, TRL's own function) that install() replaced


def install() -> None:
    """Put the exact selective_log_softmax and (TRL >= 1.16) add_fused_lm_head in place of TRL's, in
    trl.trainer.utils and every trl module that imported them; uninstall() puts TRL's back."""
    import sys

    import trl.trainer.utils as tu

    ours = {"selective_log_softmax": selective_log_softmax, "add_fused_lm_head": add_fused_lm_head}
    for name, mine in ours.items():
        original = getattr(tu, name, None)
        if original is None or original is mine:
            continue  # TRL < 1.16 has no fused head; already installed
        if name == "add_fused_lm_head":
            _TRL_ADD_FUSED.append(original)
        for module in list(sys.modules.values()):
            modname = getattr(module, "__name__", "") or ""
            if modname.split(".")[0] == "trl" and getattr(module, name, None) is original:
                _REPLACED.append((module, name, original))
                setattr(module, name, mine)


def uninstall() -> None:
    while _REPLACED:
        module, name, original = _REPLACED.pop()
        setattr(module, name, original)
    _TRL_ADD_FUSED.clear()


def __getattr__(name: str) -> Any:
    """ExactGRPOTrainer is made on first use (PEP 562): importing this module needs no TRL."""
    if name == "ExactGRPOTrainer":
        if name not in _CLASSES:
            _CLASSES[name] = _make_trainer_class()
        return _CLASSES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
