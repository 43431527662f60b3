"""Malformed matrix files: each error is bad configuration naming the file, the line and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlparity.config import ConfigError
from rlparity.matrix import load_matrix, resolve_matrix_path

from harness.factories import (
    BASE_AXES,
    FULL_INCLUDE,
    MATRICES,
    matrix_text,
    write,
)


# ---- malformed matrix files ------------------------------------------------------------------------
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
