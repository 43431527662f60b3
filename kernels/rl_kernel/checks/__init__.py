"""The operator families' checks, one module per family (softmax, decoder, sampling): each holds the
family's golden and self-check cases, its SPECS (the operators as the tests, selfcheck and the golden
digests see them) and, optionally, invariance_checks(size, dtype, device). Found by walking this package,
so adding a family adds a module here and edits no list. The operators themselves are in rl_kernel.ops.

A tier other than exact keeps its checks in its own package (rl_kernel/<tier>/checks/); the helpers below
take the package to walk."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from rl_kernel.checks.spec import Case, OpSpec

__all__ = ["Case", "OpSpec", "all_specs", "families"]

_NOT_FAMILIES = {"spec"}


def families(package: str = __name__) -> dict[str, ModuleType]:
    """Every family module of a checks package (default this one), by name, in name order."""
    pkg = importlib.import_module(package)
    names = sorted(m.name for m in pkgutil.iter_modules(pkg.__path__) if m.name not in _NOT_FAMILIES)
    return {name: importlib.import_module(f"{package}.{name}") for name in names}


def all_specs(package: str = __name__) -> tuple[OpSpec, ...]:
    """Every operator of every family of a checks package, families in name order, each family's SPECS in
    its own order."""
    return tuple(spec for module in families(package).values() for spec in module.SPECS)
