"""`--filter`: the filter language over cells (pure logic)."""

from __future__ import annotations

import fnmatch

from rlparity.cells import AXES, Cell
from rlparity.config import ConfigError


def parse_filter(expr: str) -> list[tuple[str, bool, list[str]]]:
    """`--filter` grammar: terms separated by commas or spaces, all of which must hold.

    `axis=glob|glob` keeps cells whose axis matches one glob; `axis!=glob` drops them; a bare glob is
    matched against the cell id (image/target/profile/... joined by '/'), e.g. `*/cpu/*/single/*`.
    """
    terms = []
    for term in expr.replace(",", " ").split():
        if "!=" in term:
            key, _, value = term.partition("!=")
            negate = True
        elif "=" in term:
            key, _, value = term.partition("=")
            negate = False
        else:
            terms.append(("id", False, [term]))
            continue
        if key not in AXES and key != "required":
            raise ConfigError(f"--filter: unknown axis {key!r} in {term!r} (axes: {', '.join(AXES)}, required)")
        if not value:
            raise ConfigError(f"--filter: empty value in {term!r}")
        terms.append((key, negate, value.split("|")))
    return terms


def select(cells: tuple[Cell, ...] | list[Cell], expr: str | None) -> list[Cell]:
    if not expr:
        return list(cells)
    terms = parse_filter(expr)

    def keep(cell: Cell) -> bool:
        for key, negate, globs in terms:
            value = cell.id if key == "id" else str(cell.required).lower() if key == "required" else cell.axis(key)
            hit = any(fnmatch.fnmatchcase(value, g) for g in globs)
            if hit == negate:
                return False
        return True

    return [c for c in cells if keep(c)]
