"""The docker backend with a Docker engine: the quick matrix's cpu cells in containers give the local
backend's digests; a misbehaving container is an ERROR that says what happened, and is removed."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rlparity import compare, images, results
from rlparity.backends.docker import LABEL, OUT_LABEL, DockerBackend
from rlparity.config import REPO
from rlparity.matrix import load_matrix
from rlparity.select import select

from tooling import find_tool

CPU_TAG = images.project_tag("cpu")
DOCKERFILES = sorted((REPO / "docker").glob("Dockerfile*"))
CELL_FILTER = "profile=baseline placement=single"


HADOLINT = find_tool("hadolint")


def _run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlparity.cli", "run", *args], capture_output=True, text=True, cwd=cwd, timeout=900
    )


def _digests(out: Path) -> dict[str, dict[str, str]]:
    """Each cell's digests, keyed by the cell id without its image (local and docker cells line up)."""
    return {r.cell.id.split("/", 1)[1]: r.digests for r in results.read_all(out) if r.status == "passed"}


@pytest.mark.slow(minutes=True)
def test_quick_matrix_in_containers_gives_the_local_backends_digests(client, cpu_image, tmp_path):
    """Every fp32 cell of the quick matrix that the cpu image carries (both env profiles, single and split, each
    workload), one container each, against the same cells on the local backend: the same digests. (The other
    dtypes differ in the inputs, not in how a container runs a cell.)"""
    docker_out, local_out = tmp_path / "docker", tmp_path / "local"
    d = _run_cli("--backend", "docker", "--matrix", "quick", "--filter", "image=cpu dtype=fp32", "--out",
                 str(docker_out), "--jobs", "2")  # fmt: skip
    assert d.returncode == 0, d.stdout[-3000:] + d.stderr[-3000:]
    loc = _run_cli("--matrix", "quick", "--filter", "target=cpu dtype=fp32", "--out", str(local_out), "--jobs", "2")
    assert loc.returncode == 0, loc.stdout[-3000:]
    in_docker, local = _digests(docker_out), _digests(local_out)
    # the quick matrix's fp32 CPU cells: 2 profiles x 2 placements of the quick shapes, the edges and the model
    assert len(in_docker) == 6 and set(in_docker) == set(local), (sorted(in_docker), sorted(local))
    assert all(in_docker[k] and in_docker[k] == local[k] for k in in_docker), (in_docker, local)
    fp = results.read_all(docker_out)[0].fingerprint
    assert fp["image"]["name"] == "cpu" and fp["image"]["record"]["torch"].startswith("2.13.0")
    # this run's containers only: other tests may run cells in containers at the same time
    left = [c for c in client.containers.list(all=True, filters={"label": LABEL})
            if c.labels.get(OUT_LABEL, "").startswith(str(docker_out.resolve()))]  # fmt: skip
    assert not left, f"containers left behind: {[c.name for c in left]}"
    _compare_gives_the_same_verdict(docker_out, local_out, tmp_path / "docker-changed", set(in_docker))


def _compare(a: Path, b: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlparity.cli", "compare", str(a), str(b)], capture_output=True, text=True, timeout=300
    )


def _compare_gives_the_same_verdict(docker_out: Path, local_out: Path, changed: Path, passed: set[str]) -> None:
    """`rlparity compare` matches the docker run's cells with the local run's (image ignored): every cell
    both ran is equal, exit 0; one changed digest in a copy of the docker run is caught, exit 1."""
    proc = _compare(docker_out, local_out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = compare.compare_dirs(docker_out, local_out)
    verdicts = {d.key: d.verdict for d in got.cells}
    assert got.ignored == ("image",) and got.exit_code == 0, verdicts
    assert got.counts()[compare.DIFFER] == 0 and got.counts()[compare.EQUAL] == len(passed), verdicts
    assert all(verdicts[k] == compare.EQUAL for k in passed), verdicts
    # negative control: one digest of one cell changed in a copy of the docker run
    shutil.copytree(docker_out, changed)
    cell = next(r.cell for r in results.read_all(changed) if r.status == "passed" and r.digests)
    path = results.cell_dir(changed, cell) / results.RESULT_FILE
    data = json.loads(path.read_text())
    name = sorted(data["digests"])[0]
    data["digests"][name] = "0" * 64 if data["digests"][name] != "0" * 64 else "f" * 64
    path.write_text(json.dumps(data))
    proc = _compare(changed, local_out)
    assert proc.returncode == 1 and name in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    (bad,) = [d for d in compare.compare_dirs(changed, local_out).cells if d.verdict == compare.DIFFER]
    assert bad.differing == (name,) and bad.id_a == data["cell"]["id"]


class _Misbehaving(DockerBackend):
    def __init__(self, command: list[str]) -> None:
        super().__init__()
        self.command = command

    def entrypoint(self) -> list[str]:
        return self.command


@pytest.mark.parametrize(
    ("command", "timeout", "reason"),
    [
        (["sleep", "60"], 3.0, "timed out after 3 s"),
        (["python", "-c", "import ctypes; print('about to crash', flush=True); ctypes.string_at(0)"], 60.0, "SIGSEGV"),
        (["python", "-c", "print('bye')"], 60.0, "without writing result.json"),
    ],
    ids=["hang", "segfault", "silent"],
)  # fmt: skip
def test_docker_backend_turns_a_misbehaving_container_into_an_error(client, cpu_image, tmp_path, command, timeout,
                                                                    reason):  # fmt: skip
    cell = next(iter(select(load_matrix("quick", backend="docker").cells, f"image=cpu {CELL_FILTER} dtype=fp32")))
    cell = dataclasses.replace(cell, timeout_s=timeout)
    backend = _Misbehaving(command)
    res = backend.run_cell(cell, [], tmp_path / "cell")
    assert res.status == "error" and reason in res.reason, res.reason
    if "crash" in " ".join(command):
        assert "about to crash" in res.output_tail
    left = client.containers.list(all=True, filters={"label": f"{OUT_LABEL}={(tmp_path / 'cell').resolve()}"})
    assert not left


class _LateLogContainer:
    """A container whose log is empty at the first read after `wait` (as Debian's Docker 20.10 answered)."""

    def __init__(self, empty_reads: int, code: int = 0) -> None:
        self.empty_reads, self.code, self.removed = empty_reads, code, False

    def start(self) -> None: ...

    def wait(self) -> dict:
        return {"StatusCode": self.code}

    def logs(self, stdout: bool = True, stderr: bool = False) -> bytes:
        if stderr:
            return b"boom"
        self.empty_reads -= 1
        return b"" if self.empty_reads >= 0 else b'{"devices": []}'

    def remove(self, force: bool = False) -> None:
        self.removed = True


def test_run_once_reads_the_log_again_until_the_output_is_there():
    """The probe's output arrived after `wait` half of the time: a b'' read is retried, the box removed."""
    from types import SimpleNamespace

    from rlparity.backends.docker import CellContainer

    box = _LateLogContainer(empty_reads=3)
    client = SimpleNamespace(containers=SimpleNamespace(create=lambda *a, **k: box))
    assert CellContainer.run_once(client, "rlparity:cpu", ["python"], {}) == b'{"devices": []}' and box.removed
    failing = _LateLogContainer(empty_reads=0, code=2)
    client = SimpleNamespace(containers=SimpleNamespace(create=lambda *a, **k: failing))
    with pytest.raises(RuntimeError, match="exit 2: boom"):
        CellContainer.run_once(client, "rlparity:cpu", ["python"], {})
    assert failing.removed
