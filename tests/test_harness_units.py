"""Fast, pure unit tests of the rlparity harness: matrix expansion and validation, filtering, applicability,
KFD die pairs, cell env and judging, results, the gate, the junit merge and `rlparity compare`.

No cell subprocesses run here. Expectations are computed from the TOML data in the tests themselves, not
by calling the code under test.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
import types
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import tomllib
import torch
from junitparser import JUnitXml, TestSuite

from rlparity import backend, collect, compare, gate, golden, inventory, results
from rlparity.applicability import FAST_TIER_MISSING, devices_for, skip_reason
from rlparity.config import ConfigError
from rlparity.inventory import Device, Inventory
from rlparity.matrix import Cell, load_matrix, parse_filter, resolve_matrix_path, select
from rlparity.results import CellResult

ROOT = Path(__file__).resolve().parents[1]
MATRICES = ROOT / "harness" / "matrices"
IMAGES_TOML = ROOT / "docker" / "images.toml"
AXIS_ORDER = ("image", "target", "profile", "placement", "dtype", "shapes", "tier")


# ---- helpers ----------------------------------------------------------------------------------------
def _toml(path: Path) -> dict:
    return tomllib.loads(path.read_text())


def _as_list(v) -> list:
    return v if isinstance(v, list) else [v]


def _rule_hits(rule: dict, point: dict) -> bool:
    return all(point[k] in _as_list(v) for k, v in rule.items())


def expected_cells(matrix_file: Path, backend_name: str) -> dict[str, bool]:
    """{cell id: required} computed straight from the TOML files: (product - excludes) + includes, minus
    profile/target pairings that do not apply; the local backend collapses images, docker drops targets an
    image does not carry."""
    m, ax, im = _toml(matrix_file), _toml(MATRICES / "axes.toml"), _toml(IMAGES_TOML)
    axes = m["axes"]
    product = [dict(zip(AXIS_ORDER, combo, strict=True)) for combo in itertools.product(*(axes[a] for a in AXIS_ORDER))]
    points = [p for p in product if not any(_rule_hits(r, p) for r in m.get("exclude", []))]
    points += list(m.get("include", []))
    out: dict[str, bool] = {}
    for p in points:
        target, profile = ax["targets"][p["target"]], ax["profiles"][p["profile"]]
        if target["platform"] not in profile["platforms"]:
            continue
        if profile.get("targets") and p["target"] not in profile["targets"]:
            continue
        if backend_name == "local":
            image = "local"
        else:
            if p["target"] not in im["images"][p["image"]]["targets"]:
                continue
            image = p["image"]
        cid = "/".join([image, *(p[a] for a in AXIS_ORDER[1:])])
        required = not any(_rule_hits(r, p) for r in m.get("informational", []))
        out.setdefault(cid, required)
    return out


_PLATFORM = {"cpu": ("cpu", ""), "sm90": ("cuda", "sm_90")}


def make_cell(
    target: str = "cpu",
    profile: str = "baseline",
    placement: str = "single",
    dtype: str = "fp32",
    tier: str = "exact",
    required: bool = True,
    image: str = "local",
    shapes: str = "quick",
    env: dict[str, str] | None = None,
) -> Cell:
    platform, arch = _PLATFORM.get(target, ("rocm", target))
    return Cell(
        image=image,
        target=target,
        profile=profile,
        placement=placement,
        dtype=dtype,
        shapes=shapes,
        tier=tier,
        required=required,
        platform=platform,
        arch=arch,
        env=dict(env or {}),
        shape_list=((1, 128, 4096),),
        timeout_s=240.0,
    )


def cmp(name, equal, count=0, max_abs=0.0, max_ulp=0, first_index=None, informational=False) -> dict:
    return {
        "test": "test_x",
        "name": name,
        "equal": equal,
        "informational": informational,
        "digest_a": "a",
        "digest_b": "b",
        "count": count,
        "total": 10,
        "max_abs": max_abs,
        "max_ulp": max_ulp,
        "first_index": first_index,
    }


def result(cell: Cell, status: str = "passed", digests: dict[str, str] | None = None, **kw) -> CellResult:
    return CellResult(cell, status, kw.pop("reason", ""), digests=dict(digests or {}), **kw)


# ---- 1. matrix expansion of the shipped files ---------------------------------------------------------
@pytest.mark.parametrize("name", ["quick", "nightly"])
@pytest.mark.parametrize("backend_name", ["local", "docker"])
def test_shipped_matrix_expands_to_the_expected_cells(name, backend_name):
    matrix = load_matrix(name, backend=backend_name)
    want = expected_cells(MATRICES / f"{name}.toml", backend_name)
    ids = [c.id for c in matrix.cells]
    assert len(ids) == len(set(ids)), "cell ids must be unique"
    assert len(ids) == len(want)
    assert set(ids) == set(want)
    assert {c.id: c.required for c in matrix.cells} == want


def test_quick_local_count_by_hand():
    # 22 applicable (target, profile) pairs x 2 dtypes on `single`, cpu's 2 profiles x 2 dtypes on `split`,
    # plus the fp16 include; gfx1201 (4 profiles x 2 dtypes) informational.
    cells = load_matrix("quick").cells
    assert len(cells) == 22 * 2 + 2 * 2 + 1
    assert sum(not c.required for c in cells) == 8
    assert {c.target for c in cells if not c.required} == {"gfx1201"}
    assert all(c.image == "local" for c in cells)
    assert {c.placement for c in cells if c.target != "cpu"} == {"single"}
    assert [c for c in cells if c.dtype == "fp16"] == [c for c in cells if c.id.endswith("/fp16/quick/exact")]
    assert len([c for c in cells if c.dtype == "fp16"]) == 1


def test_cells_carry_matrix_settings_and_profile_env():
    quick = {c.id: c for c in load_matrix("quick").cells}
    c = quick["local/gfx1201/gfx-override/single/bf16/quick/exact"]
    assert c.env == {"HSA_OVERRIDE_GFX_VERSION": "12.0.1"}
    assert (c.platform, c.arch, c.timeout_s, c.repeats) == ("rocm", "gfx1201", 240.0, 3)
    assert c.shape_list == ((1, 128, 4096), (4, 64, 32000))
    assert quick["local/gfx942/sdma-off/single/fp32/quick/exact"].env == {"HSA_ENABLE_SDMA": "0"}
    assert quick["local/cpu/threads-1/split/fp32/quick/exact"].env == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    assert quick["local/sm90/baseline/single/fp32/quick/exact"].arch == "sm_90"
    nightly = load_matrix("nightly").cells
    assert {(c.timeout_s, c.repeats) for c in nightly} == {(1800.0, 5)}


def test_nightly_informational_rules():
    cells = load_matrix("nightly").cells
    assert all(not c.required for c in cells if c.tier == "fast" or c.target == "gfx1201")
    assert all(c.required for c in cells if c.tier == "exact" and c.target != "gfx1201")
    assert not [c for c in cells if c.target == "cpu" and c.placement == "dual-die"]


def test_local_backend_collapses_images():
    local = load_matrix("nightly", backend="local").cells
    assert {c.image for c in local} == {"local"}
    docker = load_matrix("nightly", backend="docker").cells
    # every (target, everything-but-image) point appears once locally, whatever the number of images
    assert {c.id.split("/", 1)[1] for c in local} >= {c.id.split("/", 1)[1] for c in docker}
    assert len(local) == len({c.id.split("/", 1)[1] for c in local})


def test_docker_backend_keeps_images_and_drops_uncarried_targets():
    carried = {name: set(e["targets"]) for name, e in _toml(IMAGES_TOML)["images"].items()}
    cells = load_matrix("nightly", backend="docker").cells
    assert {c.image for c in cells} == {"rocm60-torch22", "rocm64-torch26", "cpu"}
    assert all(c.target in carried[c.image] for c in cells)
    by_image = {img: {c.target for c in cells if c.image == img} for img in carried}
    assert by_image == {
        "rocm60-torch22": {"cpu", "gfx90a"},
        "rocm64-torch26": carried["rocm64-torch26"],
        "cpu": {"cpu"},
    }
    # targets no image carries vanish under docker but stay under local
    assert not {c.target for c in cells} & {"sm90", "gfx908", "gfx950"}
    assert {"sm90", "gfx908", "gfx950"} <= {c.target for c in load_matrix("nightly").cells}


# ---- 2. small matrix files ------------------------------------------------------------------------------
BASE_AXES = {
    "image": '["rocm64-torch26"]',
    "target": '["cpu", "gfx942"]',
    "profile": '["baseline", "threads-1", "sdma-off"]',
    "placement": '["single", "split"]',
    "dtype": '["fp32", "bf16"]',
    "shapes": '["smoke"]',
    "tier": '["exact"]',
}
FULL_INCLUDE = """[[include]]
image = "rocm64-torch26"
target = "cpu"
profile = "baseline"
placement = "dual-die"
dtype = "fp16"
shapes = "llm"
tier = "exact"
"""


def matrix_text(head: str = "", axes: dict[str, str] | None = None, tail: str = "", extra_axes: str = "") -> str:
    lines = ["[matrix]", 'description = "unit test"', "timeout_s = 60", "repeats = 2", head, "", "[axes]"]
    lines += [f"{k} = {v}" for k, v in (axes if axes is not None else BASE_AXES).items()]
    return "\n".join(lines) + "\n" + extra_axes + "\n" + tail


def write(tmp_path: Path, text: str, name: str = "m.toml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def ids_of(path: Path, backend_name: str = "local") -> set[str]:
    return {c.id for c in load_matrix(str(path), backend=backend_name).cells}


def test_small_matrix_product_and_applicability(tmp_path):
    ids = ids_of(write(tmp_path, matrix_text()))
    # cpu: baseline, threads-1; gfx942: baseline, sdma-off; x 2 placements x 2 dtypes
    assert len(ids) == 4 * 2 * 2
    assert "local/cpu/sdma-off/single/fp32/smoke/exact" not in ids
    assert "local/gfx942/threads-1/single/fp32/smoke/exact" not in ids
    m = load_matrix(str(write(tmp_path, matrix_text()))).cells
    assert {(c.timeout_s, c.repeats, c.seed) for c in m} == {(60.0, 2, 0)}


def test_include_rule_adds_one_cell(tmp_path):
    path = write(tmp_path, matrix_text(tail=FULL_INCLUDE))
    ids = ids_of(path)
    assert len(ids) == 16 + 1
    assert "local/cpu/baseline/dual-die/fp16/llm/exact" in ids
    cell = next(c for c in load_matrix(str(path)).cells if c.dtype == "fp16")
    assert cell.shape_list == ((1, 128, 151936), (4, 256, 128256), (16, 64, 50257))
    assert cell.required


def test_include_of_an_existing_point_is_not_duplicated(tmp_path):
    inc = FULL_INCLUDE.replace('"dual-die"', '"single"').replace('"fp16"', '"fp32"').replace('"llm"', '"smoke"')
    assert len(ids_of(write(tmp_path, matrix_text(tail=inc)))) == 16


def test_include_of_a_pairing_that_does_not_apply_is_dropped(tmp_path):
    inc = FULL_INCLUDE.replace('profile = "baseline"', 'profile = "sdma-off"')  # a ROCm profile on cpu
    assert len(ids_of(write(tmp_path, matrix_text(tail=inc)))) == 16


def test_exclude_rule_with_lists(tmp_path):
    tail = '[[exclude]]\nplacement = "split"\ntarget = ["gfx942"]\n\n[[exclude]]\nprofile = ["threads-1", "sdma-off"]\n'
    ids = ids_of(write(tmp_path, matrix_text(tail=tail)))
    assert ids == {
        "local/cpu/baseline/single/fp32/smoke/exact",
        "local/cpu/baseline/single/bf16/smoke/exact",
        "local/cpu/baseline/split/fp32/smoke/exact",
        "local/cpu/baseline/split/bf16/smoke/exact",
        "local/gfx942/baseline/single/fp32/smoke/exact",
        "local/gfx942/baseline/single/bf16/smoke/exact",
    }


def test_exclude_needs_every_key_to_match(tmp_path):
    tail = '[[exclude]]\nplacement = "split"\ndtype = "bf16"\n'
    ids = ids_of(write(tmp_path, matrix_text(tail=tail)))
    assert len(ids) == 16 - 4
    assert not [i for i in ids if "/split/bf16/" in i]
    assert len([i for i in ids if "/split/fp32/" in i]) == 4


def test_informational_rules_mark_cells_not_required(tmp_path):
    tail = '[[informational]]\ntarget = "gfx942"\ndtype = ["bf16"]\n\n[[informational]]\nprofile = "threads-1"\n'
    cells = load_matrix(str(write(tmp_path, matrix_text(tail=tail)))).cells
    optional = {c.id for c in cells if not c.required}
    assert len(cells) == 16
    assert optional == {c.id for c in cells if (c.target == "gfx942" and c.dtype == "bf16") or c.profile == "threads-1"}
    assert len(optional) == 4 + 4


def test_include_is_not_removed_by_an_exclude(tmp_path):
    tail = FULL_INCLUDE + '\n[[exclude]]\nplacement = "dual-die"\n'
    assert "local/cpu/baseline/dual-die/fp16/llm/exact" in ids_of(write(tmp_path, matrix_text(tail=tail)))


def test_local_collapse_required_does_not_depend_on_image_order(tmp_path):
    tail = '[[informational]]\nimage = "rocm60-torch22"\n'
    required = []
    for order in ('["rocm60-torch22", "rocm64-torch26"]', '["rocm64-torch26", "rocm60-torch22"]'):
        axes = {**BASE_AXES, "image": order, "target": '["cpu"]', "profile": '["baseline"]'}
        axes.update(placement='["single"]', dtype='["fp32"]')
        cells = load_matrix(str(write(tmp_path, matrix_text(axes=axes, tail=tail)))).cells
        assert len(cells) == 1
        required.append(cells[0].required)
    assert required[0] == required[1]


def test_docker_backend_on_a_small_file(tmp_path):
    axes = {**BASE_AXES, "image": '["rocm60-torch22", "rocm64-torch26"]'}
    ids = ids_of(write(tmp_path, matrix_text(axes=axes)), "docker")
    # rocm60 does not carry gfx942: 8 cpu cells per image, 8 gfx942 cells for rocm64 only
    assert len(ids) == 8 + 8 + 8
    assert not [i for i in ids if i.startswith("rocm60-torch22/gfx942/")]


# ---- 3. malformed matrix files ------------------------------------------------------------------------
def line_no(text: str, needle: str, occurrence: int = 0) -> int:
    hits = [n for n, ln in enumerate(text.splitlines(), 1) if needle in ln]
    return hits[occurrence]


def config_error(path: Path) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_matrix(str(path))
    return info.value


def assert_names(err: ConfigError, path: Path, line: int, key: str) -> None:
    text = str(err)
    assert f"{path}:{line}:" in text, text
    assert key in text, text
    assert err.line == line


def test_toml_syntax_error(tmp_path):
    text = matrix_text(axes={**BASE_AXES, "placement": '= ["single"]'})
    path = write(tmp_path, text)
    err = config_error(path)
    assert_names(err, path, line_no(text, "placement = ="), "not valid TOML")


def test_unknown_top_level_key(tmp_path):
    text = "bogus = 1\n" + matrix_text()
    path = write(tmp_path, text)
    assert_names(config_error(path), path, 1, "bogus")


def test_unknown_top_level_table_has_its_line(tmp_path):
    text = matrix_text(tail="[matrx]\nrepeats = 3\n")
    path = write(tmp_path, text)
    assert_names(config_error(path), path, line_no(text, "[matrx]"), "matrx")


def test_unknown_key_under_axes(tmp_path):
    text = matrix_text(extra_axes='colour = ["red"]\n')
    path = write(tmp_path, text)
    err = config_error(path)
    assert_names(err, path, line_no(text, "colour ="), "axes.colour")
    assert "unknown key" in str(err)


def test_unknown_axis_value(tmp_path):
    text = matrix_text(axes={**BASE_AXES, "target": '["cpu", "gfx999"]'})
    path = write(tmp_path, text)
    err = config_error(path)
    assert_names(err, path, line_no(text, "target ="), "axes.target")
    assert "gfx999" in str(err) and "gfx942" in str(err)  # names the bad value and lists the known ones


def test_axis_value_not_a_string(tmp_path):
    text = matrix_text(axes={**BASE_AXES, "dtype": '["fp32", 16]'})
    path = write(tmp_path, text)
    err = config_error(path)
    assert_names(err, path, line_no(text, "dtype ="), "axes.dtype")
    assert "16" in str(err)


def test_axis_not_a_list(tmp_path):
    text = matrix_text(axes={**BASE_AXES, "dtype": '"fp32"'})
    path = write(tmp_path, text)
    assert_names(config_error(path), path, line_no(text, "dtype ="), "axes.dtype")


def test_missing_axis(tmp_path):
    axes = {k: v for k, v in BASE_AXES.items() if k != "tier"}
    text = matrix_text(axes=axes)
    path = write(tmp_path, text)
    err = config_error(path)
    assert_names(err, path, line_no(text, "[axes]"), "'tier'")


def test_missing_axes_table(tmp_path):
    path = write(tmp_path, '[matrix]\ndescription = "x"\n')
    err = config_error(path)
    assert str(path) in str(err) and "axes" in str(err)


def test_empty_axis_list(tmp_path):
    text = matrix_text(axes={**BASE_AXES, "shapes": "[]"})
    path = write(tmp_path, text)
    err = config_error(path)
    assert_names(err, path, line_no(text, "shapes ="), "axes.shapes")
    assert "at least one" in str(err)


def test_unknown_key_in_second_exclude_rule(tmp_path):
    tail = '[[exclude]]\ntarget = "cpu"\ndtype = "bf16"\n\n[[exclude]]\ntarget = "gfx942"\ndtypes = "bf16"\n'
    text = matrix_text(tail=tail)
    path = write(tmp_path, text)
    assert_names(config_error(path), path, line_no(text, "dtypes ="), "exclude.dtypes")


def test_unknown_value_in_second_exclude_rule_points_at_that_rule(tmp_path):
    tail = '[[exclude]]\ntarget = "cpu"\n\n[[exclude]]\ntarget = ["gfx942", "gfx999"]\n'
    text = matrix_text(tail=tail)
    path = write(tmp_path, text)
    err = config_error(path)
    assert_names(err, path, line_no(text, 'target = ["gfx942", "gfx999"]'), "exclude.target")
    assert line_no(text, 'target = "cpu"') != err.line


def test_empty_rule_is_an_error(tmp_path):
    text = matrix_text(tail='[[exclude]]\ntarget = "cpu"\n\n[[exclude]]\n')
    path = write(tmp_path, text)
    err = config_error(path)
    assert_names(err, path, line_no(text, "[[exclude]]", 1), "exclude")
    assert "every cell" in str(err)


def test_unknown_key_in_informational_rule(tmp_path):
    text = matrix_text(tail='[[informational]]\narch = "gfx942"\n')
    path = write(tmp_path, text)
    assert_names(config_error(path), path, line_no(text, "arch ="), "informational.arch")


def test_include_missing_an_axis(tmp_path):
    second = "\n".join(ln for ln in FULL_INCLUDE.splitlines() if not ln.startswith("shapes"))
    text = matrix_text(tail=FULL_INCLUDE + "\n" + second + "\n")
    path = write(tmp_path, text)
    err = config_error(path)
    assert_names(err, path, line_no(text, "[[include]]", 1), "include")
    assert "shapes" in str(err)


def test_include_with_a_list_is_an_error(tmp_path):
    text = matrix_text(tail=FULL_INCLUDE.replace('dtype = "fp16"', 'dtype = ["fp16", "bf16"]'))
    path = write(tmp_path, text)
    err = config_error(path)
    assert_names(err, path, line_no(text, "[[include]]"), "include")
    assert "dtype" in str(err)


def test_bad_timeout_type(tmp_path):
    text = matrix_text().replace("timeout_s = 60", 'timeout_s = "60"')
    path = write(tmp_path, text)
    err = config_error(path)
    assert_names(err, path, line_no(text, "timeout_s ="), "matrix.timeout_s")
    assert "int or float" in str(err)


def test_repeats_below_two(tmp_path):
    text = matrix_text().replace("repeats = 2", "repeats = 1")
    path = write(tmp_path, text)
    err = config_error(path)
    assert_names(err, path, line_no(text, "[matrix]"), "matrix")
    assert "repeats" in str(err)


def test_unknown_key_under_matrix(tmp_path):
    text = matrix_text(head="retries = 3")
    path = write(tmp_path, text)
    assert_names(config_error(path), path, line_no(text, "retries ="), "matrix.retries")


def test_bool_timeout_is_rejected(tmp_path):
    text = matrix_text().replace("timeout_s = 60", "timeout_s = true")
    path = write(tmp_path, text)
    assert_names(config_error(path), path, line_no(text, "timeout_s ="), "matrix.timeout_s")


def test_nan_timeout_is_rejected(tmp_path):
    path = write(tmp_path, matrix_text().replace("timeout_s = 60", "timeout_s = nan"))
    assert "timeout_s" in str(config_error(path))


def test_unknown_matrix_name_lists_known_names():
    with pytest.raises(ConfigError) as info:
        resolve_matrix_path("no-such-matrix")
    text = str(info.value)
    assert "no-such-matrix" in text and "nightly" in text and "quick" in text
    assert "axes" not in text.split("known:")[1]


def test_matrix_path_that_does_not_exist(tmp_path):
    missing = tmp_path / "gone.toml"
    with pytest.raises(ConfigError, match="does not exist") as info:
        resolve_matrix_path(str(missing))
    assert str(missing) in str(info.value)


def test_resolve_by_name_and_by_path(tmp_path):
    assert resolve_matrix_path("quick") == MATRICES / "quick.toml"
    p = write(tmp_path, matrix_text())
    assert resolve_matrix_path(str(p)) == p


# ---- 4. filtering ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def quick_cells() -> tuple[Cell, ...]:
    return load_matrix("quick").cells


def test_filter_empty_keeps_everything(quick_cells):
    assert select(quick_cells, None) == list(quick_cells)
    assert select(quick_cells, "") == list(quick_cells)


def test_filter_key_value(quick_cells):
    got = select(quick_cells, "target=cpu")
    assert got and all(c.target == "cpu" for c in got)
    assert len(got) == len([c for c in quick_cells if c.target == "cpu"]) == 9


def test_filter_alternatives(quick_cells):
    got = select(quick_cells, "target=cpu|sm90")
    assert {c.target for c in got} == {"cpu", "sm90"}
    assert len(got) == 9 + 6


def test_filter_glob(quick_cells):
    got = select(quick_cells, "target=gfx9*")
    assert {c.target for c in got} == {"gfx90a", "gfx942", "gfx950"}
    assert {c.profile for c in select(quick_cells, "profile=*-o*")} == {"sdma-off", "tunableop-on", "gfx-override"}


def test_filter_negation(quick_cells):
    got = select(quick_cells, "target!=cpu")
    assert got and "cpu" not in {c.target for c in got}
    assert len(got) == len(quick_cells) - 9
    assert {c.target for c in select(quick_cells, "target!=gfx*|cpu")} == {"sm90"}


def test_filter_bare_glob_matches_the_id(quick_cells):
    got = select(quick_cells, "local/cpu/*/split/*")
    assert {c.id for c in got} == {c.id for c in quick_cells if c.target == "cpu" and c.placement == "split"}
    assert len(got) == 4
    assert select(quick_cells, "*/fp16/*") == [c for c in quick_cells if c.dtype == "fp16"]


def test_filter_required(quick_cells):
    optional = select(quick_cells, "required=false")
    assert {c.target for c in optional} == {"gfx1201"} and len(optional) == 8
    assert len(select(quick_cells, "required=true")) == len(quick_cells) - 8
    assert select(quick_cells, "required!=true") == optional


def test_filter_and_of_terms(quick_cells):
    for expr in ("target=cpu dtype=bf16 placement!=split", "target=cpu,dtype=bf16,placement!=split"):
        got = select(quick_cells, expr)
        assert [c.id for c in got] == [
            "local/cpu/baseline/single/bf16/quick/exact",
            "local/cpu/threads-1/single/bf16/quick/exact",
        ]


def test_filter_that_matches_nothing(quick_cells):
    assert select(quick_cells, "target=cpu placement=dual-die") == []


def test_parse_filter_terms():
    assert parse_filter("target=cpu|gfx9* tier!=fast cpu/*") == [
        ("target", False, ["cpu", "gfx9*"]),
        ("tier", True, ["fast"]),
        ("id", False, ["cpu/*"]),
    ]


@pytest.mark.parametrize("expr", ["colour=red", "arch!=gfx942", "=cpu"])
def test_filter_unknown_axis(quick_cells, expr):
    with pytest.raises(ConfigError, match="unknown axis"):
        select(quick_cells, expr)


@pytest.mark.parametrize("expr", ["target=", "dtype!="])
def test_filter_empty_value(quick_cells, expr):
    with pytest.raises(ConfigError, match="empty value"):
        select(quick_cells, expr)


# ---- 5. applicability --------------------------------------------------------------------------------------
MI300X = Device(0, "rocm", "AMD Instinct MI300X", "gfx942", 64)
MI210 = Device(0, "rocm", "AMD Instinct MI210", "gfx90a", 64)


def mi250x_host(gpu: bool = True) -> Inventory:
    devs = tuple(Device(i, "rocm", "AMD Instinct MI250X", "gfx90a", 64) for i in range(4))
    return Inventory(devs, ((0, 1), (2, 3)), gpu)


def test_cpu_cell_runs_without_gpu():
    cell = make_cell("cpu")
    assert skip_reason(cell, Inventory()) is None
    assert devices_for(cell, Inventory()) == [[]]
    # a failed device probe does not stop a CPU cell
    assert skip_reason(cell, Inventory(error="RuntimeError: boom")) is None


def test_gpu_cell_on_a_host_without_gpu():
    reason = skip_reason(make_cell("gfx942"), Inventory())
    assert reason and "gfx942" in reason and "no GPU" in reason


def test_gfx942_cell_on_mi300x_runs():
    inv = Inventory((MI300X,), (), True)
    cell = make_cell("gfx942")
    assert skip_reason(cell, inv) is None
    assert devices_for(cell, inv) == [[0]]


def test_arch_mismatch_is_skipped():
    inv = Inventory((MI210,), (), True)
    reason = skip_reason(make_cell("gfx942"), inv)
    assert reason and "gfx942" in reason and "MI210" in reason and "gfx90a" in reason
    assert devices_for(make_cell("gfx942"), inv) == []


def test_cuda_target_needs_a_cuda_device():
    h200 = Device(0, "cuda", "NVIDIA H200", "sm_90", 32)
    assert skip_reason(make_cell("sm90"), Inventory((h200,), (), True)) is None
    assert "sm_90" in skip_reason(make_cell("sm90"), Inventory((MI300X,), (), True))


def test_dual_die_on_cpu_is_skipped():
    reason = skip_reason(make_cell("cpu", placement="dual-die"), Inventory())
    assert reason and "dual-die" in reason


def test_dual_die_with_a_die_pair_runs():
    cell = make_cell("gfx90a", placement="dual-die")
    inv = mi250x_host()
    assert skip_reason(cell, inv) is None
    assert devices_for(cell, inv) == [[0, 1], [2, 3]]


def test_dual_die_without_a_pair_is_skipped():
    inv = Inventory((MI210, Device(1, "rocm", "AMD Instinct MI210", "gfx90a", 64)), (), True)
    reason = skip_reason(make_cell("gfx90a", placement="dual-die"), inv)
    assert reason and "dual-die" in reason and "gfx90a" in reason


def test_dual_die_pair_of_another_arch_does_not_count():
    devs = (
        Device(0, "rocm", "MI250X", "gfx90a", 64),
        Device(1, "rocm", "MI250X", "gfx90a", 64),
        dataclasses.replace(MI300X, index=2),
    )
    inv = Inventory(devs, ((0, 1),), True)
    assert skip_reason(make_cell("gfx942", placement="dual-die"), inv) is not None


def test_split_needs_two_devices():
    cell = make_cell("gfx942", placement="split")
    one = Inventory((MI300X,), (), True)
    reason = skip_reason(cell, one)
    assert reason and "two" in reason and "has 1" in reason
    four = Inventory(tuple(Device(i, "rocm", "MI300X", "gfx942", 64) for i in range(4)), (), True)
    assert skip_reason(cell, four) is None
    assert devices_for(cell, four) == [[0, 1], [2, 3]]


def test_fast_tier_is_skipped_everywhere():
    assert skip_reason(make_cell("cpu", tier="fast"), Inventory()) == FAST_TIER_MISSING
    assert skip_reason(make_cell("gfx942", tier="fast"), Inventory((MI300X,), (), True)) == FAST_TIER_MISSING


def test_build_without_gpu_kernels_is_skipped():
    reason = skip_reason(make_cell("gfx942"), Inventory((MI300X,), (), False))
    assert reason and "no GPU kernels" in reason


def test_inventory_error_skips_gpu_cells_with_the_error():
    reason = skip_reason(make_cell("gfx942"), Inventory(error="RuntimeError: HIP error: no ROCm-capable device"))
    assert reason and "RuntimeError: HIP error: no ROCm-capable device" in reason


def test_inventory_round_trips_through_a_dict():
    inv = mi250x_host()
    back = Inventory.from_dict(json.loads(json.dumps(inv.to_dict())))
    assert back == inv
    assert inventory.normalise_arch("gfx942:sramecc+:xnack-") == "gfx942"


# ---- 6. KFD die pairs -------------------------------------------------------------------------------------
def kfd_node(node: int, links: dict[int, tuple[int, int]]) -> dict:
    return {"node": node, "location_id": 0x100 * node, "links": links}


def mi250x_nodes(first: int = 2, packages: tuple[tuple[int, int], ...] = ((0, 1), (2, 3), (4, 5), (6, 7))) -> list:
    """8 GCDs (KFD nodes first..first+7): in-package xGMI weight 15, cross-package 30 or 45, PCIe to CPU 0."""
    package_of = {gcd: p for p, pair in enumerate(packages) for gcd in pair}
    nodes = []
    for i in range(8):
        links = {0: (2, 10)}  # PCIe (type 2) to the CPU, lighter than any xGMI: must be ignored
        for j in range(8):
            if j != i:
                same = package_of[i] == package_of[j]
                links[first + j] = (11, 15 if same else 30 + 15 * (abs(package_of[i] - package_of[j]) % 2))
        nodes.append(kfd_node(first + i, links))
    return nodes


def test_die_pairs_mi250x():
    assert inventory.die_pairs(mi250x_nodes()) == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_die_pairs_follow_links_not_indices():
    assert inventory.die_pairs(mi250x_nodes(packages=((0, 2), (1, 3), (4, 7), (5, 6)))) == [
        (0, 2),
        (1, 3),
        (4, 7),
        (5, 6),
    ]


def test_die_pairs_pcie_only_radeon():
    # PCIe (type 2) links to the CPU and between the two cards: no xGMI, so no pairs
    nodes = [kfd_node(1, {0: (2, 20), 2: (2, 40)}), kfd_node(2, {0: (2, 20), 1: (2, 40)})]
    assert inventory.die_pairs(nodes) == []
    assert inventory.die_pairs([]) == []


def test_die_pairs_ignore_links_to_nodes_that_are_not_gpus():
    nodes = [kfd_node(1, {7: (11, 15)}), kfd_node(2, {})]
    assert inventory.die_pairs(nodes) == []


def test_die_pairs_equal_weight_hive_has_no_pairs():
    nodes = [kfd_node(2 + i, {2 + j: (11, 15) for j in range(8) if j != i}) for i in range(8)]
    assert inventory.die_pairs(nodes) == []


def fake_kfd(root: Path, cpus: list[int], gpus: dict[int, dict[int, tuple[int, int]]]) -> Path:
    nodes = root / "nodes"
    for n in cpus:
        (nodes / str(n) / "io_links").mkdir(parents=True)
        (nodes / str(n) / "properties").write_text(f"cpu_cores_count 16\nsimd_count 0\nlocation_id 0\nnode_id {n}\n")
    for n, links in gpus.items():
        d = nodes / str(n)
        (d / "io_links").mkdir(parents=True)
        (d / "properties").write_text(
            f"cpu_cores_count 0\nsimd_count 440\nlocation_id {0x1000 + n}\nmax_engine_clk_fcompute 1700\n"
        )
        for k, (to, (kind, weight)) in enumerate(sorted(links.items())):
            (d / "io_links" / str(k)).mkdir()
            (d / "io_links" / str(k) / "properties").write_text(
                f"type {kind}\nversion_major 0\nnode_from {n}\nnode_to {to}\nweight {weight}\nmin_latency 0\n"
            )
    return nodes


def test_read_kfd_topology_fake_sysfs(tmp_path):
    # node 0: CPU; nodes 1..4: two packages of two GCDs
    gpus = {
        1: {0: (2, 20), 2: (11, 15), 3: (11, 30), 4: (11, 30)},
        2: {0: (2, 20), 1: (11, 15), 3: (11, 30), 4: (11, 30)},
        3: {0: (2, 20), 4: (11, 15), 1: (11, 30), 2: (11, 30)},
        4: {0: (2, 20), 3: (11, 15), 1: (11, 30), 2: (11, 30)},
    }
    root = fake_kfd(tmp_path, [0], gpus)
    nodes = inventory.read_kfd_topology(root)
    assert [n["node"] for n in nodes] == [1, 2, 3, 4]
    assert nodes[0]["location_id"] == 0x1001
    assert nodes[0]["links"] == {0: (2, 20), 2: (11, 15), 3: (11, 30), 4: (11, 30)}
    assert inventory.die_pairs(nodes) == [(0, 1), (2, 3)]


def test_read_kfd_topology_orders_nodes_numerically(tmp_path):
    # two CPU nodes then ten GCDs (nodes 2..11): lexical order would put 10 and 11 before 2
    gpus = {2 + i: {2 + j: (11, 15 if i // 2 == j // 2 else 40) for j in range(10) if j != i} for i in range(10)}
    nodes = inventory.read_kfd_topology(fake_kfd(tmp_path, [0, 1], gpus))
    assert [n["node"] for n in nodes] == list(range(2, 12))
    assert inventory.die_pairs(nodes) == [(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)]


def test_read_kfd_topology_missing_root(tmp_path):
    assert inventory.read_kfd_topology(tmp_path / "nope") == []


def test_probe_maps_die_pairs_through_visible_devices(monkeypatch):
    # host: 2 MI250X = GCDs 0..3, pairs (0,1), (2,3); this job may see GCDs 1 and 2 (different packages)
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "1,2")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    props = types.SimpleNamespace(name="AMD Instinct MI250X", gcnArchName="gfx90a:sramecc+:xnack-", warp_size=64)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    monkeypatch.setattr(torch.version, "hip", "6.4.0", raising=False)
    four = [
        kfd_node(1 + i, {1 + j: (11, 15 if i // 2 == j // 2 else 30) for j in range(4) if j != i}) for i in range(4)
    ]
    monkeypatch.setattr(inventory, "read_kfd_topology", lambda root=None: four)
    inv = inventory.probe()
    assert [d.arch for d in inv.devices] == ["gfx90a", "gfx90a"]
    assert inv.die_pairs == ()


# ---- 7. cell env, visible devices, judge ------------------------------------------------------------------
CALLER = {
    "PATH": "/usr/local/bin:/usr/bin",
    "HOME": "/root",
    "HSA_ENABLE_SDMA": "0",
    "OMP_NUM_THREADS": "7",
    "MIOPEN_FIND_MODE": "FAST",
    "PYTORCH_TUNABLEOP_ENABLED": "1",
    "ROCBLAS_LAYER": "2",
    "RL_KERNEL_BUILD": "cpu",
    "ROCM_PATH": "/opt/rocm",
    "HIP_VISIBLE_DEVICES": "2,3",
    "CUDA_VISIBLE_DEVICES": "4,5,6",
}


def test_cell_env_baseline_drops_numerics_vars():
    env = backend.cell_env(make_cell("gfx942"), [1], CALLER)
    for var in ("HSA_ENABLE_SDMA", "OMP_NUM_THREADS", "MIOPEN_FIND_MODE", "PYTORCH_TUNABLEOP_ENABLED", "ROCBLAS_LAYER"):
        assert var not in env, var
    assert "RL_KERNEL_BUILD" not in env
    assert env["PATH"] == CALLER["PATH"] and env["HOME"] == "/root" and env["ROCM_PATH"] == "/opt/rocm"
    assert env["HIP_VISIBLE_DEVICES"] == "3"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["RLPARITY_VARIANT"] == "none" and env["PYTHONUNBUFFERED"] == "1"


def test_cell_env_applies_the_profile():
    sdma = make_cell("gfx942", "sdma-off", env={"HSA_ENABLE_SDMA": "0"})
    env = backend.cell_env(sdma, [0], {**CALLER, "HSA_ENABLE_SDMA": "1"})
    assert env["HSA_ENABLE_SDMA"] == "0"
    assert "MIOPEN_FIND_MODE" not in env and "OMP_NUM_THREADS" not in env
    threads = make_cell("cpu", "threads-1", env={"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    env = backend.cell_env(threads, [], CALLER, variant="no-fixed-order", extra={"RL_KERNEL_LIBRARY": "/x.so"})
    assert (env["OMP_NUM_THREADS"], env["MKL_NUM_THREADS"]) == ("1", "1")
    assert env["RL_KERNEL_LIBRARY"] == "/x.so" and env["RLPARITY_VARIANT"] == "no-fixed-order"
    assert "HSA_ENABLE_SDMA" not in env


def test_cell_env_matches_the_profile_env_from_the_matrix():
    quick = {c.id: c for c in load_matrix("quick").cells}
    cell = quick["local/gfx1100/gfx-override/single/fp32/quick/exact"]
    env = backend.cell_env(cell, [0], {"PATH": "/bin", "HSA_OVERRIDE_GFX_VERSION": "9.4.2"})
    assert env["HSA_OVERRIDE_GFX_VERSION"] == "11.0.0"
    baseline = quick["local/gfx1100/baseline/single/fp32/quick/exact"]
    assert "HSA_OVERRIDE_GFX_VERSION" not in backend.cell_env(baseline, [0], {"HSA_OVERRIDE_GFX_VERSION": "9.4.2"})


def test_cell_env_cuda_visibility():
    env = backend.cell_env(make_cell("sm90"), [2, 0], CALLER)
    assert env["CUDA_VISIBLE_DEVICES"] == "6,4"
    env = backend.cell_env(make_cell("sm90"), [1], {"PATH": "/bin"})
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


def test_visible_devices():
    assert backend.visible_devices("2,3", [1]) == "3"
    assert backend.visible_devices(" 2, 3 ,", [0, 1]) == "2,3"
    assert backend.visible_devices(None, [0, 3]) == "0,3"
    assert backend.visible_devices("", [1]) == "1"
    with pytest.raises(ValueError, match="device index 2"):
        backend.visible_devices("2,3", [2])
    with pytest.raises(ValueError):
        backend.cell_env(make_cell("gfx942"), [5], CALLER)


def write_log(out: Path, text: str = "line 1\nTraceback: boom\n") -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / results.LOG_FILE).write_text(text)


def test_judge_no_result_file(tmp_path):
    write_log(tmp_path)
    res = backend.judge(make_cell(), tmp_path, 0, 3.0, "t0", 240.0)
    assert res.status == "error"
    assert "result.json" in res.reason and "exited with code 0" in res.reason
    assert "Traceback: boom" in res.output_tail


def test_judge_keeps_wall_time_when_result_is_missing(tmp_path):
    write_log(tmp_path)
    assert backend.judge(make_cell(), tmp_path, 0, 3.0, "t0", 240.0).timings["wall_s"] == 3.0
    results.write(result(make_cell(), "passed"), tmp_path)
    assert backend.judge(make_cell(), tmp_path, 1, 3.0, "t0", 240.0).timings["wall_s"] == 3.0


def test_judge_timeout(tmp_path):
    write_log(tmp_path, "still running\n")
    res = backend.judge(make_cell(), tmp_path, None, 240.2, "t0", 240.0)
    assert res.status == "error"
    assert "timed out after 240 s" in res.reason
    assert res.output_tail == "still running\n"
    assert res.timings["wall_s"] == 240.2


def test_judge_signal(tmp_path):
    write_log(tmp_path)
    results.write(result(make_cell()), tmp_path)
    res = backend.judge(make_cell(), tmp_path, -11, 1.0, "t0", 240.0)
    assert res.status == "error"
    assert "SIGSEGV" in res.reason and "after writing its results" in res.reason


def test_judge_unexpected_exit_code(tmp_path):
    write_log(tmp_path)
    res = backend.judge(make_cell(), tmp_path, 139, 1.0, "t0", 240.0)
    assert res.status == "error" and "exited with code 139" in res.reason


def test_judge_status_disagrees_with_rc(tmp_path):
    write_log(tmp_path)
    results.write(result(make_cell(), "passed"), tmp_path)
    res = backend.judge(make_cell(), tmp_path, 1, 1.0, "t0", 240.0)
    assert res.status == "error"
    assert "exited with code 1" in res.reason and "passed" in res.reason


def test_judge_accepts_a_consistent_result(tmp_path):
    write_log(tmp_path, "log text")
    results.write(result(make_cell(), "failed", reason="bitwise mismatch in x"), tmp_path)
    res = backend.judge(make_cell(), tmp_path, 1, 1.0, "t0", 240.0)
    assert (res.status, res.reason) == ("failed", "bitwise mismatch in x")
    results.write(result(make_cell(), "error", reason="suite crashed"), tmp_path)
    res = backend.judge(make_cell(), tmp_path, 2, 1.0, "t0", 240.0)
    assert (res.status, res.output_tail) == ("error", "log text")  # the log fills an empty tail


def test_judge_unreadable_result(tmp_path):
    write_log(tmp_path)
    (tmp_path / results.RESULT_FILE).write_text("{not json")
    res = backend.judge(make_cell(), tmp_path, 0, 1.0, "t0", 240.0)
    assert res.status == "error" and "unreadable result.json" in res.reason


def test_tail_keeps_the_end(tmp_path):
    write_log(tmp_path, "a" * 100 + "END")
    assert backend.tail(tmp_path / results.LOG_FILE, 10) == "a" * 7 + "END"
    assert backend.tail(tmp_path / "missing.log") == ""


# ---- 8. results ---------------------------------------------------------------------------------------------
COMPARISONS = [
    cmp("1x128x4096 rollout vs training", True),
    cmp("stock log_softmax", False, count=900, max_abs=0.5, max_ulp=99999, first_index=[0, 0], informational=True),
    cmp("1x128x4096 alone vs batch", False, count=3, max_abs=2.5e-7, max_ulp=2, first_index=[0, 17]),
    cmp("1x128x4096 golden grad", False, count=-1),
    cmp("4x64x32000 repeat 1 logprobs", False, count=5, max_abs=1e-6, max_ulp=8, first_index=[3, 1]),
]


def full_result() -> CellResult:
    return CellResult(
        make_cell("gfx942", "sdma-off", env={"HSA_ENABLE_SDMA": "0"}),
        "failed",
        "bitwise mismatch in 1x128x4096 alone vs batch",
        fingerprint={"torch": {"version": "2.13"}, "env": {"HSA_ENABLE_SDMA": "0"}},
        fingerprint_hash="f" * 64,
        digests={"1x128x4096/logprobs": "a" * 64, "1x128x4096/grad": "b" * 64},
        comparisons=[dict(c) for c in COMPARISONS],
        timings={"wall_s": 1.5, "tests": {"test_x": 0.5}},
        output_tail="",
        started="2025-01-01T00:00:00+00:00",
        finished="2025-01-01T00:00:02+00:00",
    )


def test_result_round_trip(tmp_path):
    res = full_result()
    path = results.write(res, tmp_path / "cells" / res.cell.dirname)
    assert path.name == "result.json" and not list(path.parent.glob("*.tmp"))
    back = results.read(path.parent)
    assert back == res
    assert back.cell == res.cell and back.cell.shape_list == ((1, 128, 4096),)
    assert results.read_all(tmp_path) == [res]
    on_disk = json.loads(path.read_text())
    assert on_disk["schema"] == results.SCHEMA and on_disk["required"] is True
    assert on_disk["mismatches"] == 9 and on_disk["max_ulp"] == 8
    assert on_disk["cell"]["id"] == res.cell.id


def test_result_statistics_use_only_gated_comparisons():
    res = full_result()
    assert res.mismatches == 3 + 1 + 5  # a digest comparison (count -1) counts 1; the stock control not at all
    assert res.max_abs == 1e-6
    assert res.max_ulp == 8
    assert res.first_mismatch == {"comparison": "1x128x4096 alone vs batch", "index": [0, 17]}
    assert res.stock_differ == (1, 1)


def test_result_statistics_when_only_informational_differs():
    res = result(make_cell(), comparisons=[cmp("a", True), cmp("stock", False, 10, 3.0, 77, [1], informational=True)])
    assert (res.mismatches, res.max_abs, res.max_ulp, res.first_mismatch) == (0, 0.0, 0, None)


def test_result_infinite_max_abs_round_trips(tmp_path):
    res = result(make_cell(), "failed", comparisons=[cmp("nan row", False, 1, math.inf, 5, [0])])
    results.write(res, tmp_path)
    assert json.loads((tmp_path / "result.json").read_text())["max_abs"] == "inf"
    assert results.read(tmp_path).max_abs == math.inf


def test_invalid_status():
    with pytest.raises(ValueError, match="status"):
        CellResult(make_cell(), "ok")


def test_read_all_names_a_broken_file(tmp_path):
    results.write(result(make_cell()), tmp_path / "cells" / "a")
    (tmp_path / "cells" / "b").mkdir()
    for broken in ("{not json", "{}", '{"cell": {}}'):
        (tmp_path / "cells" / "b" / "result.json").write_text(broken)
        with pytest.raises(ValueError, match=re.escape("cells/b/result.json")):
            results.read_all(tmp_path)


@pytest.mark.parametrize("reader", ["read_all", "judge"])
def test_result_json_that_is_not_an_object(tmp_path, reader):
    out = tmp_path / "cells" / "b"
    write_log(out)
    (out / "result.json").write_text("[]")
    if reader == "read_all":
        with pytest.raises(ValueError, match=re.escape("cells/b/result.json")):
            results.read_all(tmp_path)
    else:
        res = backend.judge(make_cell(), out, 0, 1.0, "t0", 240.0)
        assert res.status == "error" and "unreadable result.json" in res.reason


def test_skipped_and_errored_helpers():
    s = results.skipped(make_cell(), "no GPU")
    assert (s.status, s.reason) == ("skipped", "no GPU") and s.started == s.finished
    e = results.errored(make_cell(), "crashed", "tail", "t0", 2.5)
    assert (e.status, e.output_tail, e.started, e.timings) == ("error", "tail", "t0", {"wall_s": 2.5})


# ---- 9. gate -------------------------------------------------------------------------------------------------
D1, D2 = "1" * 64, "2" * 64


def test_gate_all_passed():
    v = gate.decide([result(make_cell("cpu")), result(make_cell("gfx942"))])
    assert v.code == gate.OK == 0 and v.reasons == ()


def test_gate_required_failed():
    bad = result(make_cell("gfx942"), "failed", reason="bitwise mismatch in x")
    v = gate.decide([result(make_cell()), bad])
    assert v.code == gate.MISMATCH == 1
    assert any(bad.cell.id in r and "bitwise mismatch in x" in r for r in v.reasons)


def test_gate_informational_failure_and_error_do_not_count():
    cells = [result(make_cell())]
    cells.append(result(make_cell("gfx1201", required=False), "failed"))
    cells.append(result(make_cell("gfx1201", dtype="bf16", required=False), "error"))
    assert gate.decide(cells).code == 0
    assert gate.decide(cells, strict=True).code == 0


def test_gate_required_error():
    v = gate.decide([result(make_cell()), result(make_cell("gfx942"), "error", reason="timed out")])
    assert v.code == gate.ERROR == 2
    assert v.reasons == ("local/gfx942/baseline/single/fp32/quick/exact: timed out",)


def test_gate_mismatch_wins_over_error_and_reports_both():
    v = gate.decide(
        [result(make_cell(), "error", reason="crash"), result(make_cell("gfx942"), "failed", reason="bits")]
    )
    assert v.code == 1
    assert len(v.reasons) == 2 and any("crash" in r for r in v.reasons)


def test_gate_skipped_strict_and_not():
    cells = [result(make_cell()), result(make_cell("gfx942"), "skipped", reason="no GPU")]
    assert gate.decide(cells).code == 0
    v = gate.decide(cells, strict=True)
    assert v.code == 2 and "--strict" in v.reasons[0] and "no GPU" in v.reasons[0]
    optional = [result(make_cell("gfx942", required=False), "skipped")]
    assert gate.decide(optional, strict=True).code == 0


def test_digest_disagreement_in_the_exact_tier():
    a = result(make_cell("cpu", "baseline"), digests={"1x128x4096/logprobs": D1})
    b = result(make_cell("cpu", "threads-1"), digests={"1x128x4096/logprobs": D2})
    msgs = gate.digest_disagreements([a, b])
    assert len(msgs) == 1
    assert a.cell.id in msgs[0] and b.cell.id in msgs[0] and "1x128x4096/logprobs" in msgs[0]
    v = gate.decide([a, b])
    assert v.code == 1 and v.reasons == tuple(msgs)


def test_exact_tier_targets_must_agree():
    a = result(make_cell("cpu"), digests={"x/grad": D1})
    b = result(make_cell("gfx942"), digests={"x/grad": D2})
    assert gate.decide([a, b]).code == 1
    same = result(make_cell("gfx942"), digests={"x/grad": D1})
    assert gate.decide([a, same]).code == 0


def test_digests_of_different_dtypes_or_names_are_not_compared():
    a = result(make_cell("cpu", dtype="fp32"), digests={"x/grad": D1})
    b = result(make_cell("cpu", dtype="bf16"), digests={"x/grad": D2})
    c = result(make_cell("gfx942", dtype="fp32"), digests={"y/grad": D2})
    assert gate.digest_disagreements([a, b, c]) == []


def test_fast_tier_targets_may_differ_but_not_within_a_target():
    a = result(make_cell("gfx942", tier="fast"), digests={"x/logprobs": D1})
    b = result(make_cell("gfx90a", tier="fast"), digests={"x/logprobs": D2})
    assert gate.digest_disagreements([a, b]) == []
    assert gate.decide([a, b]).code == 0
    c = result(make_cell("gfx942", "sdma-off", tier="fast"), digests={"x/logprobs": D2})
    msgs = gate.digest_disagreements([a, b, c])
    assert len(msgs) == 1 and "on gfx942" in msgs[0] and a.cell.id in msgs[0] and c.cell.id in msgs[0]


def test_digest_disagreement_ignores_optional_variant_and_errored_cells():
    a = result(make_cell("cpu"), digests={"x/grad": D1})
    optional = result(make_cell("gfx1201", required=False), digests={"x/grad": D2})
    variant = result(make_cell("gfx942"), digests={"x/grad": D2}, variant="no-fixed-order")
    errored = result(make_cell("gfx90a"), "error", digests={"x/grad": D2})
    assert gate.digest_disagreements([a, optional, variant, errored]) == []


# ---- 10. junit merge ---------------------------------------------------------------------------------------
PASSED_JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="0" skipped="0" tests="2" time="0.3">
<testcase classname="test_bitwise" name="test_rollout_matches_training[1x128x4096]" time="0.1"/>
<testcase classname="test_bitwise" name="test_run_to_run[1x128x4096]" time="0.2"/>
</testsuite></testsuites>
"""
FAILED_JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" errors="0" failures="1" skipped="0" tests="2" time="0.3">
<testcase classname="test_bitwise" name="test_batch_invariance[1x128x4096]" time="0.1">
<failure message="AssertionError: alone: 3/4096 elements differ">assert False</failure></testcase>
<testcase classname="test_bitwise" name="test_run_to_run[1x128x4096]" time="0.2"/>
</testsuite></testsuites>
"""


def case_properties(path: Path) -> dict[tuple[str, str], dict[str, str]]:
    """{(suite name, testcase name): {property: value}} read from the XML itself."""
    out = {}
    for suite in ET.parse(path).getroot().iter("testsuite"):
        for case in suite.iter("testcase"):
            out[(suite.get("name"), case.get("name"))] = {
                p.get("name"): p.get("value") for props in case.findall("properties") for p in props.findall("property")
            }
    return out


def test_merge_junit(tmp_path):
    passed = result(
        make_cell("cpu"),
        digests={"1x128x4096/grad": "c" * 64, "1x128x4096/logprobs": "d" * 64},
        fingerprint_hash="e" * 64,
        comparisons=[cmp("ok", True)],
    )
    skipped = results.skipped(make_cell("gfx942"), "target gfx942 needs a ROCM device")
    errored = results.errored(
        make_cell("gfx90a"), "crashed: killed by signal SIGSEGV", "Segmentation fault (core dumped)"
    )
    failed = result(
        make_cell("cpu", "threads-1"),
        "failed",
        reason="bitwise mismatch",
        digests={"1x128x4096/grad": "f" * 64},
        comparisons=[cmp("alone vs batch", False, count=3, max_abs=2.5e-7, max_ulp=2, first_index=[0, 1])],
    )
    for res in (passed, skipped, errored, failed):
        results.write(res, results.cell_dir(tmp_path, res.cell))
    (results.cell_dir(tmp_path, passed.cell) / "junit.xml").write_text(PASSED_JUNIT)
    (results.cell_dir(tmp_path, failed.cell) / "junit.xml").write_text(FAILED_JUNIT)

    path = collect.merge(results.read_all(tmp_path), tmp_path)
    assert path == tmp_path / "junit.xml"
    xml = JUnitXml.fromfile(str(path))
    suites = {s.name: s for s in xml}
    assert set(suites) == {r.cell.id for r in (passed, skipped, errored, failed)}
    assert (xml.tests, xml.failures, xml.errors, xml.skipped) == (6, 1, 1, 1)
    totals = {name: (s.tests, s.failures, s.errors, s.skipped) for name, s in suites.items()}
    assert totals == {
        passed.cell.id: (2, 0, 0, 0),
        skipped.cell.id: (1, 0, 0, 1),
        errored.cell.id: (1, 0, 1, 0),
        failed.cell.id: (2, 1, 0, 0),
    }

    props = case_properties(path)
    assert len(props) == 6
    for (suite_name, _case), p in props.items():
        assert {"cell", "digest", "fingerprint", "max_abs_diff", "mismatches"} <= set(p)
        assert p["cell"] == suite_name
    rollout = props[(passed.cell.id, "test_rollout_matches_training[1x128x4096]")]
    assert rollout["digest"] == "c" * 64  # the first digest by name
    assert rollout["fingerprint"] == "e" * 64
    assert (rollout["mismatches"], rollout["max_abs_diff"], rollout["status"]) == ("0", "0.0", "passed")
    bad = props[(failed.cell.id, "test_run_to_run[1x128x4096]")]
    assert (bad["mismatches"], float(bad["max_abs_diff"]), bad["max_ulp"]) == ("3", 2.5e-7, "2")
    assert props[(skipped.cell.id, "cell")]["digest"] == ""

    root = ET.parse(path).getroot()
    err_suite = next(s for s in root.iter("testsuite") if s.get("name") == errored.cell.id)
    err = err_suite.find("testcase/error")
    assert err is not None and "SIGSEGV" in err.get("message") and "Segmentation fault" in err.text
    skip = next(s for s in root.iter("testsuite") if s.get("name") == skipped.cell.id).find("testcase/skipped")
    assert skip is not None and "gfx942" in skip.get("message")
    # suite-level properties too
    suite_props = {p.get("name"): p.get("value") for p in err_suite.findall("properties/property")}
    assert suite_props["cell"] == errored.cell.id and suite_props["status"] == "error"


def test_merge_ignores_junit_of_an_errored_cell(tmp_path):
    errored = results.errored(make_cell(), "timed out", "tail")
    results.write(errored, results.cell_dir(tmp_path, errored.cell))
    (results.cell_dir(tmp_path, errored.cell) / "junit.xml").write_text(PASSED_JUNIT)
    suite = collect.cell_suite(errored, results.cell_dir(tmp_path, errored.cell))
    assert isinstance(suite, TestSuite)
    assert (suite.tests, suite.errors) == (1, 1)


def test_merge_failed_cell_without_junit_is_a_failure(tmp_path):
    failed = result(make_cell(), "failed", reason="bitwise mismatch in x")
    results.write(failed, results.cell_dir(tmp_path, failed.cell))
    xml = JUnitXml.fromfile(str(collect.merge([failed], tmp_path)))
    assert (xml.tests, xml.failures) == (1, 1)


# ---- 11. compare --------------------------------------------------------------------------------------------
def save(path: Path, t) -> Path:
    if path.suffix == ".npy":
        np.save(path, t)
    else:
        torch.save(t, path)
    return path


@pytest.mark.parametrize("suffix", [".pt", ".npy"])
def test_compare_equal_and_one_bit(tmp_path, suffix):
    a = torch.linspace(-3.0, 3.0, 24, dtype=torch.float32).reshape(4, 6)
    b = a.clone()
    b.view(torch.int32)[2, 5] ^= 1
    conv = (lambda t: t.numpy()) if suffix == ".npy" else (lambda t: t)
    pa, pa2, pb = (save(tmp_path / f"{n}{suffix}", conv(t)) for n, t in (("a", a), ("a2", a.clone()), ("b", b)))
    same = compare.compare_tensors(pa, pa2)
    assert same.equal and same.count == 0 and same.total == 24
    d = compare.compare_tensors(pa, pb)
    assert not d.equal and d.count == 1 and d.max_ulp == 1
    assert d.first_index == (2, 5) and d.first_a == float(a[2, 5])


def test_compare_signed_zero_differs(tmp_path):
    pa = save(tmp_path / "a.pt", torch.tensor([0.0, 1.0]))
    pb = save(tmp_path / "b.pt", torch.tensor([-0.0, 1.0]))
    d = compare.compare_tensors(pa, pb)
    assert not d.equal and d.count == 1 and d.first_index == (0,)


def test_compare_bf16(tmp_path):
    a = torch.randn(8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    b = a.clone()
    b.view(torch.int16)[3] ^= 1
    d = compare.compare_tensors(save(tmp_path / "a.pt", a), save(tmp_path / "b.pt", b))
    assert d.count == 1 and d.first_index == (3,)


def test_compare_shape_mismatch(tmp_path):
    pa = save(tmp_path / "a.pt", torch.zeros(2, 3))
    pb = save(tmp_path / "b.pt", torch.zeros(3, 2))
    with pytest.raises(ConfigError, match="cannot be compared"):
        compare.compare_tensors(pa, pb)
    pc = save(tmp_path / "c.pt", torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(ConfigError):
        compare.compare_tensors(pa, pc)


def test_compare_non_tensor_files(tmp_path):
    pa = save(tmp_path / "a.pt", torch.zeros(2))
    with pytest.raises(ConfigError, match="dict") as info:
        compare.compare_tensors(pa, save(tmp_path / "d.pt", {"logprobs": torch.zeros(2)}))
    assert "d.pt" in str(info.value)
    text = tmp_path / "t.pt"
    text.write_text("not a tensor")
    with pytest.raises(ConfigError, match="cannot load"):
        compare.compare_tensors(text, pa)
    with pytest.raises(ConfigError, match="not a file"):
        compare.compare_tensors(pa, tmp_path / "missing.pt")
    obj = tmp_path / "o.npy"
    np.save(obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ConfigError, match="cannot load"):
        compare.compare_tensors(obj, pa)


def test_compare_dirs(tmp_path):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    c1, c2, c3 = make_cell("cpu"), make_cell("cpu", dtype="bf16"), make_cell("gfx942")
    for d, grad, status2 in ((a_dir, D1, "passed"), (b_dir, D2, "failed")):
        results.write(result(c1, digests={"x/logprobs": D1, "x/grad": grad}), results.cell_dir(d, c1))
        results.write(result(c2, status2, digests={"x/logprobs": D1}), results.cell_dir(d, c2))
    results.write(result(c3), results.cell_dir(a_dir, c3))
    deltas = {d.cell: d for d in compare.compare_dirs(a_dir, b_dir)}
    assert set(deltas) == {c1.id, c2.id, c3.id}
    assert deltas[c1.id].differing == ("x/grad",) and not deltas[c1.id].equal
    assert deltas[c2.id].differing == () and (deltas[c2.id].status_a, deltas[c2.id].status_b) == ("passed", "failed")
    assert not deltas[c2.id].equal
    assert (deltas[c3.id].status_a, deltas[c3.id].status_b) == ("passed", "absent")
    assert compare.compare_dirs(a_dir, a_dir) and all(d.equal for d in compare.compare_dirs(a_dir, a_dir))
    with pytest.raises(ConfigError, match="not a results directory"):
        compare.compare_dirs(a_dir, tmp_path / "empty")


# ---- golden ------------------------------------------------------------------------------------------------
def test_golden_key_and_update(tmp_path):
    assert golden.key("bf16", (1, 128, 4096), 0, "grad") == "bf16/1x128x4096/seed0/grad"
    assert golden.load("exact", tmp_path) == {}
    golden.update("exact", {"b": "2", "a": "1"}, tmp_path)
    p = golden.update("exact", {"b": "3", "c": "4"}, tmp_path)
    assert p == tmp_path / "exact.json"
    assert list(json.loads(p.read_text()).items()) == [("a", "1"), ("b", "3"), ("c", "4")]
    assert golden.load("exact", tmp_path) == {"a": "1", "b": "3", "c": "4"}
    assert golden.load("fast", tmp_path) == {}


def test_cell_dict_round_trip():
    cell = load_matrix("quick").cells[0]
    d = json.loads(json.dumps(cell.to_dict()))
    assert d["id"] == cell.id
    assert Cell.from_dict(d) == cell
    assert cell.dirname == cell.id.replace("/", "__") and "/" not in cell.dirname
