"""The negative controls' names and switches: the host's list and the cell's agree; the deprecated
--variant / RLPARITY_VARIANT still work; the fma build's sources come from build_flags when it has them."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from rlparity import cli, selftest
from rlparity.backends.base import control_from_env
from rlparity.cell import controls


def test_host_and_cell_name_the_same_controls():
    assert selftest.CONTROLS == controls.CONTROLS
    assert tuple(c for c in controls.CONTROLS if c != "none") == selftest.NEGATIVE


def test_every_control_has_a_logprob_and_a_stats_function():
    for name in controls.CONTROLS:
        assert callable(controls.logprob_fn(name)) and callable(controls.stats_fn(name))
    with pytest.raises(ValueError, match="RLPARITY_CONTROL"):
        controls.logprob_fn("ulp-flop")


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


def test_fma_sources_fall_back_without_build_flags_sources(tmp_path):
    csrc = tmp_path / "kernels" / "rl_kernel" / "csrc"
    old = types.SimpleNamespace()  # today's build_flags: no sources()
    assert controls._fma_sources(old, csrc, gpu=False) == [csrc / "ops_cpu.cpp"]
    assert controls._fma_sources(old, csrc, gpu=True) == [csrc / "ops_cpu.cpp", csrc / "ops_gpu.cu"]


def test_fma_sources_use_build_flags_sources_where_it_exists(tmp_path):
    csrc = tmp_path / "kernels" / "rl_kernel" / "csrc"
    csrc.mkdir(parents=True)
    seen = {}

    def sources(gpu: bool, root: Path | None = None) -> list[str]:
        seen.update(gpu=gpu, root=root)
        return ["kernels/rl_kernel/csrc/softmax/softmax_cpu.cpp", "kernels/rl_kernel/csrc/common/module.cpp"]

    got = controls._fma_sources(types.SimpleNamespace(sources=sources), csrc, gpu=True)
    assert got == [
        tmp_path / "kernels/rl_kernel/csrc/softmax/softmax_cpu.cpp",
        tmp_path / "kernels/rl_kernel/csrc/common/module.cpp",
    ]
    assert seen == {"gpu": True, "root": tmp_path}
