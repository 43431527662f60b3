"""rl_kernel.plugins.Registry, the one discovery of tiers and workloads: folders then entry points, by name; a name
given twice, an entry point that fails to load or gives the wrong kind is an error naming the place."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from rl_kernel import plugins


@dataclass(frozen=True)
class Thing:
    name: str
    origin: str = ""


class ThingError(Exception):
    pass


class FakeEntryPoint:
    def __init__(self, name: str, value: str, load) -> None:
        self.name, self.value, self.load = name, value, load


def registry(tmp_path: Path, folders: dict[str, str]) -> plugins.Registry:
    """A package `things_<n>` in tmp_path, one folder per entry of `folders` (folder -> the name it declares)."""
    package = f"things_{len(list(tmp_path.iterdir()))}_{abs(hash(tmp_path)) % 10**6}"
    root = tmp_path / package
    root.mkdir()
    (root / "__init__.py").write_text("")
    for folder, name in folders.items():
        (root / folder).mkdir()
        (root / folder / "__init__.py").write_text("")
        (root / folder / "thing.py").write_text(f"from {__name__} import Thing\nTHING = Thing({name!r})\n")
    (root / "not_a_plugin").mkdir()  # a folder without thing.py is no plug-in
    (root / "not_a_plugin" / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    return plugins.Registry("thing", package, root, "thing", "THING", "things.group", Thing, ThingError,
                            lambda t, where: replace(t, origin=where))  # fmt: skip


def test_folders_then_entry_points_by_name(tmp_path: Path, monkeypatch) -> None:
    reg = registry(tmp_path, {"b_folder": "beta", "a_folder": "alpha"})
    eps = [FakeEntryPoint("gamma", "pkg.mod:GAMMA", lambda: Thing("gamma"))]
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: eps if group == "things.group" else [])
    found = reg.found()
    assert list(found) == ["alpha", "beta", "gamma"]
    assert found["alpha"].origin == f"{reg.package}/a_folder/thing.py"
    assert found["gamma"].origin == "entry point pkg.mod:GAMMA"


@pytest.mark.parametrize(
    ("folders", "eps", "words"),
    [
        ({"a": "same", "b": "same"}, [], "thing 'same' is declared twice"),
        ({"a": "same"}, [("same", lambda: Thing("same"))], "thing 'same' is declared twice"),
        ({}, [("broken", lambda: 1 / 0)], "entry point broken = 'pkg.mod:X' (things.group) failed to load"),
        ({}, [("wrong", lambda: "a string")], "is not a test_plugins_registry.Thing"),
    ],
    ids=["two-folders", "folder-and-entry-point", "broken", "wrong-kind"],
)
def test_a_bad_plugin_is_an_error_naming_it(tmp_path: Path, monkeypatch, folders, eps, words) -> None:
    reg = registry(tmp_path, folders)
    fakes = [FakeEntryPoint(name, "pkg.mod:X", load) for name, load in eps]
    monkeypatch.setattr(plugins.metadata, "entry_points", lambda group: fakes)
    with pytest.raises(ThingError, match=re.escape(words)):
        reg.found()
