"""ci.yml: its triggers and jobs, the AMD job's guard on trusted events, label runs and the concurrency group."""

from __future__ import annotations

import re

from repo.gha import evaluate, to_string, truthy
from repo.workflow_rules import (
    SAFE_LABEL,
    WORKFLOWS,
    event_context,
    jobs,
    load,
    pr_context,
    self_hosted_jobs,
    steps,
    triggers,
)


def test_ci_triggers_and_jobs() -> None:
    wf = load(WORKFLOWS / "ci.yml")
    on = triggers(wf)
    assert set(on) == {"push", "pull_request", "workflow_dispatch"}, on
    assert on["push"]["branches"] == ["main"]
    assert "labeled" in on["pull_request"]["types"]
    assert wf["permissions"] == {"contents": "read"}
    assert set(jobs(wf)) == {"cpu", "lint", "amd"}
    assert set(self_hosted_jobs(wf)) == {"amd"}
    amd = wf["jobs"]["amd"]
    assert amd["runs-on"][:3] == ["self-hosted", "linux", "rocm"]
    assert {"gfx90a", "gfx942"} <= set(amd["strategy"]["matrix"]["gfx"])
    run = next(s["run"] for s in steps(amd) if "--matrix" in str(s.get("run", "")))
    # the runner's own target by name (a missing GPU errors under --strict), not a --filter workaround
    assert "--matrix quick" in run and '--targets "cpu,${GFX}"' in run and "--filter" not in run
    # The static scan of the shipped extension runs in the image, before the gate.
    names = [str(s.get("run", "")) for s in steps(amd)]
    built = next(i for i, r in enumerate(names) if "kernels_check.py --built" in r)
    gate = next(i for i, r in enumerate(names) if "--matrix" in r)
    assert built < gate
    assert "import rl_kernel._C" in names[built] and "docker compose run" in names[built]


def test_ci_amd_guard_admits_trusted_events() -> None:
    """The guard is not simply false: pushes, same-repository PRs and the safe-to-test label do run the job."""
    cond = load(WORKFLOWS / "ci.yml")["jobs"]["amd"]["if"]
    for ctx in (
        event_context("push"),
        event_context("workflow_dispatch"),
        pr_context(fork=False, action="opened"),
        pr_context(fork=False, action="synchronize"),
        pr_context(fork=True, action="labeled", labels=(SAFE_LABEL,), label=SAFE_LABEL),
    ):
        assert truthy(evaluate(cond, ctx)), ctx["github"]["event_name"]
    # Another label on a same-repository PR: its own concurrency group, so the push run (not cancelled) has
    # the AMD results; the label run does not repeat them.
    assert not truthy(evaluate(cond, pr_context(fork=False, action="labeled", labels=("bug",), label="bug")))


def test_ci_label_runs_do_not_cancel_the_gate() -> None:
    """A label event's concurrency group differs from the push runs' group, and from other labels' groups."""
    group = load(WORKFLOWS / "ci.yml")["concurrency"]["group"]

    def resolve(ctx: dict) -> str:
        return re.sub(
            r"\$\{\{(.*?)\}\}",
            lambda m: to_string(evaluate(m.group(1), {**ctx, "github": {**ctx["github"], "workflow": "ci"}})),
            group,
            flags=re.S,
        )

    push = resolve(pr_context(fork=True, action="synchronize"))
    safe = resolve(pr_context(fork=True, action="labeled", labels=(SAFE_LABEL,), label=SAFE_LABEL))
    bug = resolve(pr_context(fork=True, action="labeled", labels=("bug",), label="bug"))
    assert len({push, safe, bug}) == 3, (push, safe, bug)
    assert push == resolve(pr_context(fork=True, action="opened")), "a new push must cancel the previous run"
