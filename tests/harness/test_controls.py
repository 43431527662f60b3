"""The negative controls' names and switches: one list for host and cell; the deprecated
--variant / RLPARITY_VARIANT still work; the fma build's sources come from build_flags when it has them."""

from __future__ import annotations

import pytest

from rlparity import cli, selftest
from rlparity.backends.local import LocalBackend
from rlparity.cell import controls
from rlparity.cells import HOST_BUILT_CONTROLS, control_from_env


def test_host_and_cell_name_the_same_controls():
    """One list (rlparity.cells.CONTROLS) for both sides; selftest's negative ones are all but rl_kernel."""
    assert selftest.CONTROLS is controls.CONTROLS
    assert tuple(c for c in controls.CONTROLS if c != "none") == selftest.NEGATIVE


def test_every_control_has_a_logprob_and_a_stats_function():
    for name in controls.CONTROLS:
        assert callable(controls.logprob_fn(name)) and callable(controls.stats_fn(name))
    with pytest.raises(ValueError, match="RLPARITY_CONTROL"):
        controls.logprob_fn("ulp-flop")


def test_only_the_host_built_controls_need_an_env_and_the_local_backend_asks_for_no_other(monkeypatch):
    """The local backend asks the cell side (a process) only for HOST_BUILT_CONTROLS' env: every other control's
    must be empty, or a cell of it would silently run without what it needs."""
    assert set(HOST_BUILT_CONTROLS) < set(controls.CONTROLS)
    for name in controls.CONTROLS:
        if name not in HOST_BUILT_CONTROLS:
            assert controls.control_env(name) == {}, name
    asked = []
    monkeypatch.setattr("subprocess.run", lambda argv, **kw: asked.append(argv) or _Done('{"X": "1"}'))
    backend = LocalBackend()
    assert all(backend.control_env(name) == {} for name in controls.CONTROLS if name not in HOST_BUILT_CONTROLS)
    assert not asked
    assert backend.control_env(HOST_BUILT_CONTROLS[0]) == {"X": "1"} and len(asked) == 1


class _Done:
    def __init__(self, stdout: str) -> None:
        self.returncode, self.stdout, self.stderr = 0, stdout, ""


@pytest.mark.parametrize(
    ("environ", "control"),
    [
        ({}, "none"),
        ({"RLPARITY_CONTROL": "ulp-flip"}, "ulp-flip"),
        ({"RLPARITY_VARIANT": "atomics"}, "atomics"),  # the deprecated name
        ({"RLPARITY_CONTROL": "wave-tree", "RLPARITY_VARIANT": "atomics"}, "wave-tree"),
    ],
)
def test_a_cell_reads_its_control_from_the_env(environ, control):
    assert control_from_env(environ) == control


@pytest.mark.parametrize("flag", ["--control", "--variant"])
def test_run_takes_control_and_the_deprecated_variant(flag):
    assert cli.parser().parse_args(["run", flag, "ulp-flip"]).control == "ulp-flip"


def test_fma_sources_are_the_builds_sources():
    """The FMA control rebuilds exactly what setup.py builds (build_flags.sources(), files that exist), with
    contraction on for the host and for the device code of either vendor."""
    from pathlib import Path

    from rl_kernel import build_flags

    for gpu in (False, True):
        got = [Path(p) for p in controls.fma_spec(gpu)["sources"]]
        assert got == [build_flags.REPO / s for s in build_flags.sources(gpu)]
        assert got and all(p.is_file() for p in got)
    assert len(controls.fma_spec(True)["sources"]) > len(controls.fma_spec(False)["sources"])
    assert "-ffp-contract=fast" in controls.fma_spec(False)["cxx"]
    assert "--fmad=true" in controls.fma_spec(True, hip=False)["device"]
    assert "-ffp-contract=fast" in controls.fma_spec(True, hip=True)["device"]
