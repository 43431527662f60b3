"""A cell runs its bitwise suite with the suite's own plugin and none that the image's packages register by entry
point (anyio's, xdist's): such a plugin must not change how the suite runs. The process's env is given back as it
was. The control: the same suite under a plain pytest.main loads anyio's plugin, and the probe sees it."""

from __future__ import annotations

import os
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from rlparity.cell import cellrun

PROBE = """
def test_no_entry_point_plugin_is_loaded(pytestconfig):
    assert not pytestconfig.pluginmanager.has_plugin("anyio")


def test_the_cells_own_plugin_is(suite_fixture):
    assert suite_fixture == "the cell's"
"""


class _Suite:
    """Stands in for the suite's own plugin (SuitePlugin), which the cell hands to pytest.main."""

    @pytest.fixture
    def suite_fixture(self) -> str:
        return "the cell's"


def _args(tmp_path: Path) -> list[str]:
    test = tmp_path / "test_cell_plugins_probe.py"
    test.write_text(PROBE)
    (tmp_path / "pytest.ini").write_text("[pytest]\naddopts = -p no:cacheprovider\n")
    return [str(test), "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), "-q"]


def test_a_cells_suite_loads_no_entry_point_plugin_and_the_env_is_restored(tmp_path, monkeypatch):
    assert any(ep.name == "anyio" for ep in entry_points(group="pytest11")), "the control needs anyio's plugin"
    monkeypatch.delenv(cellrun.AUTOLOAD_OFF, raising=False)
    assert pytest.main(_args(tmp_path), plugins=[_Suite()]) == pytest.ExitCode.TESTS_FAILED  # the control
    assert cellrun._run_suite(_args(tmp_path), [_Suite()]) == pytest.ExitCode.OK
    assert cellrun.AUTOLOAD_OFF not in os.environ
    monkeypatch.setenv(cellrun.AUTOLOAD_OFF, "")
    assert cellrun._run_suite(_args(tmp_path), [_Suite()]) == pytest.ExitCode.OK
    assert os.environ[cellrun.AUTOLOAD_OFF] == ""
