"""The GitHub Actions workflows' safety rules, on the real workflows and on deliberately unsafe ones.

The rules are plain functions in workflow_rules.py; each takes a parsed workflow and returns its
violations, and the negative controls below feed unsafe workflows (written here, or a real one broken
once) through the same functions.

The rules:
- no `pull_request_target` anywhere (trigger, expression or string);
- the top-level `permissions` is a mapping of read/none scopes, and no job asks for `write`;
- every job has `timeout-minutes`;
- every job that may run on a self-hosted runner has an `if:` that is false for every pull request from a
  fork (no label, a stale `safe-to-test` label on a new push, another label being applied); the expression is
  evaluated, not pattern-matched, with GitHub's operators and functions;
- in those jobs the results upload and the cleanup run under `if: always()`, the cleanup after the uploads,
  and every `rlparity run` call passes `--strict`;
- every checkout drops its credentials (`persist-credentials: false`), every action is pinned to a commit;
- no `${{ github.event.* }}` or `${{ github.head_ref }}` is pasted into a run script (script injection);
- ci.yml has a concurrency group with `cancel-in-progress: true`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from repo.workflow_rules import (
    WORKFLOWS,
    check_fork_guard,
    check_workflow,
    is_cleanup,
    is_self_hosted,
    is_upload,
    load,
    steps,
    workflow_files,
)


# ---- the safety rules on the real workflows ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["ci.yml", "nightly.yml"])
def test_workflow_is_safe(name: str) -> None:
    wf = load(WORKFLOWS / name)
    assert check_workflow(wf, cancel_in_progress=name == "ci.yml") == []


def test_every_workflow_file_is_safe() -> None:
    for path in workflow_files():
        assert check_workflow(load(path)) == [], path.name


# ---- negative controls: unsafe workflows must be reported ---------------------------------------------------
UNSAFE: dict = {
    "name": "unsafe",
    True: {"pull_request_target": {"types": ["opened"]}},
    "permissions": "write-all",
    "jobs": {
        "amd": {
            "runs-on": ["self-hosted", "linux", "rocm", "gfx90a"],
            "permissions": {"contents": "write"},
            "steps": [
                {"uses": "actions/checkout@v4", "with": {"ref": "${{ github.event.pull_request.head.sha }}"}},
                {"run": "echo '${{ github.event.pull_request.title }}'"},
                {"run": "docker compose run --rm --entrypoint rlparity test run --matrix quick --out /work/results"},
                {"name": "Clean up", "run": "docker compose down; rm -rf results"},
                {"uses": "actions/upload-artifact@v4", "with": {"name": "r", "path": "results"}},
            ],
        },
    },
}


def test_unsafe_workflow_is_reported() -> None:
    found = check_workflow(UNSAFE, cancel_in_progress=True)
    expected = [
        "triggered by pull_request_target",
        "top level: permissions must be a mapping",
        "job amd: contents: write",
        "job amd: no timeout-minutes",
        "job amd: self-hosted without an if: guard",
        "lacks if: always()",
        "a cleanup step runs before the results are uploaded",
        "rlparity run without --strict",
        "persist-credentials",
        "actions/checkout@v4 is not pinned",
        "interpolates",
        "no concurrency group",
    ]
    for text in expected:
        assert any(text in v for v in found), (text, found)


@pytest.mark.parametrize(
    "guard",
    [
        "github.event_name == 'pull_request' || github.event_name == 'push'",
        "github.event_name != 'pull_request_review'",
        "contains(github.event.pull_request.labels.*.name, 'safe-to-test')",  # sticky: survives new pushes
        "github.event_name == 'push' || contains(github.event.pull_request.labels.*.name, 'SAFE-TO-TEST')",
        "github.repository == 'rlparity-org/rlparity'",  # true in a fork PR's run too
        "github.event.pull_request.head.repo.full_name != 'mallory/rlparity'",
        "always()",
        "${{ !cancelled() }}",
    ],
)
def test_weak_guards_are_rejected(guard: str) -> None:
    wf = {"jobs": {"gpu": {"runs-on": ["self-hosted", "rocm"], "if": guard, "steps": []}}}
    assert any("runs for a fork PR" in v for v in check_fork_guard(wf)), guard


def test_unresolvable_runner_counts_as_self_hosted() -> None:
    job = {"runs-on": "${{ fromJSON(inputs.runner) }}", "steps": []}
    assert is_self_hosted(job)
    assert check_fork_guard({"jobs": {"x": job}}) == [
        "job x: self-hosted without an if: guard against fork pull requests"
    ]
    hosted = {"runs-on": "${{ matrix.os }}", "strategy": {"matrix": {"os": ["ubuntu-latest", "ubuntu-24.04"]}}}
    assert not is_self_hosted(hosted)
    mixed = {
        "runs-on": "${{ matrix.r }}",
        "strategy": {"matrix": {"include": [{"r": "ubuntu-latest"}, {"r": ["self-hosted"]}]}},
    }
    assert is_self_hosted(mixed)


def _job(wf: dict, name: str) -> dict:
    return wf["jobs"][name]


def _step(job: dict, pred: Callable[[dict], bool]) -> dict:
    return next(s for s in steps(job) if pred(s))


def _rlparity_step(job: dict) -> dict:
    return _step(job, lambda s: "--matrix" in str(s.get("run", "")))


def _add_pull_request_target(wf: dict) -> None:
    wf[True]["pull_request_target"] = {"types": ["opened"]}


def _sticky_label_guard(wf: dict) -> None:
    _job(wf, "amd")["if"] = (
        "github.event_name == 'push' || (github.event_name == 'pull_request' && "
        "(github.event.pull_request.head.repo.full_name == github.repository || "
        "contains(github.event.pull_request.labels.*.name, 'safe-to-test')))"
    )


def _drop_strict(wf: dict) -> None:
    step = _rlparity_step(_job(wf, "amd"))
    step["run"] = step["run"].replace("--strict", "")


MUTATIONS: dict[str, tuple[str, Callable[[dict], Any]]] = {
    "pull_request_target trigger": ("ci.yml", _add_pull_request_target),
    "write-all token": ("ci.yml", lambda wf: wf.update(permissions="write-all")),
    "job asks for write": ("nightly.yml", lambda wf: _job(wf, "summary")["permissions"].update(actions="write")),
    "cpu job without timeout": ("ci.yml", lambda wf: _job(wf, "cpu").pop("timeout-minutes")),
    "amd job without guard": ("ci.yml", lambda wf: _job(wf, "amd").pop("if")),
    "amd job guard admits every PR": (
        "ci.yml",
        lambda wf: _job(wf, "amd").update({"if": "github.event_name == 'push' || github.event_name == 'pull_request'"}),
    ),
    "amd job guard with a sticky label": ("ci.yml", _sticky_label_guard),
    "nightly amd job without guard": ("nightly.yml", lambda wf: _job(wf, "amd").pop("if")),
    "upload without always()": ("ci.yml", lambda wf: _step(_job(wf, "amd"), is_upload).pop("if")),
    "cleanup without always()": ("nightly.yml", lambda wf: _step(_job(wf, "amd"), is_cleanup).pop("if")),
    "no upload step": ("ci.yml", lambda wf: _job(wf, "amd")["steps"].remove(_step(_job(wf, "amd"), is_upload))),
    "no --strict": ("ci.yml", _drop_strict),
    "no cancel-in-progress": ("ci.yml", lambda wf: wf["concurrency"].update({"cancel-in-progress": False})),
    "no concurrency": ("ci.yml", lambda wf: wf.pop("concurrency")),
    "checkout keeps credentials": (
        "ci.yml",
        lambda wf: _step(_job(wf, "amd"), lambda s: "checkout" in str(s.get("uses", "")))["with"].clear(),
    ),
    "action by tag": ("nightly.yml", lambda wf: _job(wf, "summary")["steps"][0].update(uses="actions/checkout@v4")),
    "PR title in a script": (
        "ci.yml",
        lambda wf: _job(wf, "cpu")["steps"].append({"run": "echo ${{ github.event.pull_request.title }}"}),
    ),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_mutated_workflow_is_reported(mutation: str) -> None:
    """Each rule, broken once in an otherwise clean real workflow, must be reported."""
    name, mutate = MUTATIONS[mutation]
    wf = copy.deepcopy(load(WORKFLOWS / name))
    assert check_workflow(wf, cancel_in_progress=name == "ci.yml") == []
    mutate(wf)
    assert check_workflow(wf, cancel_in_progress=name == "ci.yml"), mutation
