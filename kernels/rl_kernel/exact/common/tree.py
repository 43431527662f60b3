"""numerics.md section 2's plain sum (the tree) in torch's elementwise adds: the same bits on every device, each row
alone. The exact tier's reductions over rows that no kernel owns (an attention sink's gradient over its head's rows)
take it here; rl_kernel.aten's tree_sum (the mode's sums) is this tree, with a Triton kernel of it on a GPU."""

from __future__ import annotations

import torch


def padded_width(n: int) -> int:
    """The tree's leaves for a row of n >= 1: 8 x the chunk count rounded up to a power of two."""
    return 8 * (1 << (-(-n // 8) - 1).bit_length())


def tree_adds(x: torch.Tensor, first: bool) -> torch.Tensor:
    """x's sums over its first dim (first=True) or its last, n >= 1, in section 2's order: chunks of 8 (the last
    padded with +0) summed pairwise, then one perfect binary tree over the chunk index whose nodes past the row are 0
    (contract.row_sum). The row is padded with +0 to a power of two of chunks once, so each level is one add of
    neighbouring pairs; over the first dim the pairs are whole rows (a weight's gradient summed over the tokens)."""
    n = x.shape[0] if first else x.shape[-1]
    width = padded_width(n)
    if width != n and first:
        x = torch.cat([x, x.new_zeros((width - n, *x.shape[1:]))])
    elif width != n:
        x = torch.nn.functional.pad(x, (0, width - n))
    nodes = x
    while (nodes.shape[0] if first else nodes.shape[-1]) > 1:
        if first:
            pairs = nodes.unflatten(0, (-1, 2))
            nodes = pairs[:, 0] + pairs[:, 1]
        else:
            pairs = nodes.unflatten(-1, (-1, 2))
            nodes = pairs[..., 0] + pairs[..., 1]
    return nodes[0] if first else nodes[..., 0]
