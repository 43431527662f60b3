"""The engines workload: a rollout engine and a trainer from the user's own package, named by import strings in
the matrix, run in the cell (its env profile, placement and image) and compared bit for bit. Its suite is
rlparity/cell/suite/test_engines.py; the loading and the checks of what an engine returns are engine.py.

A shape set names them:

    [shapes.mine]
    workload = "engines"
    params = { rollout = "pkg.module:rollout", train = "pkg.module:train", engine = { layers = 2 } }
    shapes = [[4, 6, 256]]          # [B, T, V]: B sequences, T completion tokens each, vocabulary V

The interface (`engine`'s free-form parameters are passed to both callables as keyword arguments):

    rollout(shape=(B, T, V), dtype: str, seed: int, device: str, tier: str, **engine) -> dict
        tokens         int64 [B, T]   the sampled completion tokens
        logprobs       fp32  [B, T]   their log-probs as the rollout computed them
        logits_digest  str            optional: a digest of the logits the tokens were drawn from
        layer_digests  {name: str}    optional: a digest per layer (module output), in forward order

    train(tokens, shape=(B, T, V), dtype, seed, device, tier, **engine) -> dict
        logprobs       fp32  [B, T]   the log-probs of `tokens` as the trainer's forward computes them
        logits_digest, layer_digests  optional, as above (compared with the rollout's where both give them)

dtype is a name ("fp32", "bf16", "fp16"), device a torch device string (the placement's: the rollout's and the
trainer's may differ), tier an rl_kernel tier name ("exact", "fast", or a package's own). The engine rebuilds
whatever it needs (model, prompts) from the seed, so the trainer sees the rollout's tokens only.

The suite compares the trainer's log-probs with the rollout's bit for bit (gated), and when they differ records the
mismatch metrics (rlparity.cell.mismatch); runs both again (cell.repeats) and compares the runs bit for bit;
records the digests and the versions of the packages the callables come from (result.json `info`). Batch
invariance is the engine's own business. A malformed import string, a module that does not import, an attribute
that is missing or not callable, an `engine` that is not a table and a return of the wrong keys, shape or dtype
are configuration errors at the matrix file and line of the shape set's params: the run exits 3.
"""

from __future__ import annotations

from rlparity.cell.workloads import SUITE_DIR, Workload

WORKLOAD = Workload(
    name="engines",
    suite=(SUITE_DIR / "test_engines.py",),
    params={"rollout": "", "train": "", "engine": {}},
    needs=(),
    description="a rollout engine and a trainer from the user's package (import strings): their log-probs bit for bit",
)
