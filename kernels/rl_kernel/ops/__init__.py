"""The operator families. Each module here (softmax, ...) defines its autograd Functions, public
functions, fake implementations and SPECS; they are found by walking this package, so adding a
family adds a module and edits no list."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

from rl_kernel.ops.spec import Case, OpSpec

__all__ = ["Case", "OpSpec", "all_specs", "families"]

_NOT_FAMILIES = {"spec"}


def families() -> dict[str, ModuleType]:
    """Every family module of this package, by name, in name order."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in _NOT_FAMILIES)
    return {name: importlib.import_module(f"{__name__}.{name}") for name in names}


def all_specs() -> tuple[OpSpec, ...]:
    """Every operator of every family, families in name order, each family's SPECS in its own order."""
    return tuple(spec for module in families().values() for spec in module.SPECS)
