"""nightly.yml: the AMD matrix on self-hosted runners, its results artifacts, the summary job's report."""

from __future__ import annotations

from repo.gha import evaluate, truthy
from repo.workflow_rules import (
    WORKFLOWS,
    event_context,
    is_always,
    is_self_hosted,
    is_upload,
    load,
    runner_labels,
    steps,
    triggers,
)


def test_nightly_layout() -> None:
    wf = load(WORKFLOWS / "nightly.yml")
    on = triggers(wf)
    assert set(on) == {"schedule", "workflow_dispatch"} and on["schedule"][0]["cron"]
    amd, summary = wf["jobs"]["amd"], wf["jobs"]["summary"]
    sets = runner_labels(amd)
    assert sets and ["self-hosted", "linux", "rocm", "gfx90a", "dual-gcd"] in sets
    assert all(labels[:3] == ["self-hosted", "linux", "rocm"] for labels in sets)
    assert truthy(evaluate(amd["if"], event_context("schedule")))
    upload = next(s for s in steps(amd) if is_upload(s))
    assert upload["with"]["name"] == "results-${{ matrix.label }}"
    assert summary["needs"] == ["amd"] and is_always(summary["if"])
    assert summary["permissions"] == {"contents": "read", "actions": "read"}
    assert not is_self_hosted(summary)
    download = next(s for s in steps(summary) if str(s.get("uses", "")).startswith("actions/download-artifact@"))
    assert download["with"]["pattern"] == "results-*"
    scripts = "\n".join(str(s.get("run", "")) for s in steps(summary))
    assert "gh run download" in scripts and "rlparity report" in scripts and "GITHUB_STEP_SUMMARY" in scripts
