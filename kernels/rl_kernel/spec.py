"""OpSpec: what tests, selfcheck and the golden digests need to know about one operator.

Each family's check module (rl_kernel/<tier>/<family>/checks.py) exports SPECS; rl_kernel.contract.families.all_specs()
collects them, and every consumer loops over that instead of keeping its own list of operators.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class Case:
    """The inputs of one case: logits (or the operator's differentiated input), their tokens, the upstream
    gradients a backward takes, and any other inputs (params)."""

    logits: torch.Tensor
    tokens: torch.Tensor
    row_grad: torch.Tensor | None = None  # one value per row: for outputs of shape [...]
    elem_grad: torch.Tensor | None = None  # one value per element: for outputs of shape [..., V]
    ignore_index: int = -100
    params: tuple[torch.Tensor, ...] = ()  # an operator's other inputs (weights, caches), in its order

    def to(self, device: str | torch.device) -> Case:
        """The same case on device (the bits do not change: inputs are made on the CPU)."""
        move = {k: getattr(self, k) for k in ("logits", "tokens", "row_grad", "elem_grad")}
        moved = replace(self, **{k: v.to(device) for k, v in move.items() if v is not None})
        return replace(moved, params=tuple(p.to(device) for p in self.params))


Forward = Callable[[torch.Tensor, Case], torch.Tensor]
GoldenCase = Callable[[int, torch.dtype], Case]  # (vocab, dtype) -> a CPU case
CheckCase = Callable[[int, torch.dtype, int], Case]  # (vocab, dtype, seed) -> a CPU case


@dataclass(frozen=True)
class OpSpec:
    """One public operator.

    forward(x, case) computes the output from logits x (x may be a leaf to differentiate; the other
    inputs come from case). upstream names the case's gradient its backward takes ("row" or
    "elem"); None means the output is not differentiated here.
    """

    name: str
    family: str
    forward: Forward
    upstream: str | None
    golden_case: GoldenCase
    check_case: CheckCase
    golden_vocabs: tuple[int, ...]
    in_golden: bool = True
    # More golden inputs, each (suffix, case): digests keyed "<name>@<suffix>/V.../dtype" (and grad_...).
    golden_extra: tuple[tuple[str, GoldenCase], ...] = ()
    # The sizes selfcheck runs this operator at (its case's feature size); None: the run's vocabularies.
    sizes: tuple[int, ...] | None = None
    # A tier without a CPU reference: the output in float64 from the case, and the largest relative error
    # (||out - ref|| / ||ref||) selfcheck accepts.
    reference: Callable[[Case], torch.Tensor] | None = None
    tolerance: float = 0.0

    def golden_cases(self) -> tuple[tuple[str, GoldenCase], ...]:
        """(name, case) of every golden input set: (name, golden_case), then ("name@suffix", case)."""
        return ((self.name, self.golden_case), *((f"{self.name}@{sfx}", c) for sfx, c in self.golden_extra))

    @property
    def differentiable(self) -> bool:
        return self.upstream is not None

    def output(self, case: Case) -> torch.Tensor:
        return self.forward(case.logits, case)

    def upstream_grad(self, case: Case) -> torch.Tensor:
        grad = case.row_grad if self.upstream == "row" else case.elem_grad
        if grad is None:
            raise ValueError(f"{self.name}: the case has no {self.upstream} gradient")
        return grad

    def output_and_grad(self, case: Case) -> tuple[torch.Tensor, torch.Tensor]:
        """The output and d(output . upstream)/d(logits), through autograd."""
        leaf = case.logits.detach().clone().requires_grad_(True)
        y = self.forward(leaf, case)
        (grad,) = torch.autograd.grad(y, leaf, self.upstream_grad(case))
        return y.detach(), grad

    def gradient(self, case: Case) -> torch.Tensor:
        return self.output_and_grad(case)[1]
