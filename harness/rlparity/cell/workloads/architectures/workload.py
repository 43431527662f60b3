"""The architectures workload: every architecture of rl_kernel.models (Llama, Qwen2, Qwen3, Mistral, Phi-3, OLMo 2,
Qwen3-MoE, Gemma 2, Gemma 3) and a decoder in plain PyTorch, unpatched, under rl_kernel.mode(tier): generate()'s
logits against the teacher-forced forward's, and the mode's audit of a training forward and backward. Its suite is
rlparity/cell/suite/test_architectures.py.

No committed digests: the mode leaves elementwise functions (exp, rsqrt, the rotary table's cos and sin) to torch,
whose CPU and GPU libraries round some of them differently (docs/architecture.md, "The mode"); each cell proves
generate == forward on its own device."""

from __future__ import annotations

from rlparity.cell.workloads import SUITE_DIR, Workload

WORKLOAD = Workload(
    name="architectures",
    suite=(SUITE_DIR / "test_architectures.py",),
    params={"layers": 2, "hidden": 64, "heads": 4},
    needs=("linear", "attention", "log_softmax"),
    description="every architecture of rl_kernel.models unpatched under rl_kernel.mode(tier): generate() vs the "
    "training forward, and the mode's audit",
)
