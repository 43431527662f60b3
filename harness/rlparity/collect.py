"""Every cell's junit XML merged (junitparser) into one file, each testcase carrying the cell's properties.

A cell that produced no junit (skipped before it started, crashed, timed out) gets a one-testcase suite
that says so, so the merged file accounts for every cell (vLLM's lesson: the XML is the true status).
"""

from __future__ import annotations

from pathlib import Path

from junitparser import Error, Failure, JUnitXml, Properties, Property, Skipped, TestCase, TestSuite

from rlparity import results
from rlparity.results import CellResult


def cell_properties(res: CellResult) -> dict[str, str]:
    digest = next(iter(sorted(res.digests.items())), ("", ""))[1]
    return {
        "cell": res.cell.id,
        "status": res.status,
        "required": str(res.cell.required).lower(),
        "digest": digest,
        "fingerprint": res.fingerprint_hash,
        "max_abs_diff": str(res.max_abs),
        "max_ulp": str(res.max_ulp),
        "mismatches": str(res.mismatches),
        **{f"mismatch_{k}": f"{v:.6g}" for k, v in res.mismatch.items() if "/" not in k},
    }


def cell_suite(res: CellResult, directory: Path) -> TestSuite:
    junit = directory / results.JUNIT_FILE
    suite: TestSuite | None = None
    if res.status in ("passed", "failed") and junit.exists():
        xml = JUnitXml.fromfile(str(junit))
        suites = [xml] if isinstance(xml, TestSuite) else list(xml)
        if suites:
            suite = suites[0]
            for extra in suites[1:]:
                for case in extra:
                    suite.add_testcase(case)
    if suite is None:
        suite = _synthetic_suite(res)
    suite.name = res.cell.id
    props = cell_properties(res)
    for name, value in props.items():
        suite.add_property(name, value)
    for case in suite:
        _add_case_properties(case, props)
    suite.update_statistics()
    return suite


def _synthetic_suite(res: CellResult) -> TestSuite:
    suite = TestSuite(res.cell.id)
    case = TestCase("cell", classname=res.cell.id, time=float(res.timings.get("wall_s", 0.0)))
    if res.status == "skipped":
        case.result = [Skipped(res.reason)]
    elif res.status == "failed":
        case.result = [Failure(res.reason, "BitwiseMismatch")]
    elif res.status == "error":
        err = Error(res.reason, "CellError")
        err.text = res.output_tail
        case.result = [err]
    suite.add_testcase(case)
    return suite


def _add_case_properties(case: TestCase, props: dict[str, str]) -> None:
    block = Properties()
    for name, value in props.items():
        block.add_property(Property(name, value))
    case.append(block)


def merge(all_results: list[CellResult], out: Path, filename: str = "junit.xml") -> Path:
    xml = JUnitXml("rlparity")
    for res in all_results:
        xml.add_testsuite(cell_suite(res, results.cell_dir(out, res.cell)))
    xml.update_statistics()
    path = out / filename
    xml.write(str(path), pretty=True)
    return path
