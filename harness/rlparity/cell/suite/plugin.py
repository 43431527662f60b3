"""The pytest plugin that connects the bitwise suite to its cell: fixtures for the cell's parameters,
parametrisation over its shapes, and a recorder of every comparison (for the results JSON)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from rl_kernel.bitwise import diff, digest
from rlparity.cell.workloads import BUILDERS
from rlparity.cells import Cell

LOGIT_WORKLOADS = tuple(BUILDERS)  # test_bitwise.py's: episodes of logits


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
    current_test: str = ""

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


class SuitePlugin:
    def __init__(self, cell: Cell, control: str = "none") -> None:
        # (not named cell/control: pytest would take such attributes for the fixtures below)
        self._cell = cell
        self._control = control
        self.recorder = Recorder()

    @pytest.fixture
    def cell(self) -> Cell:
        return self._cell

    @pytest.fixture
    def control(self) -> str:
        return self._control

    @pytest.fixture
    def record(self, request) -> Recorder:
        self.recorder.current_test = request.node.nodeid.split("::")[-1]
        return self.recorder

    def pytest_configure(self, config) -> None:
        config.addinivalue_line("markers", "workloads(*names): the workloads a suite module serves")

    def pytest_collection_modifyitems(self, config, items) -> None:
        """Each test runs for the workloads its module serves (pytest.mark.workloads; unmarked: the logits
        workloads, LOGIT_WORKLOADS); the others are deselected, not skipped: they do not apply."""
        keep, drop = [], []
        for item in items:
            marker = item.get_closest_marker("workloads")
            served = marker.args if marker else LOGIT_WORKLOADS
            (keep if self._cell.workload in served else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep

    def pytest_generate_tests(self, metafunc) -> None:
        if "shape" in metafunc.fixturenames:
            shapes = list(self._cell.shape_list)
            metafunc.parametrize("shape", shapes, ids=["x".join(map(str, s)) for s in shapes])
