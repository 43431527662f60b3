"""`pytest -m gpu` (the device round's `gputests` step) selects every test that needs a GPU: those marked `gpu` (the
test or one of its parameters) and those run with a parameter device = "cuda" (conftest.needs_gpu)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import needs_gpu

ROOT = Path(__file__).resolve().parents[2]


class Item(SimpleNamespace):
    """What needs_gpu reads of a pytest item: its closest marker by name, its parameters."""

    def get_closest_marker(self, name: str) -> object | None:
        return next((m for m in self.marks if m.name == name), None)


@pytest.mark.parametrize(
    ("marks", "params", "wanted"),
    [
        ([pytest.mark.gpu.mark], {}, True),
        ([], {"device": "cuda"}, True),
        ([], {"device": "cpu"}, False),  # control: the CPU case of a device-parametrized test
        ([pytest.mark.slow.mark], {}, False),  # control: another mark
    ],
)
def test_needs_gpu(marks: list, params: dict, wanted: bool) -> None:
    item = Item(marks=marks, callspec=SimpleNamespace(params=params))
    assert needs_gpu(item) is wanted


def test_pytest_m_gpu_collects_a_gpu_parameter_and_leaves_the_cpu_one() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", "-m", "gpu",
         "tests/integrations/test_mode_models.py"],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    selected = {line for line in out.stdout.splitlines() if "::" in line}
    assert "tests/integrations/test_mode_models.py::test_a_plain_pytorch_model_under_the_mode[fast-cuda]" in selected
    assert not any("-cpu]" in name for name in selected), selected
