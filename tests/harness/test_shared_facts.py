"""Facts both packages hold, one copy each: the host (rlparity) may not import rl_kernel, rl_kernel may not import
rlparity, and the host checks matrix files before any cell (or device probe) runs. Each pair is held equal here, so
that a change to one side fails until the other follows (rlparity/cells.py says which and why)."""

from __future__ import annotations

from rl_kernel import inputs, tiers
from rlparity import cells, matrix


def test_the_dtype_names_are_rl_kernels():
    assert cells.DTYPES == tuple(inputs.DTYPE_NAMES) == tiers.DTYPES


def test_the_tier_scopes_and_platforms_are_rl_kernels():
    assert cells.TIER_SCOPES == tiers.SCOPES
    assert matrix.PLATFORMS == tiers.PLATFORMS


def test_axes_toml_gives_each_tier_its_descriptors_scope():
    """axes.toml's [tiers.NAME] scope (what the gate compares) is the scope each of rl_kernel's own tiers (its
    folders; a package's tier is declared in its user's matrix file) promises."""
    declared = {name: t.scope for name, t in matrix.load_axes().tiers.items()}
    own = {name: t.scope for name, t in tiers.tiers().items() if t.origin.startswith("rl_kernel/")}
    assert declared == own
