"""Reading the harness's TOML files with errors that name the file, the line and the key.

tomllib gives no positions for values, so `TomlFile.line_of` finds a key's line in the text by
walking the table headers: good enough to point a person at the right line of a hand-written file.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # the rocm/pytorch images run Python 3.10
    import tomli as tomllib

# The harness's data ships inside the package (rlparity/data/: the matrices, the images the matrices name, the
# workloads' golden digests), so an installed wheel finds them from any directory. pip installs a wheel
# unpacked, so the package's files are a directory on disk (`Path`, not only a Traversable).
DATA_DIR = Path(str(resources.files("rlparity").joinpath("data")))
MATRICES_DIR = DATA_DIR / "matrices"
# RLPARITY_IMAGES: another images file (a fork's own registry, a test's copy) for every command of a run.
IMAGES_FILE = Path(os.environ.get("RLPARITY_IMAGES") or DATA_DIR / "images.toml")
# RLPARITY_GOLDEN_DIR: another directory of the workloads' golden tables (<tier>.json), for the host and its cells:
# a tier of your package keeps its own there (and a test keeps the package's data untouched).
GOLDEN_DIR = Path(os.environ.get("RLPARITY_GOLDEN_DIR") or DATA_DIR / "golden")
# The checkout root when rlparity runs from one (editable install): only building images needs it (the
# Dockerfiles and the build context); `checkout()` says whether this is one.
REPO = Path(__file__).resolve().parents[2]


def checkout() -> Path | None:
    """The repository root when rlparity runs from a checkout, else None (an installed wheel)."""
    return REPO if (REPO / "docker" / "Dockerfile").is_file() and (REPO / "setup.py").is_file() else None


class ConfigError(Exception):
    """Bad configuration (gate exit code 3): names the file, the line and the key where it can."""

    def __init__(self, message: str, path: Path | str | None = None, line: int | None = None, key: str = ""):
        self.path, self.line, self.key = path, line, key
        where = f"{path}:{line}" if path and line else (str(path) if path else "")
        prefix = ": ".join(p for p in (where, key) if p)
        super().__init__(f"{prefix}: {message}" if prefix else message)


class EnvError(Exception):
    """This host cannot do what the run needs (gate exit code 4): no Docker engine, an image or a device
    missing, too few cells ran. The configuration may be fine; the machine is not."""


_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\]]+?)\s*\]\]?")


@dataclass(frozen=True)
class TomlFile:
    path: Path
    text: str
    data: dict[str, Any]

    @classmethod
    def load(cls, path: Path | str) -> TomlFile:
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read: {exc.strerror}", path) from exc
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            line = getattr(exc, "lineno", None) or _line_from_message(str(exc))
            raise ConfigError(f"not valid TOML: {exc}", path, line) from exc
        return cls(path, text, data)

    def line_of(self, table: str, key: str | None = None, index: int = 0) -> int | None:
        """Line (1-based) of `key` inside the index-th `[table]` / `[[table]]` (the header if key is None)."""
        seen, inside = -1, False
        key_re = re.compile(rf"^\s*\"?{re.escape(key)}\"?\s*=") if key else None
        for n, line in enumerate(self.text.splitlines(), 1):
            head = _HEADER.match(line)
            if head:
                name = head.group(2).replace('"', "")
                inside = name == table and (seen := seen + 1) == index
                if inside and key_re is None:
                    return n
                continue
            if inside and key_re and key_re.match(line):
                return n
        if key and not table:  # a top-level key, or a top-level table [key] / [key.sub] / [[key]]
            for n, ln in enumerate(self.text.splitlines(), 1):
                head = _HEADER.match(ln)
                name = head.group(2).replace('"', "") if head else ""
                if (key_re and key_re.match(ln)) or name == key or name.startswith(f"{key}."):
                    return n
        return None

    def error(self, message: str, table: str, key: str | None = None, index: int = 0) -> ConfigError:
        where = ".".join(p for p in (table, key) if p)
        return ConfigError(message, self.path, self.line_of(table, key, index), where)

    def check_keys(self, section: dict, allowed: set[str], table: str, index: int = 0) -> None:
        """Unknown keys are errors, not silently ignored."""
        for key in section:
            if key not in allowed:
                raise self.error(f"unknown key (allowed: {', '.join(sorted(allowed))})", table, key, index)

    def require(self, section: dict, key: str, kind: type | tuple[type, ...], table: str, index: int = 0) -> Any:
        if key not in section:
            raise ConfigError(f"missing required key {key!r}", self.path, self.line_of(table, None, index), table)
        return self.typed(section, key, kind, table, index)

    def typed(self, section: dict, key: str, kind: type | tuple[type, ...], table: str, index: int = 0) -> Any:
        value = section[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if not isinstance(value, kind) or (isinstance(value, bool) and bool not in kinds):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise self.error(f"must be {names}, got {type(value).__name__} {value!r}", table, key, index)
        return value


def import_extra(module: str, extra: str) -> Any:
    """Import a dependency of one of the package's extras (docker, report), or say which extra to install."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] != module.split(".")[0]:
            raise  # the module is there; something it imports is not
        raise EnvError(f"{module} is not installed: pip install 'rlparity[{extra}]'") from exc


def _line_from_message(message: str) -> int | None:
    m = re.search(r"line (\d+)", message)
    return int(m.group(1)) if m else None


def as_list(value: Any) -> list:
    """A rule's value may be one string or a list of strings."""
    return list(value) if isinstance(value, list) else [value]
