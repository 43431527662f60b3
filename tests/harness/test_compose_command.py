"""compose.yaml's `test` command line, as written, on synthetic hosts (tests/harness/data/*.json through
RLPARITY_INVENTORY): it must pass unmodified on an MI300X, an MI210 and a CPU-only host, and fail (2) when a
required cell of the host's own target errors. Cells run in-process (OutcomeBackend): no GPU is needed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from rlparity import cli
from rlparity.commands import run as run_command

from harness.factories import ROOT
from harness.scripted import OutcomeBackend, write_matrix

DATA = Path(__file__).parent / "data"


def compose_test_argv(out: Path, **env: str) -> list[str]:
    """The `test` service's command with every ${VAR:-default} at `env`'s value or its default, --out in tmp."""
    command = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]["test"]["command"]
    var = re.compile(r"\$\{([A-Z_]+):?-([^}]*)\}")
    argv = [var.sub(lambda m: env.get(m.group(1), m.group(2)), a) for a in command]
    argv[argv.index("--out") + 1] = str(out)
    return argv


def run_compose_test(tmp_path, monkeypatch, host: str, outcome=None) -> tuple[int, dict, OutcomeBackend]:
    backend = OutcomeBackend(outcome)
    monkeypatch.setattr(run_command, "_backend", lambda name: backend)
    monkeypatch.setenv("RLPARITY_INVENTORY", str(DATA / f"{host}.json"))
    out = tmp_path / "results"
    code = cli.main(compose_test_argv(out))
    return code, json.loads((out / "summary.json").read_text()), backend


def targets_of(summary: dict) -> set[str]:
    return {cell_id.split("/")[1] for cell_id in summary["cells"]}


@pytest.mark.parametrize(("host", "gpu_target"), [("mi300x", "gfx942"), ("mi210", "gfx90a"), ("cpu-only", None)])
def test_compose_test_command_passes_unmodified_on_each_host(tmp_path, monkeypatch, host, gpu_target):
    """Finding: compose's `test` ended in exit 2 on every AMD host (--strict over every target of quick)."""
    code, summary, backend = run_compose_test(tmp_path, monkeypatch, host)
    assert code == 0, summary["reasons"]
    assert targets_of(summary) == {"cpu", gpu_target} - {None}
    # Every cell ran and passed, but the fast tier's cpu cells: skipped (no GPU), informational.
    skipped = {c for c, status in summary["cells"].items() if status == "skipped"}
    assert skipped == {c for c in summary["cells"] if c.split("/")[1] == "cpu" and c.endswith("/fast")}
    assert set(summary["cells"].values()) <= {"passed", "skipped"}
    assert len(backend.calls) == len(summary["cells"]) - len(skipped)


def test_compose_test_command_fails_when_a_required_cell_of_the_hosts_target_errors(tmp_path, monkeypatch):
    """Finding: host-aware --strict must still fail on the host's own target."""
    code, summary, _ = run_compose_test(
        tmp_path, monkeypatch, "mi300x", lambda c: "error" if c.target == "gfx942" and c.dtype == "bf16" else "passed"
    )
    assert code == 2
    assert any("gfx942" in r for r in summary["reasons"])


def test_compose_test_command_fails_when_the_hosts_gpu_cells_cannot_run(tmp_path, monkeypatch):
    """A GPU host whose rl_kernel has no GPU kernels: its required gfx942 cells are skipped, --strict errors."""
    inv = json.loads((DATA / "mi300x.json").read_text())
    (tmp_path / "no-gpu-build.json").write_text(json.dumps({**inv, "rl_kernel_gpu": False}))
    monkeypatch.setattr(run_command, "_backend", lambda name: OutcomeBackend())
    monkeypatch.setenv("RLPARITY_INVENTORY", str(tmp_path / "no-gpu-build.json"))
    assert cli.main(compose_test_argv(tmp_path / "results")) == 2


def test_compose_test_command_fails_when_nothing_can_run_here(tmp_path, monkeypatch, capsys):
    """Finding: a run in which nothing ran passed. A matrix of gfx942 cells on a CPU-only host: exit 4."""
    matrix = write_matrix(tmp_path / "gfx942.toml", target=["gfx942"], profile=["baseline", "sdma-off"])
    backend = OutcomeBackend()
    monkeypatch.setattr(run_command, "_backend", lambda name: backend)
    monkeypatch.setenv("RLPARITY_INVENTORY", str(DATA / "cpu-only.json"))
    assert cli.main(compose_test_argv(tmp_path / "results", MATRIX=str(matrix))) == 4
    assert backend.calls == [] and "this host's targets (cpu)" in " ".join(capsys.readouterr().out.split())


def test_compose_report_service_builds_its_image():
    """Finding: `report` used rlparity:cpu with no `build:`, so `docker compose run --rm report` could not make it."""
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    report, cpu = services["report"], services["test-cpu"]
    assert report["image"] == cpu["image"] == "rlparity:cpu"
    assert report["build"] == cpu["build"]
