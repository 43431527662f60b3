"""Golden digests of the `exact` tier (rl_kernel.contract.golden): the build's output bits equal the committed
kernels/rl_kernel/exact/<family>/golden.json.

These tests only check; nothing here writes a golden file. After an intended change of the numerical
contract, regenerate with `python -m rl_kernel.contract.golden --update` and say so in the commit.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rl_kernel import inputs, tiers
from rl_kernel.contract import golden
from rl_kernel.contract.families import all_specs

FAMILIES = golden.families()


def _assert_no_drift(family: str, device: str) -> None:
    problems = golden.check(family, device)
    assert not problems, (
        f"{len(problems)} golden digests of {family} drifted on {device}:\n  "
        + "\n  ".join(problems)
        + "\nIf the numerical contract changed on purpose, regenerate: python -m rl_kernel.contract.golden --update"
    )


@pytest.mark.parametrize("family", FAMILIES)
def test_golden_digests_cpu(family: str) -> None:
    _assert_no_drift(family, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("family", FAMILIES)
def test_golden_digests_gpu(family: str) -> None:
    _assert_no_drift(family, "cuda")


@pytest.mark.parametrize("family", FAMILIES)
def test_golden_file_is_complete(family: str) -> None:
    table = golden.load(family)
    keys = set()
    for spec in (s for s in all_specs() if s.family == family and s.in_golden):
        for case_name, _ in spec.golden_cases():
            names = [case_name, f"grad_{case_name}"] if spec.differentiable else [case_name]
            keys |= {golden.key(n, v, d) for n in names for v in spec.golden_vocabs for d in inputs.DTYPES}
    assert set(table) == keys
    assert all(len(v) == 64 and int(v, 16) >= 0 for v in table.values())


EXACT = tiers.get("exact").folder


def test_every_golden_file_belongs_to_a_family() -> None:
    assert sorted(p.parent.name for p in EXACT.glob("*/golden.json")) == FAMILIES


def _altered_copy(tmp_path: Path, family: str) -> tuple[Path, str]:
    """A copy of the tier's golden files with one digest of family flipped; returns (dir, key)."""
    for f in FAMILIES:
        (tmp_path / f).mkdir(parents=True, exist_ok=True)
        shutil.copy(golden.path_for(f), golden.path_for(f, tmp_path))
    table = golden.load(family, tmp_path)
    key = sorted(table)[0]
    table[key] = ("0" if table[key][0] != "0" else "1") + table[key][1:]
    golden.path_for(family, tmp_path).write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
    return tmp_path, key


def test_an_altered_digest_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    family = FAMILIES[0]
    root, key = _altered_copy(tmp_path, family)
    real = golden.path_for(family).read_bytes()
    assert golden.check(family, "cpu", root) == [f"changed: {key}"]
    assert golden.main(["--family", family, "--dir", str(root)]) == 1
    assert f"changed: {key}" in capsys.readouterr().out
    assert golden.path_for(family).read_bytes() == real  # the check wrote nothing


def test_update_is_the_only_writer(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    family = FAMILIES[0]
    root, key = _altered_copy(tmp_path, family)
    assert golden.main(["--update", "--family", family, "--dir", str(root)]) == 0
    assert f"changed: {key}" in capsys.readouterr().out
    assert golden.path_for(family, root).read_bytes() == golden.path_for(family).read_bytes()


def test_diff_names_changed_new_and_gone_keys() -> None:
    lines = golden.diff({"a": "1", "b": "2", "c": "3"}, {"a": "1", "b": "9", "d": "4"})
    assert lines == ["changed: b", "not in the golden file: d", "no longer computed: c"]


def test_a_per_target_tier_names_its_files_by_target(tmp_path, capsys) -> None:
    """The fast tier's kernel digests live per target; a target with no file has nothing to check (exit 0) and
    says so; the path needs a target."""
    from rl_kernel import tiers

    fast = tiers.get("fast")
    assert fast.golden_path("decoder", "sm_90") == fast.folder / "decoder" / "golden" / "sm_90.json"
    assert fast.golden_path("decoder", "sm_90").is_file()  # the H200's digests (the sm_90 baseline)
    with pytest.raises(tiers.TierError, match="per target"):
        fast.golden_path("decoder")
    assert golden.target_for(fast, "cpu") == "cpu" and golden.target_for(tiers.get("exact"), "cpu") is None
    assert golden.main(["--tier", "fast", "--dir", str(tmp_path)]) == 0
    assert "no digests recorded for cpu" in capsys.readouterr().out
