"""The plain workload: an episode of random logits (rlparity.cell.episodes.make_episode), its rollout path
against its training path (rlparity/cell/suite/test_bitwise.py)."""

from rlparity.cell.workloads import Workload
from rlparity.cell.workloads.logits import NEEDS, SUITE, golden_for

WORKLOAD = Workload(
    name="plain",
    suite=SUITE,
    golden=golden_for("plain"),
    needs=NEEDS,
    description="random logits: rollout (decode steps, mixed batches) vs training (teacher-forced, autograd)",
)
