"""`rlparity images lock` against a real registry (Debian's docker-registry: distribution v2 on localhost:5000,
started by .ci/run): push the CPU image, lock its tag, pull it back by the locked digest and run the quick
matrix's CPU cells from that reference; a tag moved after locking, a registry that is down and one that
answers garbage each get a clear error and leave the images file untouched."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import urllib.request
import uuid
from pathlib import Path

import pytest
import tomllib

from rlparity import images, results
from rlparity.config import IMAGES_FILE

from tooling import require

REGISTRY = os.environ.get("RLPARITY_TEST_REGISTRY", "localhost:5000")
CELLS = "image=cpu shapes=quick profile=baseline placement=single tier=exact"  # fp32 and bf16: two cells


@pytest.fixture(scope="session")
def registry() -> str:
    try:
        with urllib.request.urlopen(f"http://{REGISTRY}/v2/", timeout=5) as answer:
            ok = answer.status == 200
    except OSError as exc:
        ok, why = False, str(exc)
    else:
        why = "" if ok else f"/v2/ answered {answer.status}"
    require(f"a registry at {REGISTRY}", ok, f"none answers there ({why}); .ci/run starts docker-registry")
    return REGISTRY


def _cli(*args: str, images_file: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "RLPARITY_IMAGES": str(images_file)}
    return subprocess.run(
        [sys.executable, "-m", "rlparity.cli", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


def _push(client, source: str, repository: str, tag: str) -> str:
    """Push a local image under repository:tag; the registry's digest for it."""
    client.images.get(source).tag(repository, tag)
    for line in client.images.push(repository, tag, stream=True, decode=True):
        assert "error" not in line, line
    return client.images.get_registry_data(f"{repository}:{tag}").id


def _images_file(tmp_path: Path, base: str, tag: str) -> Path:
    """The project's images.toml with its cpu entry pointed at a pushed rlparity:cpu (prebuilt, not pinned)."""
    text = IMAGES_FILE.read_text()
    for key, value in (("base", f'"{base}"'), ("tag", f'"{tag}"'), ("digest", '""'), ("prebuilt", "true")):
        text = images.set_field(text, "cpu", key, value)
    path = tmp_path / "images.toml"
    path.write_text(text)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow(minutes=True)
def test_lock_pull_by_digest_and_run_the_cpu_cells(client, cpu_image, registry, tmp_path):
    repository, tag = f"{registry}/rlparity-ci", f"cpu-{uuid.uuid4().hex[:8]}"
    pushed = _push(client, images.project_tag("cpu"), repository, tag)
    path = _images_file(tmp_path, repository, tag)
    header = path.read_text().splitlines()[0]

    lock = _cli("images", "lock", "cpu", "--images", str(path), images_file=path)
    assert lock.returncode == 0, lock.stdout + lock.stderr
    entry = tomllib.loads(path.read_text())["images"]["cpu"]
    assert entry["digest"] == pushed and entry["verified"] is True
    assert "get_registry_data" in entry["digest_source"] and path.read_text().splitlines()[0] == header

    # pull it back by the locked digest only: no local tag of it remains
    client.images.remove(f"{repository}:{tag}")
    reference = f"{repository}@{pushed}"
    client.images.pull(reference)
    check = _cli("images", "check", "--images", str(path), images_file=path)
    assert check.returncode == 0 and "matches" in check.stdout, check.stdout + check.stderr

    out = tmp_path / "results"
    run = _cli("run", "--backend", "docker", "--matrix", "quick", "--strict", "--filter", CELLS, "--out", str(out),
               images_file=path)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    ran = results.read_all(out)
    assert len(ran) == 2 and all(r.status == "passed" and r.digests for r in ran), [(r.cell.id, r.status) for r in ran]
    assert {r.fingerprint["image"]["digest"] for r in ran} == {pushed}, ran[0].fingerprint["image"]

    # the tag moves to another image: lock names both digests and writes nothing
    moved = _push(client, "rlparity/debian-base:bookworm", repository, tag)
    assert moved != pushed
    before = path.read_bytes()
    again = _cli("images", "lock", "cpu", "--images", str(path), images_file=path)
    assert again.returncode == 3, again.stdout + again.stderr
    said = again.stdout + again.stderr
    assert "moved" in said and pushed in said and moved in said, said
    assert path.read_bytes() == before


def test_a_registry_that_is_down_leaves_the_file_untouched(client, registry, tmp_path):
    path = _images_file(tmp_path, f"localhost:{_free_port()}/rlparity-ci", "cpu")
    before = path.read_bytes()
    lock = _cli("images", "lock", "cpu", "--images", str(path), images_file=path, timeout=300)
    assert lock.returncode == 4, lock.stdout + lock.stderr
    said = lock.stdout + lock.stderr
    assert "wrote nothing" in said and "did not resolve" in said, said
    assert path.read_bytes() == before


class _Garbage(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"<html>this is not a registry</html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, *args) -> None:
        pass


def test_a_registry_that_answers_garbage_leaves_the_file_untouched(client, registry, tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Garbage)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        path = _images_file(tmp_path, f"localhost:{server.server_address[1]}/rlparity-ci", "cpu")
        before = path.read_bytes()
        lock = _cli("images", "lock", "cpu", "--images", str(path), images_file=path, timeout=300)
    finally:
        server.shutdown()
    assert lock.returncode == 4, lock.stdout + lock.stderr
    said = lock.stdout + lock.stderr
    assert "wrote nothing" in said and "Traceback" not in said, said  # a message, not a crash
    assert path.read_bytes() == before
