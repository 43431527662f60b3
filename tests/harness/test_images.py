"""harness/rlparity/data/images.toml through rlparity.images: every ROCm entry pinned by a published digest with
its source; `images lock` verifies, fills or refuses (moved tag, registry down or garbage) writing all or
nothing; `images check` compares built images with their entries. A real registry: tests/harness/test_registry.py."""

from __future__ import annotations

import shutil
from datetime import date

import pytest
import tomllib

from rlparity import images
from rlparity.config import IMAGES_FILE, ConfigError, EnvError
from rlparity.images import LABEL_BASE_DIGEST, LABEL_BASE_IMAGE, load_images

ROCM64 = "rocm/pytorch:rocm6.4.3_ubuntu22.04_py3.10_pytorch_release_2.6.0"
OTHER = "sha256:" + "b" * 64


def _published() -> dict[str, str]:
    """Each ROCm entry's tag -> the digest the file pins (what a registry that agrees with it answers)."""
    return {i.tag_reference: i.digest for i in load_images().values() if i.flavour == "rocm"}


class _FakeRegistry:
    """docker SDK stand-in: resolves the tags it knows, to what it is told; refuses the rest."""

    def __init__(self, known: dict[str, object]) -> None:
        self.known = known
        self.images = self

    def get_registry_data(self, ref: str):
        if ref not in self.known:
            raise ConnectionError(f"registry unreachable for {ref}")
        return type("RegistryData", (), {"id": self.known[ref]})()


@pytest.fixture
def copy(tmp_path):
    path = tmp_path / "images.toml"
    shutil.copy(IMAGES_FILE, path)
    return path


def test_every_rocm_entry_is_pinned_with_its_published_source():
    rocm = [i for i in load_images().values() if i.flavour == "rocm"]
    assert {i.name for i in rocm} >= {"rocm60-torch20", "rocm64-torch26", "rocm72-torch210"}
    for img in rocm:
        assert images.DIGEST.fullmatch(img.digest), img.name
        assert img.source.startswith("published: "), img.name
        assert not img.verified, f"{img.name}: no registry is reachable here, so nothing is verified yet"
    assert "gfx950" in load_images()["rocm72-torch210"].targets


def test_strict_refuses_an_image_without_a_digest():
    unpinned = [i for i in load_images().values() if not i.digest]
    assert [i.name for i in unpinned] == ["cpu"]  # built locally: no registry digest exists
    with pytest.raises(ConfigError, match="not pinned by digest"):
        images.require_pinned(unpinned)
    images.require_pinned([i for i in load_images().values() if i.digest])


def test_lock_marks_confirmed_digests_verified_keeping_comments(copy):
    before = copy.read_text()
    outcomes = {o.name: o for o in images.lock(_FakeRegistry(_published()), copy)}
    assert {o.note for n, o in outcomes.items() if n != "cpu"} == {"verified"}
    assert "built locally" in outcomes["cpu"].note
    after = copy.read_text()
    assert after.count("\n") == before.count("\n") and after.splitlines()[:3] == before.splitlines()[:3]
    for img in load_images(copy).values():
        if img.flavour == "rocm":
            assert img.verified and img.digest == _published()[img.tag_reference]
            assert img.source.startswith("published: ") and img.source.endswith(
                f"verified by `rlparity images lock` on {date.today()}"
            )
    # locking twice keeps one verification note, not two
    images.lock(_FakeRegistry(_published()), copy)
    assert copy.read_text().count("verified by") == 3


def test_lock_fills_an_empty_digest(copy):
    text = images.set_field(copy.read_text(), "rocm64-torch26", "digest", '""')
    text = images.set_field(text, "rocm64-torch26", "verified", "false")
    copy.write_text(text)
    outcomes = {o.name: o for o in images.lock(_FakeRegistry({ROCM64: OTHER}), copy, ["rocm64-torch26"])}
    assert outcomes["rocm64-torch26"].note == "pinned"
    pinned = load_images(copy)["rocm64-torch26"]
    assert pinned.digest == OTHER and pinned.reference == f"rocm/pytorch@{OTHER}" and pinned.verified
    assert "get_registry_data" in tomllib.loads(copy.read_text())["images"]["rocm64-torch26"]["digest_source"]


def test_a_moved_tag_names_both_digests_and_writes_nothing(copy):
    before = copy.read_bytes()
    moved = {**_published(), ROCM64: OTHER}
    old = load_images(copy)["rocm64-torch26"].digest
    with pytest.raises(ConfigError, match="moved") as err:
        images.lock(_FakeRegistry(moved), copy)
    assert OTHER in str(err.value) and old in str(err.value) and "rocm64-torch26" in str(err.value)
    assert copy.read_bytes() == before
    # --update takes the registry's answer
    outcomes = {o.name: o for o in images.lock(_FakeRegistry(moved), copy, update=True)}
    assert outcomes["rocm64-torch26"].note == "updated" and load_images(copy)["rocm64-torch26"].digest == OTHER


@pytest.mark.parametrize("answer", [None, "sha256:short", "<html>not a registry</html>", 42])
def test_a_registry_that_answers_garbage_writes_nothing(copy, answer):
    before = copy.read_bytes()
    with pytest.raises(EnvError, match="not a sha256 manifest digest"):
        images.lock(_FakeRegistry({**_published(), ROCM64: answer}), copy)
    assert copy.read_bytes() == before


def test_a_registry_that_is_down_writes_nothing_even_where_others_resolved(copy):
    before = copy.read_bytes()
    partial = {ROCM64: _published()[ROCM64]}  # one resolves, the others' registry is down
    with pytest.raises(EnvError, match="wrote nothing") as err:
        images.lock(_FakeRegistry(partial), copy)
    assert "rocm6.0_ubuntu22.04" in str(err.value) and "unreachable" in str(err.value)
    assert copy.read_bytes() == before


def test_lock_refuses_unknown_names(copy):
    with pytest.raises(ConfigError, match=r"unknown image.*nope"):
        images.lock(_FakeRegistry({}), copy, ["nope"])


@pytest.mark.parametrize(
    "line, message",
    [
        ('verified = "yes"', "must be bool"),
        ('digest = "sha256:abc"', "sha256:<64 hex digits>"),
        ("colour = 1", "unknown key"),
    ],
)
def test_bad_entries_are_named(copy, line, message):
    text = copy.read_text()
    key = line.split(" =")[0]
    body = images.set_field(text, "rocm64-torch26", key, line.split("= ", 1)[1])
    copy.write_text(body)
    with pytest.raises(ConfigError, match=message) as err:
        load_images(copy)
    assert "images.rocm64-torch26" in str(err.value)


def test_verified_without_a_digest_is_refused(copy):
    copy.write_text(images.set_field(copy.read_text(), "cpu", "verified", "true"))
    with pytest.raises(ConfigError, match="verified = true needs a digest"):
        load_images(copy)


def test_the_seed_entry_cannot_carry_rlparity_and_says_why():
    entries = tomllib.loads(IMAGES_FILE.read_text())["images"]
    assert "Python 3.9 < 3.10" in images.unsupported_by_rlparity(entries["rocm60-torch20"])
    assert "torch 2.0.1 < 2.2" in images.unsupported_by_rlparity(entries["rocm60-torch20"])
    assert "PyTorch 2.2" in entries["rocm60-torch20"]["description"]
    assert all(not images.unsupported_by_rlparity(e) for n, e in entries.items() if n != "rocm60-torch20")


# ---- images check -------------------------------------------------------------------------------------------
class _Built:
    def __init__(self, labels: dict | None = None, repo_digests: tuple = ()) -> None:
        self.labels = labels
        self.attrs = {"RepoDigests": list(repo_digests)}


class ImageNotFound(Exception):  # the docker SDK's name: _local_image looks at the class name
    pass


class _Engine:
    def __init__(self, local: dict[str, _Built]) -> None:
        self.local = local
        self.images = self

    def get(self, ref: str) -> _Built:
        if ref not in self.local:
            raise ImageNotFound(ref)
        return self.local[ref]


def _labels(img: images.Image, digest: str | None = None) -> dict[str, str]:
    return {LABEL_BASE_IMAGE: img.reference, LABEL_BASE_DIGEST: img.digest if digest is None else digest}


def test_check_matches_an_image_built_from_the_pinned_digest():
    imgs = load_images()
    rocm = imgs["rocm64-torch26"]
    engine = _Engine({"rlparity:rocm64-torch26": _Built(_labels(rocm)), "rlparity:cpu": _Built(_labels(imgs["cpu"]))})
    rows = {r.name: r for r in images.check(engine, imgs)}
    assert rows["rocm64-torch26"].ok and rows["rocm64-torch26"].built == "matches"
    assert rows["cpu"].ok and "entry pins no digest" in rows["cpu"].built
    assert rows["rocm72-torch210"].ok and rows["rocm72-torch210"].built.startswith("not built")


@pytest.mark.parametrize(
    "labels, says",
    [
        ({LABEL_BASE_IMAGE: "rocm/pytorch:x", LABEL_BASE_DIGEST: OTHER}, OTHER),
        ({LABEL_BASE_IMAGE: ROCM64, LABEL_BASE_DIGEST: ""}, "unpinned tag"),
        (None, "no org.rlparity.base-digest label"),
    ],
)
def test_check_flags_an_image_built_from_something_else(labels, says):
    imgs = {"rocm64-torch26": load_images()["rocm64-torch26"]}
    (row,) = images.check(_Engine({"rlparity:rocm64-torch26": _Built(labels)}), imgs)
    assert not row.ok and says in row.built


def test_check_of_a_prebuilt_entry_looks_at_the_pulled_digest(copy):
    text = images.set_field(copy.read_text(), "cpu", "prebuilt", "true")
    text = images.set_field(text, "cpu", "base", '"localhost:5000/rlparity"')
    text = images.set_field(text, "cpu", "digest", f'"{OTHER}"')
    copy.write_text(text)
    img = load_images(copy)["cpu"]
    assert img.run_reference == f"localhost:5000/rlparity@{OTHER}"
    (ok,) = images.check(_Engine({img.run_reference: _Built(repo_digests=(img.reference,))}), {"cpu": img})
    assert ok.ok and ok.built == "matches"
    wrong = _Built(repo_digests=("localhost:5000/rlparity@sha256:" + "c" * 64,))
    (bad,) = images.check(_Engine({img.run_reference: wrong}), {"cpu": img})
    assert not bad.ok


def test_build_refuses_a_prebuilt_or_too_old_entry(copy):
    with pytest.raises(ConfigError, match=r"cannot carry rlparity: Python 3\.9"):
        images.build(object(), "rocm60-torch20", path=copy)
    copy.write_text(images.set_field(copy.read_text(), "cpu", "prebuilt", "true"))
    with pytest.raises(ConfigError, match="prebuilt"):
        images.build(object(), "cpu", path=copy)


def test_lock_writes_the_file_whole_or_not_at_all(copy, monkeypatch):
    """The new text goes to a temporary file renamed over the old one: a failure before the rename leaves
    the old file byte for byte, and no temporary file behind."""
    before = copy.read_bytes()

    def no_rename(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(images.os, "replace", no_rename)
    with pytest.raises(OSError, match="disk full"):
        images.lock(_FakeRegistry(_published()), copy)
    assert copy.read_bytes() == before and sorted(p.name for p in copy.parent.iterdir()) == ["images.toml"]
