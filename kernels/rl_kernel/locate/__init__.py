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

from rl_kernel.locate.paths import Recorder, display, first_tensor, layer_list, locate, locate_paths, ulp_distance
from rl_kernel.locate.report import LABELS, ROOT, LayerShare, ModuleResult, Report

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
    "ulp_distance",
]
