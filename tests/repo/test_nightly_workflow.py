"""nightly.yml: the AMD matrix on self-hosted runners, its results artifacts, the summary job's report."""

from __future__ import annotations

import tomllib

from rlparity.config import IMAGES_FILE
from rlparity.images import load_images, unsupported_by_rlparity

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


def test_the_workflows_image_matrices_follow_images_toml() -> None:
    """harness/rlparity/data/images.toml is the one source: every image a workflow builds is an entry that can
    carry rlparity and carries the runner's gfx target, and every gfx target of such an entry runs nightly."""
    entries = tomllib.loads(IMAGES_FILE.read_text())["images"]
    imgs = load_images()
    rows = load(WORKFLOWS / "nightly.yml")["jobs"]["amd"]["strategy"]["matrix"]["include"]
    ci = load(WORKFLOWS / "ci.yml")["jobs"]
    amd_ci = next(j for j in ci.values() if str(j.get("env", {}).get("IMAGE", "")).startswith("rocm"))
    pairs = {(r["image"], r["gfx"]) for r in rows} | {
        (amd_ci["env"]["IMAGE"], g) for g in amd_ci["strategy"]["matrix"]["gfx"]
    }
    for image, gfx in pairs:
        assert image in imgs and imgs[image].flavour == "rocm", image
        assert gfx in imgs[image].targets, (image, gfx)
        assert not unsupported_by_rlparity(entries[image]), image
    buildable = [n for n, e in entries.items() if e["flavour"] == "rocm" and not unsupported_by_rlparity(e)]
    nightly = {(r["image"], r["gfx"]) for r in rows}
    missing = [(n, t) for n in buildable for t in imgs[n].targets if t != "cpu" and (n, t) not in nightly]
    assert not missing, f"gfx targets of images.toml entries that no nightly runner runs: {missing}"
