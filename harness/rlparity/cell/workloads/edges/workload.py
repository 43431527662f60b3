"""The edges workload: the plain suite over an episode that reaches every code path of every kernel
(rlparity.cell.episodes.make_edge_episode: odd vocabularies, odd element offsets, the edge rows)."""

from rlparity.cell.workloads import Workload
from rlparity.cell.workloads.logits import NEEDS, SUITE, golden_for

WORKLOAD = Workload(
    name="edges",
    suite=SUITE,
    golden=golden_for("edges"),
    needs=NEEDS,
    description="the plain suite over edge rows: NaN, +-inf, subnormals, ties, odd vocabularies and offsets",
)
