"""Matrix file (TOML) -> the list of cells to run: load, validate, expand (filtering: select.py).

Pure logic: no processes, no devices. The values an axis may take (targets, env profiles, shape sets)
are data in harness/rlparity/data/matrices/axes.toml; images come from harness/rlparity/data/images.toml
(package data: config.py).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlparity.cells import AXES, DEFAULT_WORKLOAD, DTYPES, TIER_SCOPES, Cell
from rlparity.config import IMAGES_FILE, MATRICES_DIR, ConfigError, TomlFile, as_list
from rlparity.images import Image, load_images

PLACEMENTS = ("single", "dual-die", "split")
PLATFORMS = ("cpu", "cuda", "rocm")  # rl_kernel.tiers.PLATFORMS too (cells.DTYPES says why two)
LOCAL_IMAGE = "local"  # the local backend runs every cell on the host: the image axis collapses to this


@dataclass(frozen=True)
class Target:
    name: str
    platform: str
    arch: str = ""
    wave: int = 0
    description: str = ""


@dataclass(frozen=True)
class Profile:
    name: str
    platforms: tuple[str, ...]
    env: dict[str, str]
    targets: tuple[str, ...] = ()  # empty: every target of its platforms
    env_by_target: dict[str, dict[str, str]] = field(default_factory=dict)
    description: str = ""

    def applies_to(self, target: Target) -> bool:
        return target.platform in self.platforms and (not self.targets or target.name in self.targets)

    def env_for(self, target: str) -> dict[str, str]:
        return {**self.env, **self.env_by_target.get(target, {})}


@dataclass(frozen=True)
class TierAxis:
    """A tier as the host sees it (axes.toml [tiers.NAME]): its golden scope. What a tier computes is the cell
    side's (rl_kernel.tiers); whether an image offers it, the device probe's."""

    name: str
    scope: str  # "all-devices": digests equal across targets; "per-target": within one target
    description: str = ""


@dataclass(frozen=True)
class Workload:
    """A shape set's workload: its name and the parameters the matrix passes it (with the line of each key, so
    that a key the workload does not take is reported at its place once the probe says what it takes)."""

    name: str = DEFAULT_WORKLOAD
    params: dict[str, Any] = field(default_factory=dict)
    where: tuple[Path, int | None] | None = None  # the file and line of the shape set's params
    golden: bool = False  # `rlparity golden` keeps committed digests of this shape set


@dataclass(frozen=True)
class Axes:
    """Everything a matrix may name."""

    targets: dict[str, Target]
    profiles: dict[str, Profile]
    shapes: dict[str, tuple[tuple[int, int, int], ...]]
    images: dict[str, Image]
    workloads: dict[str, Workload] = field(default_factory=dict)  # shape set -> its workload (default plain)
    tiers: dict[str, TierAxis] = field(default_factory=dict)


@dataclass(frozen=True)
class Matrix:
    name: str
    path: Path
    description: str
    cells: tuple[Cell, ...]
    axes: Axes | None = None  # axes.toml's plus the file's own (profiles, shapes, tiers)


# ---- loading ------------------------------------------------------------------------------------
def resolve_matrix_path(name_or_path: str) -> Path:
    """`--matrix quick` means the package's data/matrices/quick.toml; anything with a slash or .toml is a path."""
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        path = Path(name_or_path)
    else:
        path = MATRICES_DIR / f"{name_or_path}.toml"
        if not path.exists():
            known = sorted(p.stem for p in MATRICES_DIR.glob("*.toml") if p.stem != "axes")
            raise ConfigError(f"no matrix named {name_or_path!r} (known: {', '.join(known)})", path)
    if not path.exists():
        raise ConfigError("matrix file does not exist", path)
    return path


def load_axes(axes_path: Path = MATRICES_DIR / "axes.toml", images_path: Path = IMAGES_FILE) -> Axes:
    f = TomlFile.load(axes_path)
    f.check_keys(f.data, {"targets", "profiles", "shapes", "tiers"}, "")
    targets = {}
    for name, t in f.data.get("targets", {}).items():
        table = f"targets.{name}"
        f.check_keys(t, {"platform", "arch", "wave", "description"}, table)
        platform = f.require(t, "platform", str, table)
        if platform not in PLATFORMS:
            raise f.error(f"unknown platform {platform!r} (known: {', '.join(PLATFORMS)})", table, "platform")
        targets[name] = Target(name, platform, t.get("arch", ""), t.get("wave", 0), t.get("description", ""))
    profiles = load_profiles(f, targets)
    shapes, workloads = load_shapes(f)
    return Axes(targets, profiles, shapes, load_images(images_path), workloads, load_tiers(f))


def load_tiers(f: TomlFile) -> dict[str, TierAxis]:
    """The [tiers.NAME] tables of a file (axes.toml, or a matrix file's own): each tier's golden scope."""
    tiers = {}
    for name, s in f.data.get("tiers", {}).items():
        table = f"tiers.{name}"
        if not isinstance(s, dict):
            raise f.error("must be a table", table)
        f.check_keys(s, {"scope", "description"}, table)
        scope = f.require(s, "scope", str, table)
        if scope not in TIER_SCOPES:
            raise f.error(f"unknown scope {scope!r} (known: {', '.join(TIER_SCOPES)})", table, "scope")
        tiers[name] = TierAxis(name, scope, s.get("description", ""))
    return tiers


def load_profiles(f: TomlFile, targets: dict[str, Target]) -> dict[str, Profile]:
    """The [profiles.NAME] tables of a file (axes.toml, or a matrix file's own)."""
    profiles = {}
    for name, p in f.data.get("profiles", {}).items():
        table = f"profiles.{name}"
        if not isinstance(p, dict):
            raise f.error("must be a table", f"profiles.{name}")
        f.check_keys(p, {"platforms", "env", "targets", "env_by_target", "description"}, table)
        platforms = tuple(f.require(p, "platforms", list, table))
        for bad in set(platforms) - set(PLATFORMS):
            raise f.error(f"unknown platform {bad!r}", table, "platforms")
        for bad in set(p.get("targets", ())) - set(targets):
            raise f.error(f"unknown target {bad!r}", table, "targets")
        env = {k: str(v) for k, v in f.typed(p, "env", dict, table).items()} if "env" in p else {}
        raw_by_target = f.typed(p, "env_by_target", dict, table) if "env_by_target" in p else {}
        by_target = {t: {k: str(v) for k, v in e.items()} for t, e in raw_by_target.items()}
        profiles[name] = Profile(name, platforms, env, tuple(p.get("targets", ())), by_target, p.get("description", ""))
    return profiles


def load_shapes(f: TomlFile) -> tuple[dict[str, tuple[tuple[int, int, int], ...]], dict[str, Workload]]:
    """The [shapes.NAME] tables of a file (axes.toml, or a matrix file's own): the shapes of each set, and the
    workload each set names with its parameters (`params = {...}`; which keys a workload takes is the cell
    side's, checked against the device probe by check_workload_params)."""
    shapes, workloads = {}, {}
    for name, s in f.data.get("shapes", {}).items():
        table = f"shapes.{name}"
        if not isinstance(s, dict):
            raise f.error("must be a table", f"shapes.{name}")
        f.check_keys(s, {"shapes", "description", "workload", "params", "golden"}, table)
        workload = s.get("workload", DEFAULT_WORKLOAD)
        if not isinstance(workload, str) or not workload.replace("-", "_").isidentifier():
            raise f.error(f"a workload is named by an identifier, got {workload!r}", table, "workload")
        params = f.typed(s, "params", dict, table) if "params" in s else {}
        line = f.line_of(table, "params" if params else None)
        if params and line is None:  # params as their own table, [shapes.NAME.params]
            line = f.line_of(f"{table}.params")
        where = (f.path, line)
        workloads[name] = Workload(
            workload, dict(params), where, bool(f.typed(s, "golden", bool, table)) if "golden" in s else False
        )
        lst = f.require(s, "shapes", list, table)
        if not lst or not all(
            isinstance(x, list) and len(x) == 3 and all(isinstance(v, int) and v > 0 for v in x) for x in lst
        ):
            raise f.error("must be a non-empty list of [batch, seq, vocab] positive integers", table, "shapes")
        shapes[name] = tuple(tuple(x) for x in lst)
    return shapes, workloads


def with_own_axes(f: TomlFile, axes: Axes) -> Axes:
    """axes.toml's profiles and shape sets plus the matrix file's own ([profiles.NAME], [shapes.NAME]), for
    that matrix only. A name axes.toml already defines is an error: one name, one meaning in every report."""
    own_profiles, (own_shapes, own_workloads) = load_profiles(f, axes.targets), load_shapes(f)
    own_tiers = load_tiers(f)
    for kind, own, builtin in (
        ("profiles", own_profiles, axes.profiles),
        ("shapes", own_shapes, axes.shapes),
        ("tiers", own_tiers, axes.tiers),
    ):
        for name in own:
            if name in builtin:
                message = f"{kind[:-1]} {name!r} is already defined in axes.toml: pick another name"
                raise f.error(message, f"{kind}.{name}")
    if not own_profiles and not own_shapes and not own_tiers:
        return axes
    return dataclasses.replace(
        axes,
        profiles={**axes.profiles, **own_profiles},
        shapes={**axes.shapes, **own_shapes},
        workloads={**axes.workloads, **own_workloads},
        tiers={**axes.tiers, **own_tiers},
    )


_MATRIX_KEYS = {"description", "timeout_s", "repeats", "seed"}


def load_matrix(name_or_path: str, axes: Axes | None = None, backend: str = "local") -> Matrix:
    """Load and expand a matrix file. With the local backend the image axis collapses to 'local'."""
    path = resolve_matrix_path(name_or_path)
    axes = axes or load_axes()
    f = TomlFile.load(path)
    f.check_keys(f.data, {"matrix", "axes", "include", "exclude", "informational", "profiles", "shapes", "tiers"}, "")
    axes = with_own_axes(f, axes)
    meta = f.data.get("matrix", {})
    f.check_keys(meta, _MATRIX_KEYS, "matrix")
    timeout = float(f.typed(meta, "timeout_s", (int, float), "matrix")) if "timeout_s" in meta else 300.0
    repeats = f.typed(meta, "repeats", int, "matrix") if "repeats" in meta else 3
    seed = f.typed(meta, "seed", int, "matrix") if "seed" in meta else 0
    if not math.isfinite(timeout) or timeout <= 0 or repeats < 2:
        raise f.error("timeout_s must be a finite number > 0 and repeats >= 2", "matrix")

    known = _known_values(axes)
    raw_axes = f.data.get("axes")
    if not isinstance(raw_axes, dict):
        raise ConfigError("missing [axes] table", path, None, "axes")
    f.check_keys(raw_axes, set(AXES), "axes")
    values = {}
    for axis in AXES:
        vals = f.require(raw_axes, axis, list, "axes")
        if not vals:
            raise f.error("must list at least one value", "axes", axis)
        _check_values(f, axis, vals, known, "axes", 0)
        values[axis] = vals
    rules = {kind: _load_rules(f, kind, known) for kind in ("include", "exclude", "informational")}

    # Excludes cut the product; an include is explicit and always kept.
    product = [dict(zip(AXES, combo, strict=True)) for combo in itertools.product(*(values[a] for a in AXES))]
    points = [p for p in product if not any(_matches(rule, p) for rule in rules["exclude"])]
    points += list(rules["include"])
    cells: dict[str, Cell] = {}
    for p in points:
        cell = _make_cell(p, axes, backend, timeout, repeats, seed)
        if cell is None:
            continue
        required = not any(_matches(rule, p) for rule in rules["informational"])
        # Points that collapse to one cell (the local backend's image) are required if any of them is.
        required = required or (cell.id in cells and cells[cell.id].required)
        cells[cell.id] = dataclasses.replace(cell, required=required)
    return Matrix(path.stem, path, meta.get("description", ""), tuple(cells.values()), axes)


def _known_values(axes: Axes) -> dict[str, tuple[str, ...]]:
    return {
        "image": (*tuple(axes.images), LOCAL_IMAGE),
        "target": tuple(axes.targets),
        "profile": tuple(axes.profiles),
        "placement": PLACEMENTS,
        "dtype": DTYPES,
        "shapes": tuple(axes.shapes),
        "tier": tuple(axes.tiers),
    }


def _check_values(f: TomlFile, axis: str, vals: list, known: dict, table: str, index: int) -> None:
    for v in vals:
        if not isinstance(v, str):
            raise f.error(f"values must be strings, got {v!r}", table, axis, index)
        if v not in known[axis]:
            raise f.error(f"unknown {axis} {v!r} (known: {', '.join(known[axis])})", table, axis, index)


def _load_rules(f: TomlFile, kind: str, known: dict) -> list[dict[str, Any]]:
    rules = f.data.get(kind, [])
    if not isinstance(rules, list):
        raise ConfigError(f"[[{kind}]] must be an array of tables", f.path, f.line_of(kind), kind)
    for i, rule in enumerate(rules):
        f.check_keys(rule, set(AXES), kind, i)
        if not rule:
            raise ConfigError("empty rule matches every cell", f.path, f.line_of(kind, None, i), kind)
        for axis, v in rule.items():
            _check_values(f, axis, as_list(v), known, kind, i)
        if kind == "include":
            missing = [a for a in AXES if a not in rule or isinstance(rule[a], list)]
            if missing:
                raise ConfigError(
                    f"an include names one value for every axis; missing or a list: {', '.join(missing)}",
                    f.path,
                    f.line_of(kind, None, i),
                    kind,
                )
    return rules


def _matches(rule: dict[str, Any], point: dict[str, str]) -> bool:
    return all(point[axis] in as_list(v) for axis, v in rule.items())


def _make_cell(p: dict[str, str], axes: Axes, backend: str, timeout: float, repeats: int, seed: int) -> Cell | None:
    """A cell, or None when the combination means nothing anywhere (a ROCm profile on a CUDA target,
    an image that does not carry the target). Host-dependent skips are decided later (applicability)."""
    target, profile = axes.targets[p["target"]], axes.profiles[p["profile"]]
    workload = axes.workloads.get(p["shapes"], Workload())
    if not profile.applies_to(target):
        return None
    image = p["image"]
    if backend == "local":
        image = LOCAL_IMAGE
    elif image == LOCAL_IMAGE or p["target"] not in axes.images[image].targets:
        return None
    return Cell(
        image=image,
        target=target.name,
        profile=profile.name,
        placement=p["placement"],
        dtype=p["dtype"],
        shapes=p["shapes"],
        tier=p["tier"],
        platform=target.platform,
        arch=target.arch,
        env=profile.env_for(target.name),
        shape_list=axes.shapes[p["shapes"]],
        workload=workload.name,
        params=workload.params,
        params_where=_where(workload),
        tier_scope=axes.tiers[p["tier"]].scope,
        timeout_s=timeout,
        repeats=repeats,
        seed=seed,
    )


def _where(workload: Workload) -> str:
    """FILE:LINE of a shape set's params (FILE alone when the line is unknown; "" for a default set)."""
    if workload.where is None:
        return ""
    path, line = workload.where
    return f"{path}:{line}" if line else str(path)


def check_workload_params(axes: Axes, offered: dict[str, list[str]] | None) -> None:
    """Every shape set's params against what its workload takes (the device probe's `workloads`: name -> the
    parameter names): a key the workload does not take is a configuration error at its file and line. A
    workload the image does not offer is not an error here: its cells are skipped with that reason."""
    if offered is None:
        return
    for name, w in axes.workloads.items():
        takes = offered.get(w.name)
        if takes is None:
            continue
        for key in sorted(set(w.params) - set(takes)):
            path, line = w.where or (None, None)
            known = ", ".join(takes) or "none"
            raise ConfigError(
                f"workload {w.name!r} takes no parameter {key!r} (it takes: {known})",
                path,
                line,
                f"shapes.{name}.params",
            )
