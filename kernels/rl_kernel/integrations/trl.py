"""TRL's GRPOTrainer made exact: the training forward's per-token log-probs equal, bit for bit, the log-probs of
generate()'s logits for the same completions (with the trainer's temperature), on a model patched with
rl_kernel.integrations.transformers.patch.

Where stock TRL breaks the equality (TRL 1.16): GRPOTrainer never calls `selective_log_softmax` on the training
side. It adds a fused LM head (`trl.trainer.utils.add_fused_lm_head`) and computes the log-probs with
`model(..., labels=labels, fused_lm_head=True)`, which runs the (patched) backbone and then TRL's own chunked
`hidden @ lm_head.weight.T` with an online logsumexp and the temperature folded in: the patched lm_head and its
backward are bypassed, and those chunks are another reduction than generate()'s logits go through. So swapping the
import of selective_log_softmax (rl_kernel.integrations.frameworks) does nothing for GRPOTrainer.

The fix, here and not in TRL: `ExactGRPOTrainer`, a GRPOTrainer whose `_get_per_token_logps_and_entropies` runs the
model's ordinary forward (the patched lm_head, `logits_to_keep` positions only), divides by the temperature with
one correctly rounded division per element (frameworks.divide_by_temperature, as generate()'s temperature warper
does on the CPU) and takes the log-probs with rl_kernel's token_logprobs (entropies: rl_kernel.entropy), both
batch invariant and differentiable through rl_kernel's deterministic backward. `selective_log_softmax` is the same
function in TRL 1.16's signature, for the rollout side (a user scoring generate()'s logits); `install()` puts it in
place of TRL's own so that TRL code and user code calling `trl.trainer.utils.selective_log_softmax` get it.

    from rl_kernel.integrations import transformers as rl_hf
    from rl_kernel.integrations.trl import ExactGRPOTrainer
    model = rl_hf.patch(model, tier="exact")
    trainer = ExactGRPOTrainer(model=model, reward_funcs=..., args=GRPOConfig(...), ...)

Text-only dense models (no images, no MoE aux loss): anything else raises NotImplementedError rather than
silently falling back. Tested with TRL 1.10.0 and 1.16.0 (transformers 5.24, accelerate 1.16, datasets 5.2, torch
2.13, CPU) at TRL's defaults: bf16 autocast and gradient checkpointing on (tests/integrations/test_trl.py). TRL 1.10
still scores logits (`logits / self.temperature`, selective_log_softmax of two arguments); the override is the same.
"""

from __future__ import annotations

from typing import Any

import torch

from rl_kernel.integrations.frameworks import divide_by_temperature
from rl_kernel.ops.softmax import entropy, token_logprobs

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
    """The last `logits_to_keep` tokens' log-probs (and entropies) under the model's ordinary forward."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=logits_to_keep + 1).logits
    logits = logits[:, :-1][:, -logits_to_keep:]  # position i scores token i + 1
    scaled = divide_by_temperature(logits, temperature)
    logps = token_logprobs(scaled, input_ids[:, -logits_to_keep:])
    return logps, (entropy(scaled) if want_entropy else None)


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


_REPLACED: list[tuple[Any, Any]] = []  # (module, TRL's own function) that install() replaced


def install() -> None:
    """Put the exact selective_log_softmax in place of TRL's (trl.trainer.utils and the trl modules that imported
    it); uninstall() puts TRL's back."""
    import sys

    import trl.trainer.utils as tu

    original = tu.selective_log_softmax
    if original is selective_log_softmax:
        return
    for module in list(sys.modules.values()):
        name = getattr(module, "__name__", "") or ""
        if name.split(".")[0] == "trl" and getattr(module, "selective_log_softmax", None) is original:
            _REPLACED.append((module, original))
            module.selective_log_softmax = selective_log_softmax


def uninstall() -> None:
    while _REPLACED:
        module, original = _REPLACED.pop()
        module.selective_log_softmax = original


def __getattr__(name: str) -> Any:
    """ExactGRPOTrainer is made on first use (PEP 562): importing this module needs no TRL."""
    if name == "ExactGRPOTrainer":
        if name not in _CLASSES:
            _CLASSES[name] = _make_trainer_class()
        return _CLASSES[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
