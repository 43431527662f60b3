"""The images and compose services with a Docker engine: the CPU image built from this checkout carries its
build record and runs as non-root; `docker-compose run test-cpu` and `run report` work (the v1 CLI).

A Docker engine and docker-compose are things CI provides (.ci/run): with CI=true their absence is a
failure, elsewhere a skip that names what is missing (the `client` and `cpu_image` fixtures, tests/conftest.py).
The docker backend's own tests (cells in containers) are in tests/harness/test_docker_backend.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess

import pytest

from rlparity import images, results
from rlparity.config import REPO
from rlparity.matrix import load_matrix
from rlparity.select import select

from tooling import find_tool, require

CPU_TAG = images.project_tag("cpu")
CELL_FILTER = "profile=baseline placement=single"


# ---- with a Docker engine ------------------------------------------------------------------------------
def _in_image(client, *cmd: str) -> str:
    return client.containers.run(CPU_TAG, entrypoint=list(cmd), remove=True).decode()


def test_cpu_image_carries_its_build_record_and_runs_as_non_root(client, cpu_image):
    record = json.loads(_in_image(client, "cat", "/etc/rlparity/build.json"))
    assert record["image"] == "cpu" and record["torch"].startswith("2.13.0")
    assert record["rl_kernel_build"] == "cpu"
    assert "-ffp-contract=off" in record["kernel"]["cxx_flags"]
    assert _in_image(client, "id", "-u").strip() != "0"
    assert cpu_image.attrs["Config"]["Entrypoint"] == ["rlparity"]


@pytest.mark.slow(minutes=True)
def test_docker_compose_runs_test_cpu(client, cpu_image, tmp_path):
    require("docker-compose", find_tool("docker-compose"))
    out = tmp_path / "results"
    out.mkdir()
    env = {**os.environ, "RESULTS_DIR": str(out), "RLPARITY_UID": str(os.getuid()), "RLPARITY_GID": str(os.getgid())}
    proc = subprocess.run(
        ["docker-compose", "-f", str(REPO / "compose.yaml"), "run", "--rm", "test-cpu",
         "run", "--matrix", "quick", "--filter", f"target=cpu {CELL_FILTER} dtype=bf16", "--out", "/work/results"],
        capture_output=True, text=True, env=env, timeout=600, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (out / "junit.xml").exists() and json.loads((out / "summary.json").read_text())["exit_code"] == 0
    with contextlib.suppress(Exception):
        subprocess.run(["docker-compose", "-f", str(REPO / "compose.yaml"), "down"], capture_output=True, cwd=REPO)


def test_docker_compose_report_service_renders_a_results_dir(client, cpu_image, tmp_path):
    require("docker-compose", find_tool("docker-compose"))
    res_dir, rep_dir = tmp_path / "results", tmp_path / "report"
    rep_dir.mkdir()
    cell = next(iter(select(load_matrix("quick").cells, f"target=cpu {CELL_FILTER} dtype=fp32")))
    res = results.CellResult(cell, "failed", "bitwise mismatch in planted", digests={"x/logprobs": "ab" * 32})
    results.write(res, results.cell_dir(res_dir, cell))
    env = {**os.environ, "RESULTS_DIR": str(res_dir), "REPORT_DIR": str(rep_dir),
           "RLPARITY_UID": str(os.getuid()), "RLPARITY_GID": str(os.getgid())}  # fmt: skip
    proc = subprocess.run(
        ["docker-compose", "-f", str(REPO / "compose.yaml"), "run", "--rm", "report"],
        capture_output=True, text=True, env=env, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert cell.id in (rep_dir / "report.md").read_text()
    assert "data:image/png;base64" in (rep_dir / "report.html").read_text()
