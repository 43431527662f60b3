"""rl_kernel's numerical contract transcribed to numpy, independent of the compiled code.

contract.py holds the scalar rules, the row layout, the fold and the tree; reference/<family>.py each
family's operators on top of it. Every name of those modules is re-exported here (the tests and the
harness use `rl_kernel.reference.row_stats`, `.combine`, `.tree_stats`, ...); families are found by walking
this package, so a new family edits no list.
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def _reexport(module: ModuleType) -> None:
    """Make module's functions, classes and constants attributes of this package."""
    names = {k: v for k, v in vars(module).items() if not k.startswith("__") and not isinstance(v, ModuleType)}
    globals().update(names)


for _info in sorted(pkgutil.iter_modules(__path__), key=lambda m: (m.name != "contract", m.name)):
    _reexport(importlib.import_module(f"{__name__}.{_info.name}"))
