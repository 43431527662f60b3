"""The exact tier's numerical contract transcribed to numpy, independent of the compiled code.

common/contract.py holds the scalar rules, the row layout, the fold and the tree; <family>/reference.py each
family's operators on top of it. Every name of those modules is an attribute of this one (the tests and the
harness use `rl_kernel.exact.reference.row_stats`, `.combine`, `.tree_stats`, ...); families are found by walking
the tier's folder, so a new family edits no list.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path
from types import ModuleType

_HERE = Path(__file__).parent


def _reexport(module: ModuleType) -> None:
    """Make module's functions, classes and constants attributes of this module."""
    names = {k: v for k, v in vars(module).items() if not k.startswith("__") and not isinstance(v, ModuleType)}
    globals().update(names)


def _modules() -> list[str]:
    """The contract first, then every family's reference module, in name order."""
    found = [
        m.name for m in pkgutil.iter_modules([str(_HERE)]) if m.ispkg and (_HERE / m.name / "reference.py").exists()
    ]
    return ["rl_kernel.exact.common.contract", *(f"rl_kernel.exact.{name}.reference" for name in sorted(found))]


for _name in _modules():
    _reexport(importlib.import_module(_name))
