"""The model workload's rollout modes (issue 30): the nightly matrix runs the model workload with the compiled
static-cache rollout and with transformers' continuous batching as cells of their own, and the workload's rollout in
each mode gives the training forward's bits (exact tier, CPU; tests/integrations/test_compiled_rollout.py and
test_paged.py hold their own negative controls)."""

from __future__ import annotations

import pytest

from rl_kernel.bitwise import bits_equal, diff
from rl_kernel.integrations import generation, paged
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


def test_the_nightly_matrix_has_continuous_batching_cells() -> None:
    cells = [c for c in load_matrix("nightly").cells if c.shapes == "model-batched"]
    assert cells and {c.tier for c in cells} == {"exact", "fast"}
    assert all(c.params == {"rollout": "batched"} and c.placement != "split" for c in cells), cells[0]


def test_the_batched_mode_is_the_engines_not_generates() -> None:
    with pytest.raises(ValueError, match="the batched rollout is transformers' engine"):
        M.generate(M.patched("llama", 512, "fp32", 0, "cpu"), M.prompts(2, 512, 0), 2, None, "cpu", M.BATCHED)


@pytest.mark.skipif(not paged.served(), reason=paged.UNSERVED)
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_the_engines_rollout_gives_the_forwards_bits(family: str) -> None:
    """The workload's engine rollout (generate_batch of the cell's prompts, greedy): its log-probs equal those of
    every forward view's rows, and its tokens are those rows' argmax; a stock model's engine differs (the control)."""
    p = M.prompts(8, 512, 0)
    model = M.patched(family, 512, "bf16", 0, "cpu")
    r = M.engine_rollout(model, p, 6)
    for view, logits in M.forward_views(model, r, p, "cpu").items():
        want = paged.engine_logprobs(logits.reshape(-1, 512), r.completions.reshape(-1)).view(r.logprobs.shape)
        assert bits_equal(r.logprobs, want), f"{family} {view}: {diff(r.logprobs, want).summary()}"
        assert bits_equal(logits.argmax(-1), r.completions), f"{family} {view}: greedy tokens"
    stock = M.stock(family, 512, "bf16", 0, "cpu")
    s = M.engine_rollout(stock, p, 6)
    logits = M.forward_views(stock, s, p, "cpu")["each sequence alone"]
    want = paged.engine_logprobs(logits.reshape(-1, 512), s.completions.reshape(-1)).view(s.logprobs.shape)
    assert not bits_equal(s.logprobs, want), "stock's engine against its forward: the check must be able to fail"
