"""Host-aware runs: --targets auto|all|LIST, synthetic inventories, --min-ran, the environment exit code (4),
--list, a matrix file's own profiles and shape sets, and the table's separate mismatch columns."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlparity import cli, gate
from rlparity.backends.docker import DockerBackend
from rlparity.commands import run as run_command
from rlparity.config import ConfigError, EnvError
from rlparity.inventory import Inventory
from rlparity.matrix import load_axes, load_matrix
from rlparity.targets import INVENTORY_VAR, host_targets, inventory_file, load_inventory, parse_targets, resolve_targets
from rlparity.ui import console

from harness.factories import comparison, make_cell, make_result, matrix_text, write
from harness.scripted import OutcomeBackend, squash

DATA = Path(__file__).parent / "data"
AXES = load_axes()


# ---- targets ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("host", "expect"), [("mi300x", ("cpu", "gfx942")), ("mi210", ("cpu", "gfx90a")), ("cpu-only", ("cpu",))]
)
def test_auto_is_cpu_plus_the_hosts_targets_through_axes_toml(host, expect):
    assert host_targets(AXES, load_inventory(DATA / f"{host}.json")) == expect


def test_targets_list_all_and_unknown():
    assert parse_targets("cpu,gfx942", AXES) == ("cpu", "gfx942") == parse_targets("cpu|gfx942", AXES)
    assert resolve_targets(parse_targets("all", AXES), AXES, Inventory()) is None
    with pytest.raises(ConfigError, match="unknown target gfx999"):
        parse_targets("cpu,gfx999", AXES)


def test_auto_with_a_failed_probe_is_an_environment_error():
    """A broken GPU runner must not go green on its CPU cells alone."""
    with pytest.raises(EnvError, match="could not list this host's devices"):
        resolve_targets("auto", AXES, Inventory(error="hipErrorNoDevice"))


def test_inventory_flag_wins_over_the_env_variable(tmp_path):
    assert inventory_file(None, {INVENTORY_VAR: "a.json"}) == Path("a.json")
    assert inventory_file("b.json", {INVENTORY_VAR: "a.json"}) == Path("b.json")
    assert inventory_file(None, {}) is None
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_inventory(tmp_path / "bad.json")


# ---- the gate: an empty run is not a pass ---------------------------------------------------------------
def test_gate_fails_a_run_in_which_nothing_ran():
    """Finding: `--filter target=gfx942` on a host without it printed 6 skipped and 'gate: PASS (exit 0)'."""
    skipped = [
        make_result(make_cell("gfx942", dtype=d), "skipped", reason="no gfx942 device") for d in ("fp32", "bf16")
    ]
    v = gate.decide(skipped)
    assert v.code == gate.ENVIRONMENT == 4
    assert "only 0 cell(s) ran" in v.reasons[0]
    assert "skipped 2 cell(s)" in v.reasons[1] and "no gfx942 device" in v.reasons[1]
    assert gate.decide(skipped, min_ran=0).code == gate.OK
    ran = [*skipped, make_result(make_cell())]
    assert gate.decide(ran).code == gate.OK and gate.decide(ran, min_ran=2).code == gate.ENVIRONMENT


def _cli(tmp_path, monkeypatch, *argv: str, host: str = "cpu-only", outcome=None) -> tuple[int, OutcomeBackend]:
    backend = OutcomeBackend(outcome)
    monkeypatch.setattr(run_command, "_backend", lambda name: backend)
    args = ["run", "--inventory", str(DATA / f"{host}.json"), "--out", str(tmp_path / "res"), *argv]
    return cli.main(args), backend


def test_cli_empty_run_fails_with_the_environment_code(tmp_path, monkeypatch, capsys):
    code, backend = _cli(tmp_path, monkeypatch, "--targets", "all", "--filter", "target=gfx942")
    out = capsys.readouterr().out
    assert code == gate.ENVIRONMENT and backend.calls == []
    assert "only 0 cell(s) ran" in out and "target gfx942 needs a ROCM device" in " ".join(out.split())


def test_cli_filter_for_no_target_of_this_host_is_an_environment_error(tmp_path, monkeypatch, capsys):
    code, _ = _cli(tmp_path, monkeypatch, "--filter", "target=gfx942")
    assert code == gate.ENVIRONMENT
    assert "this host's targets (cpu)" in " ".join(capsys.readouterr().out.split())


def test_cli_strict_under_auto_ignores_other_targets_and_under_all_keeps_them(tmp_path, monkeypatch):
    code, backend = _cli(tmp_path, monkeypatch, "--strict", host="mi300x")
    assert code == gate.OK and {c.split("/")[1] for c in backend.calls} == {"cpu", "gfx942"}
    code, _ = _cli(tmp_path, monkeypatch, "--strict", "--targets", "all", host="mi300x")
    assert code == gate.ERROR  # gfx90a, sm90, ... required but not run: today's --strict meaning


def test_cli_unknown_target_is_bad_configuration(tmp_path, monkeypatch):
    assert _cli(tmp_path, monkeypatch, "--targets", "gfx999")[0] == gate.CONFIG


def test_cli_list_prints_the_plan_and_runs_nothing(tmp_path, monkeypatch, capsys):
    """Finding: there was no dry run to see which cells a matrix and filter select."""
    monkeypatch.setattr(console, "width", 250)  # one row per line
    code, backend = _cli(
        tmp_path, monkeypatch, "--list", "--targets", "all", "--filter", "profile=baseline dtype=fp32 shapes=quick"
    )
    out = squash(capsys.readouterr().out)  # rich wraps the table's cells
    assert code == gate.OK and backend.calls == [] and not (tmp_path / "res").exists()
    assert squash("local/cpu/baseline/single/fp32/quick/exact") in out and "runshere" in out
    gfx942 = next(line for line in out.split("│local/") if line.startswith("gfx942/baseline/single/fp32"))
    assert "needsaROCMdevicewitharchgfx942" in gfx942
    assert "│info│" in out and "2of8cell(s)runhere" in out  # gfx1201 is informational in quick.toml


# ---- exit 4: the environment, not the configuration -----------------------------------------------------
class _NoEngine:
    def ping(self):
        raise ConnectionError("Cannot connect to the Docker daemon at unix:///var/run/docker.sock")


def test_no_docker_engine_is_an_environment_error():
    """Finding: an unreachable engine was reported as 'configuration error' (exit 3)."""
    with pytest.raises(EnvError, match="no Docker engine reachable"):
        DockerBackend(client=_NoEngine())
    assert not issubclass(EnvError, ConfigError)


def test_cli_without_a_docker_engine_exits_4(tmp_path):
    """The real path: DOCKER_HOST at a socket that does not exist."""
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-such.sock"}
    proc = subprocess.run(
        [sys.executable, "-m", "rlparity.cli", "run", "--backend", "docker", "--out", str(tmp_path / "res")],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert "environment error" in proc.stdout and "no Docker engine reachable" in " ".join(proc.stdout.split())


def test_cli_maps_an_environment_error_to_4(monkeypatch, capsys):
    def no_engine(name):
        raise EnvError("no Docker engine reachable (DOCKER_HOST=''): refused")

    monkeypatch.setattr(run_command, "_backend", no_engine)
    assert cli.main(["run", "--backend", "docker"]) == gate.ENVIRONMENT == 4
    assert "environment error: no Docker engine reachable" in capsys.readouterr().out


# ---- a matrix file's own profiles and shape sets ----------------------------------------------------------
OWN = """
[profiles.hipblaslt]
platforms = ["rocm"]
description = "hipBLASLt GEMMs"
env = { TORCH_BLAS_PREFER_HIPBLASLT = "1" }

[shapes.tiny]
shapes = [[1, 8, 64]]
"""


def test_a_matrix_may_declare_its_own_profiles_and_shapes(tmp_path):
    """Finding: `[profiles.hipblaslt]` in a user's matrix was 'profiles: unknown key'."""
    axes = {"image": '["rocm64-torch26"]', "target": '["cpu", "gfx942"]', "profile": '["baseline", "hipblaslt"]',
            "placement": '["single"]', "dtype": '["fp32"]', "shapes": '["tiny"]', "tier": '["exact"]'}  # fmt: skip
    m = load_matrix(str(write(tmp_path, matrix_text(axes=axes, tail=OWN))))
    own = [c for c in m.cells if c.profile == "hipblaslt"]
    assert [c.target for c in own] == ["gfx942"]  # a rocm profile: not expanded on cpu
    assert own[0].env == {"TORCH_BLAS_PREFER_HIPBLASLT": "1"} and own[0].shape_list == ((1, 8, 64),)
    assert "hipblaslt" not in load_axes().profiles  # for that matrix only


@pytest.mark.parametrize(
    ("tail", "line", "expect"),
    [
        ('[profiles.baseline]\nplatforms = ["cpu"]\n', 16, "profile 'baseline' is already defined in axes.toml"),
        ("[shapes.quick]\nshapes = [[1, 2, 3]]\n", 16, "shape 'quick' is already defined in axes.toml"),
        ('[profiles.mine]\nplatforms = ["rocm"]\nenvv = {}\n', 18, "profiles.mine.envv: unknown key"),
        ("[shapes.mine]\nshapes = [[1, 2]]\n", 17, "[batch, seq, vocab]"),
    ],
)
def test_a_matrix_files_own_axes_are_validated_with_file_and_line(tmp_path, tail, line, expect):
    path = write(tmp_path, matrix_text(tail=tail))
    with pytest.raises(ConfigError) as exc:
        load_matrix(str(path))
    assert f"{path}:{line}" in str(exc.value) and expect in str(exc.value)


# ---- the table ------------------------------------------------------------------------------------------
def test_table_shows_element_and_digest_mismatches_apart(capsys):
    """Finding: the `mismatches` column added element counts and digest comparisons ('5 | max ulp 0')."""
    cmps = [comparison("x", False, count=5, max_ulp=2), comparison("golden", False, count=-1)]
    res = make_result(make_cell(), "failed", comparisons=cmps)
    assert (res.element_mismatches, res.digest_mismatches, res.mismatches) == (5, 1, 6)  # result.json unchanged
    run_command.print_table([res])
    out = capsys.readouterr().out
    assert "elem mismatches" in " ".join(out.split()) or "elem" in out
    row = next(line for line in out.splitlines() if "failed" in line)
    assert [c.strip() for c in row.split("│")][5:7] == ["5", "1"]


def test_every_subcommands_help_is_short(capsys):
    """Finding: `report --help` printed ~40 lines of docstring; the other subcommands must stay short too."""
    for command in cli.parser()._subparsers._group_actions[0].choices:
        try:  # argparse exits; `locate` passes --help on to rl_kernel.locate and returns its exit status
            code = cli.main([command, "--help"])
        except SystemExit as exc:
            code = exc.code
        assert code == 0, f"rlparity {command} --help: exit {code}"
        lines = capsys.readouterr().out.splitlines()
        assert len(lines) <= 35, f"rlparity {command} --help: {len(lines)} lines"


def test_example_inventories_are_what_the_probe_prints():
    for f in DATA.glob("*.json"):
        data = json.loads(f.read_text())
        assert json.loads(json.dumps(Inventory.from_dict(data).to_dict())) == data, f.name


class _Engine:
    """Enough of docker.DockerClient for prepare(): ping, and images.get that knows `built` tags."""

    def __init__(self, built: set[str]) -> None:
        self.built, self.images = built, self

    def ping(self) -> bool:
        return True

    def get(self, tag: str):
        import docker

        if tag not in self.built:
            raise docker.errors.ImageNotFound(tag)
        return tag


def test_docker_probes_in_a_gpu_image_and_a_missing_image_is_an_environment_error():
    """auto on a GPU host must not probe in the cpu image (no GPU torch there: every GPU cell would vanish)."""
    from rlparity.images import load_images

    images = load_images()
    cells = [make_cell(image="cpu"), make_cell("gfx942", image="rocm64-torch26")]
    backend = DockerBackend(client=_Engine({"rlparity:cpu", "rlparity:rocm64-torch26"}), images=images)
    backend.prepare(cells, strict=False)
    assert backend._probe_image == "rocm64-torch26"
    with pytest.raises(EnvError, match="image\\(s\\) not built: rlparity:rocm64-torch26"):
        DockerBackend(client=_Engine({"rlparity:cpu"}), images=images).prepare(cells, strict=False)


def test_a_prebuilt_entry_runs_its_pulled_digest_not_a_project_image():
    """prebuilt = true: the cells run base@digest as pulled; rlparity:<name> is neither needed nor used."""
    import dataclasses

    from rlparity.images import load_images

    pulled = "localhost:5000/rlparity-ci@sha256:" + "d" * 64
    images = {"cpu": dataclasses.replace(load_images()["cpu"], reference=pulled, digest=pulled[-71:], prebuilt=True)}
    cells = [make_cell(image="cpu")]
    backend = DockerBackend(client=_Engine({pulled}), images=images)
    backend.prepare(cells, strict=True)  # pinned, and present under its digest reference only
    assert backend._reference("cpu") == pulled
    assert backend.env(cells[0], [])["RLPARITY_IMAGE_DIGEST"] == pulled[-71:]
    with pytest.raises(EnvError, match="not built: " + re.escape(pulled)):
        DockerBackend(client=_Engine({"rlparity:cpu"}), images=images).prepare(cells, strict=False)
