"""The baselines the benchmarks compare rl_kernel against, by name, defined once here:

    copy                    a device copy of the inputs: the memory system's floor (reads and writes them once)
    stock_token_logprobs    PyTorch: log_softmax(x.float()) then gather (what an RL trainer writes)
    stock_log_softmax       PyTorch: log_softmax(x.float())
    stock_head              PyTorch: F.linear + log_softmax + gather + entropy (the unfused LM head)
    stock_linear            PyTorch: F.linear (cuBLAS / hipBLAS)
    sdpa, sdpa_flash        PyTorch: scaled_dot_product_attention (GQA by enable_gqa; the flash backend)
    compiled_token_logprobs torch.compile of gather - logsumexp (static shapes)
    liger_cross_entropy     Liger's cross-entropy (reduction none), where liger-kernel is installed
    liger_fused_linear_ce   Liger's fused linear cross-entropy (the loss only), where liger-kernel is installed
    tier_op(tier, name)     an operator of an rl_kernel tier (exact, fast, ...) through rl_kernel.tiers.get(tier)
    registered_op(name)     the exact tier's registered torch op (torch.ops.rl_kernel.<name>): no Python checks
    head(tier, fused)       rl_kernel's LM head in a tier: fused (lm_head_logprobs) or unfused (head.unfused)

An optional contender that is not installed is skipped with its reason (on stderr and in SKIPPED), never silently.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

SKIPPED: dict[str, str] = {}  # optional contender -> why it is absent (a benchmark's JSON records it)


def skip(name: str, reason: str) -> None:
    SKIPPED[name] = reason
    print(f"bench: contender {name!r} skipped: {reason}", file=sys.stderr)


# ---- the floor ------------------------------------------------------------------------------------------
def copy(*tensors: torch.Tensor) -> Callable[[], None]:
    """A device copy of each tensor into a buffer of its own (allocated here, outside the timing)."""
    pairs = [(torch.empty_like(t), t) for t in tensors]

    def run() -> None:
        for dst, src in pairs:
            dst.copy_(src)

    return run


# ---- stock PyTorch --------------------------------------------------------------------------------------
def stock_token_logprobs(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x.float(), -1).gather(-1, t[..., None])[..., 0]


def stock_log_softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(x.float(), -1)


def stock_head(h: torch.Tensor, w: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Token log-probs and entropy through the materialised fp32 logits."""
    lsm = torch.log_softmax(F.linear(h, w).float(), -1)
    return lsm.gather(-1, t[:, None]).squeeze(-1), -(lsm.exp() * lsm).sum(-1)


def stock_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, w, b)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """PyTorch's attention on the KV heads as they are (grouped-query through enable_gqa)."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def sdpa_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """PyTorch's flash backend (k and v expanded to q's heads by the caller, outside the timing)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


# ---- torch.compile ----------------------------------------------------------------------------------------
def _gather_lse(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return xf.gather(-1, t[:, None]).squeeze(-1) - torch.logsumexp(xf, -1)


def compiled_token_logprobs() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """torch.compile of gather - logsumexp, static shapes (compiled on its first call: warm it up)."""
    return torch.compile(_gather_lse, dynamic=False)


# ---- Liger (optional) ---------------------------------------------------------------------------------------
def liger_cross_entropy() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None:
    """Liger's cross-entropy, reduction none (it writes its gradient into its input: give it logits of its own)."""
    try:
        from liger_kernel.ops.cross_entropy import LigerCrossEntropyFunction
    except Exception as exc:
        skip("liger cross_entropy", f"liger-kernel not available: {exc}")
        return None

    def ce(x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        out = LigerCrossEntropyFunction.apply(x, t, None, -100, 0.0, 0.0, "none")
        return out[0] if isinstance(out, tuple) else out

    return ce


def liger_fused_linear_ce() -> Callable[..., tuple[torch.Tensor, None]] | None:
    """Liger's fused linear cross-entropy as (h, w, t) -> (-loss, None): the summed log-prob, no entropy."""
    try:
        from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
    except Exception as exc:
        skip("liger fused linear CE", f"liger-kernel not available: {exc}")
        return None
    loss = LigerFusedLinearCrossEntropyLoss(reduction="sum")
    return lambda h, w, t: (-loss(w, h, t), None)


# ---- rl_kernel --------------------------------------------------------------------------------------------
def tier_op(tier: str, name: str) -> Any:
    """The operator `name` of the tier (its own, its control's under $RL_KERNEL_CONTROL, or its fallback's)."""
    from rl_kernel import tiers

    return tiers.get(tier).op(name)


def registered_op(name: str) -> Any:
    """The exact tier's torch op as registered by its extension (no argument checks, no Python wrapper)."""
    from rl_kernel import tiers

    tiers.get("exact").api()  # loads the extension, which registers torch.ops.rl_kernel
    return getattr(torch.ops.rl_kernel, name)


def head(tier: str, fused: bool = True) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """rl_kernel's LM head in the tier as (h, w, t) -> (token log-probs, entropy): fused (the logits never
    materialised) or the tier's unfused path (its linear, then the row kernels)."""
    from rl_kernel import head as rl_head

    fn = rl_head.lm_head_logprobs if fused else rl_head.unfused
    return lambda h, w, t: fn(h, w, t, tier=tier, entropy=True)


def logp_plus_entropy(logp: torch.Tensor, ent: torch.Tensor) -> torch.Tensor:
    return logp + ent


def head_loss(tier: str) -> Callable[..., tuple[torch.Tensor, None]]:
    """rl_kernel.lm_head_loss in the tier as (h, w, t) -> (loss, None): the loss sum(logp + entropy), the
    gradient the other heads' sum(logp) + sum(entropy) gives, computed in the forward (three head GEMMs)."""
    from rl_kernel.head.loss import lm_head_loss

    return lambda h, w, t: (lm_head_loss(h, w, t, logp_plus_entropy, torch.sum, tier=tier, entropy=True).loss, None)
