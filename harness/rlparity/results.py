"""A cell's outcome as data: written to <out>/cells/<cell>/result.json as soon as the cell finishes,
read back by the collector, the gate, the report and --resume."""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from rlparity.cells import Cell
from rlparity.config import ConfigError

SCHEMA = 1
STATUSES = ("passed", "failed", "error", "skipped")
RESULT_FILE = "result.json"
JUNIT_FILE = "junit.xml"
LOG_FILE = "output.log"
CELL_FILE = "cell.json"

# The names rlparity.cell.mismatch gives its metrics (a cell records them as "<what> <metric>").
MISMATCH_METRICS = ("tokens", "mean_abs_dlogp", "max_abs_dlogp", "k3_kl", "clipped_share")
HIST_PREFIX = "hist_dlogp/"


@dataclass
class CellResult:
    cell: Cell
    status: str
    reason: str = ""
    variant: str = "none"
    fingerprint: dict[str, Any] = field(default_factory=dict)
    fingerprint_hash: str = ""
    digests: dict[str, str] = field(default_factory=dict)
    comparisons: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # informational figures (the stock model's drift)
    info: dict[str, Any] = field(default_factory=dict)  # plain data a suite records (a user's package versions)
    config_error: str = ""  # the cell found its configuration bad ("FILE:LINE: KEY: why"): the gate's exit 3
    output_tail: str = ""
    started: str = ""
    finished: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {self.status!r}")

    # ---- what the gate and the report read --------------------------------------------------------
    @property
    def gated(self) -> list[dict[str, Any]]:
        return [c for c in self.comparisons if not c["informational"]]

    @property
    def mismatches(self) -> int:
        """Differing elements over the gated comparisons (a digest comparison counts 1)."""
        return sum(max(c["count"], 1) for c in self.gated if not c["equal"])

    @property
    def element_mismatches(self) -> int:
        """Differing elements over the gated tensor comparisons (the table's own column)."""
        return sum(c["count"] for c in self.gated if not c["equal"] and not _is_digest(c))

    @property
    def digest_mismatches(self) -> int:
        """Gated comparisons against a committed digest that differ (no element count: no tensor to diff)."""
        return sum(1 for c in self.gated if not c["equal"] and _is_digest(c))

    @property
    def max_abs(self) -> float:
        vals = [c["max_abs"] for c in self.gated if not c["equal"]]
        return max(vals, default=0.0)

    @property
    def max_ulp(self) -> int:
        return max((c["max_ulp"] for c in self.gated if not c["equal"]), default=0)

    @property
    def first_mismatch(self) -> dict[str, Any] | None:
        bad = next((c for c in self.gated if not c["equal"]), None)
        return None if bad is None else {"comparison": bad["name"], "index": bad["first_index"]}

    @property
    def mismatch(self) -> dict[str, float]:
        """The rollout/training mismatch metrics the cell recorded (rlparity.cell.mismatch names, each metric
        name "<what> <metric>"), over everything it compared that was not bitwise: mean |dlogp| averaged, the
        maxima and the clipped share at their largest, the |dlogp| histogram bins added. {} when none."""
        by: dict[str, list[float]] = defaultdict(list)
        for name, value in self.metrics.items():
            metric = name.rsplit(" ", 1)[-1]
            if metric in MISMATCH_METRICS or metric.startswith(HIST_PREFIX):
                by[metric].append(float(value))
        out = {k: (sum(v) / len(v) if k == "mean_abs_dlogp" else sum(v) if k.startswith(HIST_PREFIX) or k == "tokens"
                   else max(v)) for k, v in by.items()}  # fmt: skip
        return dict(sorted(out.items()))

    @property
    def stock_differ(self) -> tuple[int, int]:
        """(informational comparisons that differ, informational comparisons)."""
        info = [c for c in self.comparisons if c["informational"]]
        return sum(not c["equal"] for c in info), len(info)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["cell"] = self.cell.to_dict()
        d.update(
            schema=SCHEMA,
            required=self.cell.required,
            mismatches=self.mismatches,
            max_abs=_json_float(self.max_abs),
            max_ulp=self.max_ulp,
            first_mismatch=self.first_mismatch,
        )
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CellResult:
        names = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in names}
        kw["cell"] = Cell.from_dict(d["cell"])
        for c in kw.get("comparisons", []):
            c["max_abs"] = float(c["max_abs"]) if c["max_abs"] is not None else math.inf
        return cls(**kw)


def _is_digest(comparison: dict[str, Any]) -> bool:
    """A digest comparison has no tensor pair, so its counts are -1 (cell/suite/plugin.compare_digest)."""
    return comparison.get("count", 0) < 0


def _json_float(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def cell_dir(out: Path, cell: Cell) -> Path:
    return out / "cells" / cell.dirname


def write(result: CellResult, directory: Path) -> Path:
    """Atomically (write + rename), so a killed run never leaves half a result for --resume."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / RESULT_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result.to_dict(), indent=1, default=str) + "\n")
    os.replace(tmp, path)
    return path


def read(directory: Path) -> CellResult:
    data = json.loads((directory / RESULT_FILE).read_text())
    if not isinstance(data, dict):
        raise ValueError(f"{directory / RESULT_FILE} holds a JSON {type(data).__name__}, not an object")
    return CellResult.from_dict(data)


def read_all(out: Path) -> list[CellResult]:
    """Every cell result under a results directory, in cell-id order."""
    found = []
    for p in sorted((out / "cells").glob(f"*/{RESULT_FILE}")):
        try:
            found.append(read(p.parent))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{p}: not a readable cell result ({exc})") from exc
    return found


def open_dir(d: Path) -> list[CellResult]:
    """The cell results of a results dir, for reading it back (compare, report): a ConfigError naming the
    path when it is missing, has no cells/ or no result in it, or holds an unreadable result.json."""
    if not d.is_dir():
        raise ConfigError("not a results directory (does not exist or is not a directory)", d)
    if not (d / "cells").is_dir():
        raise ConfigError("not a results directory (no cells/ inside)", d)
    try:
        found = read_all(d)
    except ValueError as exc:  # the message names the unreadable result.json
        raise ConfigError(str(exc)) from exc
    if not found:
        raise ConfigError(f"not a results directory (no cells/*/{RESULT_FILE} inside)", d)
    return found


def skipped(cell: Cell, reason: str) -> CellResult:
    t = now()
    return CellResult(cell, "skipped", reason, started=t, finished=t)


def errored(cell: Cell, reason: str, tail: str = "", started: str = "", wall_s: float = 0.0) -> CellResult:
    return CellResult(
        cell, "error", reason, output_tail=tail, started=started or now(), finished=now(), timings={"wall_s": wall_s}
    )
