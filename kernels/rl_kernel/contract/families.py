"""A tier's operator families, as the tests, selfcheck and the golden digests walk them.

A family is a folder of a tier (rl_kernel/<tier>/<family>/) with a `checks` module: the family's golden and
self-check cases, its SPECS (the operators as the tests, selfcheck and the golden digests see them) and,
optionally, invariance_checks(size, dtype, device). Found by walking the tier's package (Tier.families), so adding a
family adds a folder and edits no list."""

from __future__ import annotations

from types import ModuleType

from rl_kernel import tiers
from rl_kernel.spec import Case, OpSpec
from rl_kernel.tiers import Tier

__all__ = ["Case", "OpSpec", "all_specs", "families"]


def _tier(tier: Tier | str | None) -> Tier:
    return tiers.resolve(tier or "exact")


def families(tier: Tier | str | None = None) -> dict[str, ModuleType]:
    """Every family of a tier (default exact), name -> its checks module, in name order."""
    return _tier(tier).families()


def all_specs(tier: Tier | str | None = None) -> tuple[OpSpec, ...]:
    """Every operator of every family of a tier, families in name order, each family's SPECS in its own order."""
    return tuple(spec for module in families(tier).values() for spec in module.SPECS)
