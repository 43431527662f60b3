"""Plug-in discovery, one way for every registry (rl_kernel's tiers, the harness's workloads): a folder of the
package that declares one (`<folder>/<name>/<declared_in>.py` with the object as `attr`), then the entry points of
other distributions. Adding one edits no central list; a name given twice, an entry point that fails to load or
gives the wrong kind of object is an error naming the place."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Registry:
    """Where one kind of plug-in is declared. `place(item, origin)` gives the item with where it was found."""

    label: str  # "tier", "workload": the error messages' word
    package: str  # the package whose folders declare them, e.g. "rl_kernel"
    folder: Path  # that package's folder
    declared_in: str  # the module of a folder that declares one, e.g. "tier"
    attr: str  # its name there, e.g. "TIER"
    group: str  # the entry-point group of other distributions
    kind: type  # what each must be
    error: type[Exception]
    place: Callable[[Any, str], Any]

    def found(self) -> dict[str, Any]:
        """Every plug-in, by name in name order: the package's folders first, then the entry points."""
        items: dict[str, Any] = {}
        for m in sorted(pkgutil.iter_modules([str(self.folder)]), key=lambda m: m.name):
            if m.ispkg and (self.folder / m.name / f"{self.declared_in}.py").exists():
                module = importlib.import_module(f"{self.package}.{m.name}.{self.declared_in}")
                where = f"{self.package.replace('.', '/')}/{m.name}/{self.declared_in}.py"
                self._add(items, getattr(module, self.attr), where)
        for ep in metadata.entry_points(group=self.group):
            where = f"entry point {ep.name} = {ep.value!r} ({self.group})"
            try:
                item = ep.load()
            except Exception as exc:  # a broken plug-in names itself instead of breaking every other
                raise self.error(f"{where} failed to load: {exc}") from exc
            if not isinstance(item, self.kind):
                raise self.error(f"{where} is not a {self.kind.__module__}.{self.kind.__qualname__}")
            self._add(items, item, f"entry point {ep.value}")
        return dict(sorted(items.items()))

    def _add(self, items: dict[str, Any], item: Any, origin: str) -> None:
        item = self.place(item, origin)
        if item.name in items:
            raise self.error(f"{self.label} {item.name!r} is declared twice: {items[item.name].origin} and {origin}")
        items[item.name] = item
