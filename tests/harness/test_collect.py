"""The merged junit of a run (rlparity.collect)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from junitparser import JUnitXml, TestSuite

from rlparity import collect, results

from harness.factories import (
    comparison,
    make_cell,
    make_result,
)

# ---- junit merge ---------------------------------------------------------------------------------------
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
    passed = make_result(
        make_cell("cpu"),
        digests={"1x128x4096/grad": "c" * 64, "1x128x4096/logprobs": "d" * 64},
        fingerprint_hash="e" * 64,
        comparisons=[comparison("ok", True)],
    )
    skipped = results.skipped(make_cell("gfx942"), "target gfx942 needs a ROCM device")
    errored = results.errored(
        make_cell("gfx90a"), "crashed: killed by signal SIGSEGV", "Segmentation fault (core dumped)"
    )
    failed = make_result(
        make_cell("cpu", "threads-1"),
        "failed",
        reason="bitwise mismatch",
        digests={"1x128x4096/grad": "f" * 64},
        comparisons=[comparison("alone vs batch", False, count=3, max_abs=2.5e-7, max_ulp=2, first_index=[0, 1])],
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
    failed = make_result(make_cell(), "failed", reason="bitwise mismatch in x")
    results.write(failed, results.cell_dir(tmp_path, failed.cell))
    xml = JUnitXml.fromfile(str(collect.merge([failed], tmp_path)))
    assert (xml.tests, xml.failures) == (1, 1)
