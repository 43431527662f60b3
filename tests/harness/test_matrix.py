"""The matrix files: the shipped matrices expand to the cells their TOML describes; small files exercise
product, include, exclude, informational rules and the backends' image handling."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import tomllib

from rlparity.matrix import load_axes, load_matrix

from harness.factories import (
    BASE_AXES,
    FULL_INCLUDE,
    IMAGES_TOML,
    MATRICES,
    ids_of,
    matrix_text,
    write,
)

AXIS_ORDER = ("image", "target", "profile", "placement", "dtype", "shapes", "tier")


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


# ---- matrix expansion of the shipped files ---------------------------------------------------------
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
    # quick shapes: 22 applicable (target, profile) pairs x 2 dtypes on `single`, cpu's 2 profiles x 2 dtypes
    # on `split`, plus the fp16 include; gfx1201 (4 profiles x 2 dtypes) informational.
    # edges shapes: 7 targets x 3 dtypes, baseline and single only (gfx1201's 3 informational); the model
    # shapes alike.
    # fast tier: 7 targets x (quick bf16, model bf16 and fp16), baseline and single; cpu's and gfx1201's
    # informational (the cpu ones are skipped: no GPU).
    every = load_matrix("quick").cells
    fast = [c for c in every if c.tier == "fast"]
    assert len(fast) == 7 * 3 and {(c.shapes, c.dtype) for c in fast} == {("quick", "bf16"), ("model", "bf16"),
                                                                         ("model", "fp16")}  # fmt: skip
    assert {c.target for c in fast if not c.required} == {"cpu", "gfx1201"} and sum(not c.required for c in fast) == 6
    assert {(c.profile, c.placement) for c in fast} == {("baseline", "single")}
    everything = [c for c in every if c.tier == "exact"]
    cells = [c for c in everything if c.shapes == "quick"]
    assert len(cells) == 22 * 2 + 2 * 2 + 1
    assert sum(not c.required for c in cells) == 8
    assert {c.target for c in cells if not c.required} == {"gfx1201"}
    assert all(c.image == "local" for c in everything)
    assert {c.placement for c in everything if c.target != "cpu"} == {"single"}
    assert [c for c in cells if c.dtype == "fp16"] == [c for c in cells if c.id.endswith("/fp16/quick/exact")]
    assert len([c for c in cells if c.dtype == "fp16"]) == 1
    edges = [c for c in everything if c.shapes == "edges"]
    model = [c for c in everything if c.shapes == "model"]
    assert len(edges) == 7 * 3 and len(model) == 7 * 3 and len(everything) == len(cells) + len(edges) + len(model)
    assert sum(not c.required for c in edges) == 3 and sum(not c.required for c in model) == 3
    assert {(c.profile, c.placement, c.workload) for c in model} == {("baseline", "single", "model")}


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
    informational = [c for c in cells if (c.tier == "fast" and c.target == "cpu") or c.target == "gfx1201"]
    assert informational and not [c for c in informational if c.required]
    assert all(c.required for c in cells if c not in informational)
    assert not [c for c in cells if c.tier == "fast" and (c.dtype == "fp32" or c.placement == "split")]
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
    assert {c.image for c in cells} == {"rocm64-torch26", "rocm72-torch210", "cpu"}
    assert all(c.target in carried[c.image] for c in cells)
    by_image = {img: {c.target for c in cells if c.image == img} for img in carried}
    assert by_image == {
        "rocm60-torch20": set(),  # pinned, but too old to carry rlparity: no matrix names it
        "rocm64-torch26": carried["rocm64-torch26"],
        "rocm72-torch210": {"cpu", "gfx942", "gfx950"},
        "cpu": {"cpu"},
    }
    # targets no image carries vanish under docker but stay under local
    assert not {c.target for c in cells} & {"sm90", "gfx908"}
    assert {"sm90", "gfx908", "gfx950"} <= {c.target for c in load_matrix("nightly").cells}


# ---- small matrix files ------------------------------------------------------------------------------
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
    tail = '[[informational]]\nimage = "rocm72-torch210"\n'
    required = []
    for order in ('["rocm72-torch210", "rocm64-torch26"]', '["rocm64-torch26", "rocm72-torch210"]'):
        axes = {**BASE_AXES, "image": order, "target": '["cpu"]', "profile": '["baseline"]'}
        axes.update(placement='["single"]', dtype='["fp32"]')
        cells = load_matrix(str(write(tmp_path, matrix_text(axes=axes, tail=tail)))).cells
        assert len(cells) == 1
        required.append(cells[0].required)
    assert required[0] == required[1]


def test_docker_backend_on_a_small_file(tmp_path):
    axes = {**BASE_AXES, "image": '["rocm60-torch20", "rocm64-torch26"]'}
    ids = ids_of(write(tmp_path, matrix_text(axes=axes)), "docker")
    # rocm60 does not carry gfx942: 8 cpu cells per image, 8 gfx942 cells for rocm64 only
    assert len(ids) == 8 + 8 + 8
    assert not [i for i in ids if i.startswith("rocm60-torch20/gfx942/")]


def test_the_factories_tier_scopes_are_axes_tomls():
    from harness.factories import _SCOPE

    assert {name: tier.scope for name, tier in load_axes().tiers.items()} == _SCOPE


def test_a_cell_knows_where_its_params_are_written(tmp_path):
    """Cell.params_where is FILE:LINE of its shape set's params (inline or a [shapes.NAME.params] table): what a cell
    that finds them bad (an engine's import string) names for the gate's exit 3."""
    tail = (
        '[shapes.inl]\nworkload = "engines"\nparams = { rollout = "a:b" }\nshapes = [[1, 2, 3]]\n\n'
        '[shapes.tab]\nworkload = "engines"\nshapes = [[1, 2, 3]]\n\n[shapes.tab.params]\nrollout = "a:b"\n'
    )
    axes = {**BASE_AXES, "target": '["cpu"]', "shapes": '["inl", "tab", "smoke"]'}
    path = write(tmp_path, matrix_text(axes=axes, tail=tail))
    lines = path.read_text().splitlines()
    where = {c.shapes: c.params_where for c in load_matrix(str(path)).cells}
    inline = lines.index('params = { rollout = "a:b" }') + 1
    assert where["inl"] == f"{path}:{inline}"
    assert where["tab"] == f"{path}:{lines.index('[shapes.tab.params]') + 1}"
    assert where["smoke"].startswith(str(MATRICES / "axes.toml"))
