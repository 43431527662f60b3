"""The plain workload: an episode of random logits (rlparity.cell.episodes.make_episode), its rollout path
against its training path (rlparity/cell/suite/test_bitwise.py)."""

from rlparity.cell.episodes import make_episode
from rlparity.cell.workloads.logits import logits_workload

WORKLOAD = logits_workload(
    "plain",
    make_episode,
    "random logits: rollout (decode steps, mixed batches) vs training (teacher-forced, autograd)",
)
