"""harness/rlparity/data/images.toml through rlparity.images: --strict needs digests; `images lock` writes them back."""

from __future__ import annotations

import shutil

import pytest
import tomllib

from rlparity import images
from rlparity.config import IMAGES_FILE, ConfigError
from rlparity.images import load_images


def test_strict_refuses_an_image_without_a_digest():
    unpinned = [i for i in load_images().values() if not i.digest]
    assert unpinned  # none can be resolved here (no registry)
    with pytest.raises(ConfigError, match="not pinned by digest"):
        images.require_pinned(unpinned)
    pinned = [images.Image("x", "rocm", ("gfx942",), "rocm/pytorch@sha256:" + "a" * 64, "sha256:" + "a" * 64)]
    images.require_pinned(pinned)


class _FakeRegistry:
    """docker SDK stand-in: resolves one tag, refuses the rest."""

    def __init__(self, known: dict[str, str]) -> None:
        self.known = known
        self.images = self

    def get_registry_data(self, ref: str):
        if ref not in self.known:
            raise ConnectionError(f"registry unreachable for {ref}")
        return type("RegistryData", (), {"id": self.known[ref]})()


def test_images_lock_writes_digests_and_their_source_keeping_comments(tmp_path):
    path = tmp_path / "images.toml"
    shutil.copy(IMAGES_FILE, path)
    before = path.read_text()
    ref = "rocm/pytorch:rocm6.4.1_ubuntu22.04_py3.10_pytorch_release_2.6.0"
    digest = "sha256:" + "b" * 64
    outcomes = images.lock(_FakeRegistry({ref: digest}), path)
    by_name = {o.name: o for o in outcomes}
    assert by_name["rocm64-torch26"].digest == digest
    assert "unreachable" in by_name["rocm60-torch22"].error and not by_name["rocm60-torch22"].digest
    assert "built locally" in by_name["cpu"].error
    after = path.read_text()
    assert after.count("\n") == before.count("\n") and after.splitlines()[0] == before.splitlines()[0]
    pinned = load_images(path)["rocm64-torch26"]
    assert pinned.digest == digest and pinned.reference == f"rocm/pytorch@{digest}"
    assert "get_registry_data" in tomllib.loads(after)["images"]["rocm64-torch26"]["digest_source"]
