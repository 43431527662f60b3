"""The operator families of the exact tier. Each module here (softmax, decoder, sampling) defines its
autograd Functions, public functions and fake implementations, and nothing else: the family's cases and
SPECS are in rl_kernel.checks.<family>. Families are found by walking this package (families()), so
adding one adds a module and edits no list."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

__all__ = ["families"]


def families() -> dict[str, ModuleType]:
    """Every operator module of this package, by name, in name order."""
    names = sorted(m.name for m in pkgutil.iter_modules(__path__))
    return {name: importlib.import_module(f"{__name__}.{name}") for name in names}
