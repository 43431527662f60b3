"""AdamW whose update has the same bits on every device (the exact tier's optimizer).

torch.optim.AdamW is deterministic run to run, but its fused element ops (lerp, addcmul, addcdiv) compile to
fused multiply-adds on the GPUs and not on the CPU, so CPU and GPU weights part after one step. Here every
operation is one torch call of one IEEE operation (mul, add, div, and sqrt through float64: each correctly
rounded on every device), in float32 (the state, and the update of a bf16/fp16 parameter, rounded to its
dtype once), with the scalars computed in float64 on the host. No tensor is divided by a Python number:
torch's CUDA divide multiplies by the number's float reciprocal instead, its CPU divide does not; the
scalars are multipliers.

    m = m * b1 + g * (1 - b1)            v = v * b2 + (g * g) * (1 - b2)
    p = p * (1 - lr * wd) - (m / (sqrt(v) * c2 + eps)) * c1,   c2 = 1 / sqrt(1 - b2^t), c1 = lr / (1 - b1^t)

    opt = rl_kernel.optim.ExactAdamW(model.parameters(), lr=1e-6, weight_decay=0.01)
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from rl_kernel._validate import check_same_device, check_same_dtype, check_tensor


def _sqrt(v: torch.Tensor) -> torch.Tensor:
    """The correctly rounded float32 square root: in float64 (IEEE on every device), then rounded (exact:
    a float64 square root rounded to float32 is the float32 one). torch's CUDA float32 sqrt is not
    correctly rounded (1 ulp off for about 0.6% of inputs on the H200)."""
    return torch.sqrt(v.double()).float()


def _check_param(p: torch.Tensor, state: dict) -> None:
    """The gradient has the parameter's dtype and device, the state (m, v) is float32 on it: a ValueError or
    TypeError naming the argument (no host sync: dtypes and devices are metadata)."""
    check_same_device({"param": p, "grad": p.grad, "state['m']": state.get("m"), "state['v']": state.get("v")})
    check_same_dtype({"param": p, "grad": p.grad})
    for name in ("m", "v"):
        if name in state:
            check_tensor(state[name], f"state[{name!r}]", torch.float32)


class ExactAdamW(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        if not lr >= 0 or not eps >= 0 or not weight_decay >= 0:
            raise ValueError(f"rl_kernel: lr, eps and weight_decay must be >= 0, got {lr}, {eps}, {weight_decay}")
        if not all(0 <= b < 1 for b in betas):
            raise ValueError(f"rl_kernel: betas must be in [0, 1), got {betas}")
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, self.state[p], group["lr"], b1, b2, group["eps"], group["weight_decay"])
        return loss

    @staticmethod
    def _update(p: torch.Tensor, state: dict, lr: float, b1: float, b2: float, eps: float, wd: float) -> None:
        if p.grad.is_sparse:
            raise ValueError("rl_kernel: ExactAdamW takes dense gradients")
        _check_param(p, state)
        if not state:
            state["step"] = 0
            state["m"] = torch.zeros_like(p, dtype=torch.float32)
            state["v"] = torch.zeros_like(p, dtype=torch.float32)
        state["step"] += 1
        t, g = state["step"], p.grad.float()
        m = torch.add(torch.mul(state["m"], b1), torch.mul(g, 1.0 - b1))
        v = torch.add(torch.mul(state["v"], b2), torch.mul(torch.mul(g, g), 1.0 - b2))
        state["m"], state["v"] = m, v
        denom = torch.add(torch.mul(_sqrt(v), 1.0 / math.sqrt(1.0 - b2**t)), eps)
        update = torch.mul(torch.div(m, denom), lr / (1.0 - b1**t))
        p.copy_(torch.sub(torch.mul(p.float(), 1.0 - lr * wd), update))
