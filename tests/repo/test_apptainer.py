"""docker/rlparity.def, the Apptainer/Singularity recipe for clusters without Docker, is read and checked.

No apptainer binary is needed: `parse_def` reads the recipe's header and sections and rejects what apptainer
would reject or what would not be this project's image (a missing Bootstrap/From, a base that is not the
`rlparity:<name>` of an entry in harness/rlparity/data/images.toml, an unknown section). The negative tests feed
it broken copies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from rlparity.images import load_images, project_tag

REPO = Path(__file__).resolve().parents[2]
DEF_FILE = REPO / "docker" / "rlparity.def"

# Apptainer's section names (the definition-file reference); anything else is a typo apptainer would reject.
SECTIONS = {
    "setup", "files", "environment", "post", "runscript", "startscript", "test", "labels", "help",
    "arguments", "pre", "appinstall", "appfiles", "appenv", "apphelp", "applabels", "apprun", "apptest",
}  # fmt: skip
BOOTSTRAP_AGENTS = {"docker-daemon", "docker-archive", "docker", "library", "localimage", "oras", "shub"}


class DefError(ValueError):
    pass


@dataclass
class Recipe:
    header: dict[str, str]
    sections: dict[str, list[str]] = field(default_factory=dict)


def parse_def(text: str, images: dict | None = None) -> Recipe:
    """The header keys and the sections of an Apptainer definition file, checked against
    harness/rlparity/data/images.toml."""
    images = load_images() if images is None else images
    header: dict[str, str] = {}
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        m = re.match(r"^%(\w+)\b", line)
        if m:
            current = m.group(1).lower()
            if current not in SECTIONS:
                raise DefError(f"line {n}: unknown section %{m.group(1)}")
            if current in sections:
                raise DefError(f"line {n}: section %{current} appears twice")
            sections[current] = []
        elif current is not None:
            if line.strip():
                sections[current].append(line.strip())
        elif line.strip() and not line.lstrip().startswith("#"):
            key, sep, value = line.partition(":")
            if not sep or not value.strip():
                raise DefError(f"line {n}: header line is not 'Key: value': {line!r}")
            header[key.strip().lower()] = value.strip()
    for key in ("bootstrap", "from"):
        if key not in header:
            raise DefError(f"no {key.capitalize()}: in the header")
    if header["bootstrap"] not in BOOTSTRAP_AGENTS:
        raise DefError(f"unknown Bootstrap agent {header['bootstrap']!r}")
    tags = {project_tag(name): name for name in images}
    if header["bootstrap"] in {"docker-daemon", "docker"} and header["from"] not in tags:
        known = ", ".join(sorted(tags))
        raise DefError(
            f"From: {header['from']} is not rlparity:<name> of an entry in harness/rlparity/data/images.toml ({known})"
        )
    return Recipe(header, sections)


def test_the_recipe_parses_and_builds_from_a_project_image() -> None:
    recipe = parse_def(DEF_FILE.read_text())
    assert recipe.header["bootstrap"] == "docker-daemon"
    name = recipe.header["from"].removeprefix("rlparity:")
    assert name in load_images() and load_images()[name].flavour == "rocm"


def test_the_recipe_runs_the_gate_and_has_its_sections() -> None:
    recipe = parse_def(DEF_FILE.read_text())
    for section in ("runscript", "environment", "labels", "test"):
        assert recipe.sections.get(section), f"%{section} missing or empty"
    assert any(re.fullmatch(r'(exec\s+)?rlparity "\$@"', line) for line in recipe.sections["runscript"])
    env = "\n".join(recipe.sections["environment"])
    name = recipe.header["from"].removeprefix("rlparity:")
    assert f"RLPARITY_IMAGE={name}" in env  # the fingerprint names the image the .sif was made from
    assert any(line.startswith("rlparity") for line in recipe.sections["test"])


def test_the_header_comment_names_the_build_and_run_commands() -> None:
    text = DEF_FILE.read_text()
    assert "apptainer build rlparity.sif docker/rlparity.def" in text
    assert "apptainer run --rocm" in text


def _broken(old: str, new: str) -> str:
    text = DEF_FILE.read_text()
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("From: rlparity:rocm64-torch26\n", "", "no From:"),
        ("Bootstrap: docker-daemon\n", "", "no Bootstrap:"),
        ("From: rlparity:rocm64-torch26", "From: rlparity:rocm99-torch99", "not rlparity:<name>"),
        ("From: rlparity:rocm64-torch26", "From: rocm/pytorch:latest", "not rlparity:<name>"),
        ("Bootstrap: docker-daemon", "Bootstrap: docker-deamon", "unknown Bootstrap"),
        ("%runscript", "%runscipt", "unknown section %runscipt"),
        ("%labels", "%environment", "appears twice"),
    ],
)
def test_a_broken_recipe_is_rejected(old: str, new: str, message: str) -> None:
    with pytest.raises(DefError, match=re.escape(message)):
        parse_def(_broken(old, new))


def test_the_image_names_come_from_images_toml() -> None:
    text = DEF_FILE.read_text()
    parse_def(text)  # with the real images.toml
    with pytest.raises(DefError, match="not rlparity:<name>"):
        parse_def(text, images={"cpu": None})  # an images.toml without rocm64-torch26
