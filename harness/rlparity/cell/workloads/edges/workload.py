"""The edges workload: the plain suite over an episode that reaches every code path of every kernel
(episode.py beside this: odd vocabularies, odd element offsets, the edge rows)."""

from rlparity.cell.workloads.edges.episode import make_edge_episode
from rlparity.cell.workloads.logits import logits_workload

WORKLOAD = logits_workload(
    "edges",
    make_edge_episode,
    "the plain suite over edge rows: NaN, +-inf, subnormals, ties, odd vocabularies and offsets",
)
