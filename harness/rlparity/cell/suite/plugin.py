"""The pytest plugin that connects a workload's suite to its cell: fixtures for the cell (cell, control,
record, params: the workload's parameters with the matrix's over its defaults), parametrisation over its
shapes, and a recorder of every comparison (for the results JSON). This is the interface a workload's suite
is written against, in this repository or in a user's package (rlparity.cell.workloads)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from rl_kernel import tiers
from rl_kernel.bitwise import diff, digest
from rlparity import golden
from rlparity.cells import Cell


@dataclass
class Comparison:
    test: str
    name: str
    equal: bool
    informational: bool
    digest_a: str
    digest_b: str
    count: int
    total: int
    max_abs: float
    max_ulp: int
    first_index: list[int] | None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Recorder:
    """What the suite compared and produced, in the order it happened."""

    comparisons: list[Comparison] = field(default_factory=list)
    digests: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)  # plain data for result.json (a user's package versions)
    config_errors: list[str] = field(default_factory=list)
    current_test: str = ""
    params_where: str = ""  # the cell's "FILE:LINE" of its shape set's params
    params_key: str = ""  # "shapes.NAME.params"

    def compare(self, name: str, a: torch.Tensor, b: torch.Tensor, informational: bool = False):
        d = diff(a, b)
        self.comparisons.append(
            Comparison(
                self.current_test,
                name,
                d.equal,
                informational,
                digest(a),
                digest(b),
                d.count,
                d.total,
                d.max_abs,
                d.max_ulp,
                list(d.first_index) if d.first_index is not None else None,
            )
        )
        return d

    def compare_digest(self, name: str, actual: str, expected: str) -> bool:
        """A comparison against a committed digest (no tensor to diff: counts are unknown, -1)."""
        equal = actual == expected
        self.comparisons.append(
            Comparison(self.current_test, name, equal, False, actual, expected, -1, -1, 0.0, 0, None)
        )
        return equal

    def metric(self, name: str, value: float) -> None:
        """An informational figure (never gated): the stock control's drift, say."""
        self.metrics[name] = float(value)

    def output(self, name: str, t: torch.Tensor) -> str:
        self.digests[name] = digest(t)
        return self.digests[name]

    def config_error(self, key: str, message: str) -> None:
        """The cell's configuration is bad (a parameter `key` of its shape set: an import string that does not
        resolve, an engine that returns the wrong thing): fails the test and the cell reports it as a configuration
        error at the matrix file and line, which the gate turns into exit 3."""
        where = ": ".join(p for p in (self.params_where, f"{self.params_key}.{key}") if p)
        self.config_errors.append(f"{where}: {message}")
        pytest.fail(f"configuration: {self.config_errors[-1]}", pytrace=False)


class SuitePlugin:
    def __init__(self, cell: Cell, control: str = "none", params: dict[str, Any] | None = None) -> None:
        # (not named cell/control/params: pytest would take such attributes for the fixtures below)
        self._cell = cell
        self._control = control
        self._params = dict(params or {})
        self._tier: tiers.Tier | None = None
        self.recorder = Recorder(params_where=cell.params_where, params_key=f"shapes.{cell.shapes}.params")

    @pytest.fixture
    def cell(self) -> Cell:
        return self._cell

    @pytest.fixture
    def control(self) -> str:
        return self._control

    @pytest.fixture
    def tier(self) -> tiers.Tier:
        """The cell's tier, resolved once in the cell (its suites pass this descriptor down, not the name)."""
        if self._tier is None:
            self._tier = tiers.get(self._cell.tier)
        return self._tier

    @pytest.fixture
    def params(self) -> dict[str, Any]:
        return dict(self._params)

    @pytest.fixture
    def record(self, request) -> Recorder:
        self.recorder.current_test = request.node.nodeid.split("::")[-1]
        return self.recorder

    def pytest_generate_tests(self, metafunc) -> None:
        if "shape" in metafunc.fixturenames:
            shapes = list(self._cell.shape_list)
            metafunc.parametrize("shape", shapes, ids=["x".join(map(str, s)) for s in shapes])


def check_committed(cell: Cell, record: Recorder, label: str, keys: dict[str, str], actual: dict[str, str]) -> None:
    """A cell's digests ({what: digest}) against its tier's committed ones ({what: rlparity.golden.key}). For an
    all-devices tier a key without one fails (write it with `rlparity golden --update`). A per-target tier
    records every digest in result.json (golden/<sm90/key>) for `rlparity golden --record RESULTS`; a target with
    nothing recorded yet is skipped after that, having compared nothing."""
    table, missing = golden.expected(cell.tier, cell.tier_scope, cell.target, keys)
    if missing and cell.tier_scope == "all-devices":
        pytest.fail(
            f"no golden digest for {', '.join(missing)} in {golden.path_for(cell.tier)}: "
            "write them on the CPU with `rlparity golden --update` and review the diff"
        )
    if cell.tier_scope == "per-target":
        for what, key in keys.items():
            record.digests[golden.recorded_name(key, cell.tier_scope, cell.target)] = actual[what]
    wrong = [
        f"{what}: {actual[what][:16]} != golden {expected[:16]}"
        for what, expected in table.items()
        if not record.compare_digest(f"{label} golden {what}", actual[what], expected)
    ]
    assert not wrong, "; ".join(wrong)
    if missing:
        pytest.skip(f"no digest recorded for {cell.target} in {golden.path_for(cell.tier)} yet: this cell's are in "
                    "result.json (rlparity golden --record RESULTS)")  # fmt: skip
