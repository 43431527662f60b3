"""The model workload's rollout modes (issue 30): the nightly matrix runs the model workload with the compiled
static-cache rollout as cells of their own, and the workload's generate() in each mode gives the training forward's
bits (exact tier, CPU; tests/integrations/test_compiled_rollout.py holds the compile's own negative control)."""

from __future__ import annotations

import pytest

from rl_kernel.bitwise import bits_equal, diff
from rl_kernel.integrations import generation
from rlparity.cell.workloads import model as M
from rlparity.matrix import load_matrix


def test_the_nightly_matrix_has_compiled_rollout_cells() -> None:
    cells = [c for c in load_matrix("nightly").cells if c.shapes == "model-compiled"]
    assert cells and {c.tier for c in cells} == {"exact", "fast"}
    assert all(c.params == {"rollout": "compiled"} and c.placement != "split" for c in cells), cells[0]


def test_an_unknown_rollout_mode_is_named() -> None:
    with pytest.raises(ValueError, match=r"unknown rollout mode 'paged' \(modes: eager, static, compiled\)"):
        generation.rollout_kwargs("paged", "cpu")


@pytest.mark.slow  # an inductor compile of the decode step
@pytest.mark.parametrize("rollout", ["static", "compiled"])
def test_the_workloads_generate_in_each_mode_gives_the_forwards_bits(rollout: str) -> None:
    p = M.prompts(8, 512, 0)
    model = M.patched("qwen3", 512, "bf16", 0, "cpu")
    r = M.generate(model, p, 6, 1, "cpu", rollout)  # the seeded Gumbel sampler, as the cells' RL step
    eager = M.generate(model, p, 6, 1, "cpu")
    assert bits_equal(r.logits, eager.logits), diff(r.logits, eager.logits).summary()
    for view, logits in M.forward_views(model, r, p, "cpu").items():
        assert bits_equal(r.logits, logits), f"{rollout} vs {view}: {diff(r.logits, logits).summary()}"
