"""`--targets auto|all|LIST` and `--inventory FILE`: which targets of a matrix this run is about (pure logic).

`auto` is `cpu` plus every target whose platform and arch (harness/rlparity/data/matrices/axes.toml) match a device of
this host's inventory, so a run on an MI300X is about cpu + gfx942 and --strict means "a required cell of
those targets that could not run is an error". Cells of other targets are not selected (`--list --targets
all` shows them). A synthetic inventory (the JSON `python -m rlparity.cell.inventory` prints) stands in for
the probe: plan an MI300X run from a laptop, or test compose's command line on any host.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from rlparity.cells import Cell
from rlparity.config import ConfigError, EnvError
from rlparity.inventory import Inventory
from rlparity.matrix import Axes

AUTO, ALL = "auto", "all"
INVENTORY_VAR = "RLPARITY_INVENTORY"  # a synthetic inventory file, as --inventory (the flag wins)


def parse_targets(spec: str, axes: Axes) -> str | tuple[str, ...]:
    """'auto', 'all', or the named targets (comma or '|' separated), each one axes.toml defines."""
    spec = spec.strip()
    if spec in (AUTO, ALL):
        return spec
    names = tuple(n for n in re.split(r"[,|\s]+", spec) if n)
    unknown = [n for n in names if n not in axes.targets]
    if not names or unknown:
        bad = ", ".join(unknown) or repr(spec)
        raise ConfigError(f"--targets: unknown target {bad} (auto, all, or of: {', '.join(axes.targets)})")
    return names


def host_targets(axes: Axes, inv: Inventory) -> tuple[str, ...]:
    """cpu and the targets this host has a device of (matched on platform + arch through axes.toml)."""
    have = {(d.platform, d.arch) for d in inv.devices}
    return tuple(t.name for t in axes.targets.values() if t.platform == "cpu" or (t.platform, t.arch) in have)


def resolve_targets(spec: str | tuple[str, ...], axes: Axes, inv: Inventory) -> tuple[str, ...] | None:
    """The targets a run selects (None: every target). A failed probe under auto is an environment error:
    silently running the CPU cells only would turn a broken GPU runner green."""
    if spec == ALL:
        return None
    if spec == AUTO:
        if inv.error:
            raise EnvError(f"--targets auto: could not list this host's devices: {inv.error}")
        return host_targets(axes, inv)
    return tuple(spec)


def for_targets(cells: list[Cell], targets: tuple[str, ...] | None) -> list[Cell]:
    return list(cells) if targets is None else [c for c in cells if c.target in targets]


def inventory_file(flag: str | None, environ=os.environ) -> Path | None:
    """--inventory, else $RLPARITY_INVENTORY, else None (probe the host)."""
    value = flag or environ.get(INVENTORY_VAR, "")
    return Path(value) if value else None


def load_inventory(path: Path) -> Inventory:
    """A synthetic inventory; a missing or malformed file is bad configuration naming the file."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read the inventory: {exc.strerror}", path) from exc
    except ValueError as exc:
        raise ConfigError(f"the inventory is not valid JSON: {exc}", path) from exc
    try:
        return Inventory.from_dict(data)
    except (TypeError, AttributeError) as exc:
        raise ConfigError(f"not an inventory (as `python -m rlparity.cell.inventory` prints): {exc}", path) from exc
