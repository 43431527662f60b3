"""The workflows' safety rules as plain functions over a parsed workflow (PyYAML reads the `on:` key as True).

Each `check_*` takes a workflow dict and returns its violations; the rules are listed in
test_workflow_safety.py. Fork pull-request guards are evaluated with gha.evaluate in the event contexts below.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from repo.gha import UnsupportedExpression, evaluate, strip_braces, truthy
from tooling import require

try:
    import yaml
except ImportError:  # pragma: no cover - PyYAML is installed by CI
    yaml = None

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
ACTIONLINT_CONFIG = ROOT / ".github" / "actionlint.yaml"
REPO = "rlparity-org/rlparity"  # any name: the rules compare the head repository with github.repository
SAFE_LABEL = "safe-to-test"
SHA = re.compile(r"^[0-9a-f]{40}$")


# ---- loading -----------------------------------------------------------------------------------------------
def load(path: Path) -> dict:
    require("PyYAML", yaml is not None)
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict), f"{path.name}: not a mapping"
    return data


def triggers(wf: dict) -> dict:
    """The `on:` section as {event: config}; PyYAML parses the bare key `on` as the boolean True."""
    on = wf.get("on", wf.get(True))
    if isinstance(on, str):
        return {on: None}
    if isinstance(on, list):
        return dict.fromkeys(on)
    return dict(on or {})


def workflow_files() -> list[Path]:
    return sorted([*WORKFLOWS.glob("*.yml"), *WORKFLOWS.glob("*.yaml")])


# ---- event contexts ----------------------------------------------------------------------------------------
def pr_context(
    *, fork: bool, action: str = "synchronize", labels: tuple[str, ...] = (), label: str = "", owner: str = "mallory"
) -> dict:
    event: dict[str, Any] = {
        "action": action,
        "number": 7,
        "pull_request": {
            "number": 7,
            "head": {"repo": {"full_name": f"{owner}/rlparity" if fork else REPO}, "ref": "topic", "sha": "0" * 40},
            "base": {"repo": {"full_name": REPO}, "ref": "main"},
            "labels": [{"name": n} for n in labels],
        },
        "repository": {"full_name": REPO, "default_branch": "main"},
    }
    if label:
        event["label"] = {"name": label}
    github = {"event_name": "pull_request", "repository": REPO, "event": event, "ref": "refs/pull/7/merge"}
    return {"github": {**github, "head_ref": "topic", "base_ref": "main"}}


def event_context(name: str) -> dict:
    event = {"repository": {"full_name": REPO, "default_branch": "main"}}
    return {"github": {"event_name": name, "repository": REPO, "event": event, "ref": "refs/heads/main"}}


# Pull requests from a fork: a self-hosted job's `if:` must be false for every one of them.
FORK_PRS = {
    "fork PR opened": pr_context(fork=True, action="opened"),
    "fork PR new push": pr_context(fork=True, action="synchronize", owner="eve"),
    "fork PR reopened": pr_context(fork=True, action="reopened"),
    "fork PR new push after safe-to-test": pr_context(fork=True, action="synchronize", labels=(SAFE_LABEL,)),
    "fork PR other label applied": pr_context(fork=True, action="labeled", labels=(SAFE_LABEL, "bug"), label="bug"),
    "fork PR with a stale label edited": pr_context(fork=True, action="edited", labels=(SAFE_LABEL,)),
}


# ---- the checks ----------------------------------------------------------------------------------------------
def _walk_strings(node: Any):
    if isinstance(node, dict):
        for k, v in node.items():
            yield str(k)
            yield from _walk_strings(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk_strings(v)
    elif isinstance(node, str):
        yield node


def jobs(wf: dict) -> dict[str, dict]:
    return {name: job for name, job in (wf.get("jobs") or {}).items() if isinstance(job, dict)}


def steps(job: dict) -> list[dict]:
    return [s for s in job.get("steps") or [] if isinstance(s, dict)]


def check_no_pull_request_target(wf: dict) -> list[str]:
    out = []
    if "pull_request_target" in triggers(wf):
        out.append("triggered by pull_request_target")
    if any("pull_request_target" in s for s in _walk_strings(wf)):
        out.append("mentions pull_request_target")
    return out


def _read_only(perms: Any, where: str) -> list[str]:
    if not isinstance(perms, dict):
        return [f"{where}: permissions must be a mapping of read/none scopes, got {perms!r}"]
    return [f"{where}: {scope}: {level}" for scope, level in perms.items() if level not in ("read", "none")]


def check_permissions(wf: dict) -> list[str]:
    if "permissions" not in wf:
        return ["no top-level permissions: the token would get the repository's default (maybe write)"]
    out = _read_only(wf["permissions"], "top level")
    for name, job in jobs(wf).items():
        if "permissions" in job:
            out += _read_only(job["permissions"], f"job {name}")
    return out


def check_timeouts(wf: dict) -> list[str]:
    out = []
    for name, job in jobs(wf).items():
        if "uses" in job:  # a reusable workflow's jobs set their own timeouts
            continue
        t = job.get("timeout-minutes")
        ok = (isinstance(t, int | float) and not isinstance(t, bool) and t > 0) or (
            isinstance(t, str) and t.strip().startswith("${{")
        )
        if not ok:
            out.append(f"job {name}: no timeout-minutes")
    return out


def runner_labels(job: dict) -> list[list[str]] | None:
    """Every label set the job may ask for; None when an expression cannot be resolved from its matrix."""

    def resolve(value: Any) -> list[list[str]] | None:
        if isinstance(value, dict):  # {group: ..., labels: ...}
            return resolve(value.get("labels", [])) if "labels" in value else None
        if isinstance(value, str):
            m = re.fullmatch(r"\$\{\{\s*matrix\.([A-Za-z0-9_-]+)\s*\}\}", value.strip())
            if m:
                options = matrix_values(job, m.group(1))
                if not options:
                    return None
                resolved = [resolve(o) for o in options]
                if any(r is None for r in resolved):
                    return None
                return [labels for r in resolved for labels in r]  # type: ignore[union-attr]
            return None if "${{" in value else [[value]]
        if isinstance(value, list):  # one label set: every label any element may take (over-approximated)
            labels: list[str] = []
            for v in value:
                options = resolve(v)
                if options is None:
                    return None
                labels += [label for option in options for label in option]
            return [labels]
        return None

    return resolve(job.get("runs-on"))


def matrix_values(job: dict, key: str) -> list[Any]:
    matrix = (job.get("strategy") or {}).get("matrix") or {}
    if not isinstance(matrix, dict):
        return []
    values = list(matrix.get(key) or []) if isinstance(matrix.get(key), list) else []
    values += [inc[key] for inc in matrix.get("include") or [] if isinstance(inc, dict) and key in inc]
    return values


def is_self_hosted(job: dict) -> bool:
    """True when any label set includes self-hosted, or when runs-on cannot be resolved (assume the worst)."""
    sets = runner_labels(job)
    return sets is None or any("self-hosted" in labels for labels in sets)


def self_hosted_jobs(wf: dict) -> dict[str, dict]:
    return {name: job for name, job in jobs(wf).items() if "runs-on" in job and is_self_hosted(job)}


def check_fork_guard(wf: dict) -> list[str]:
    out = []
    for name, job in self_hosted_jobs(wf).items():
        cond = job.get("if")
        if not isinstance(cond, str) or not cond.strip():
            out.append(f"job {name}: self-hosted without an if: guard against fork pull requests")
            continue
        for scenario, ctx in FORK_PRS.items():
            try:
                result = evaluate(cond, ctx)
            except UnsupportedExpression as exc:
                out.append(f"job {name}: guard cannot be evaluated ({exc})")
                break
            if truthy(result):
                out.append(f"job {name}: runs for a {scenario}")
    return out


def is_always(cond: Any) -> bool:
    return isinstance(cond, str) and re.sub(r"\s+", "", strip_braces(cond)) == "always()"


def is_upload(step: dict) -> bool:
    return str(step.get("uses", "")).startswith("actions/upload-artifact@")


def is_cleanup(step: dict) -> bool:
    run = str(step.get("run", ""))
    return bool(re.search(r"clean", str(step.get("name", "")), re.I)) or any(
        k in run for k in ("docker compose down", "docker rm", "rm -rf")
    )


def check_always_steps(wf: dict) -> list[str]:
    out = []
    for name, job in self_hosted_jobs(wf).items():
        ss = steps(job)
        uploads = [i for i, s in enumerate(ss) if is_upload(s)]
        cleanups = [i for i, s in enumerate(ss) if is_cleanup(s)]
        if not uploads:
            out.append(f"job {name}: no results upload step")
        if not cleanups:
            out.append(f"job {name}: no cleanup step")
        for i in uploads + cleanups:
            if not is_always(ss[i].get("if")):
                out.append(f"job {name}: step {ss[i].get('name') or ss[i].get('uses')!r} lacks if: always()")
        if uploads and cleanups and min(cleanups) < max(uploads):
            out.append(f"job {name}: a cleanup step runs before the results are uploaded")
    return out


def check_strict(wf: dict) -> list[str]:
    out = []
    for name, job in self_hosted_jobs(wf).items():
        calls = [str(s["run"]) for s in steps(job) if "rlparity" in str(s.get("run", "")) and "--matrix" in s["run"]]
        if not calls:
            out.append(f"job {name}: no `rlparity run --matrix` call")
        out += [f"job {name}: rlparity run without --strict: {c.strip()!r}" for c in calls if "--strict" not in c]
    return out


def check_checkout_credentials(wf: dict) -> list[str]:
    out = []
    for name, job in jobs(wf).items():
        for s in steps(job):
            keeps = (s.get("with") or {}).get("persist-credentials") not in (False, "false")
            if str(s.get("uses", "")).startswith("actions/checkout@") and keeps:
                out.append(f"job {name}: checkout keeps the token in .git/config (persist-credentials)")
    return out


def check_pinned_actions(wf: dict) -> list[str]:
    out = []
    for name, job in jobs(wf).items():
        for s in steps(job):
            uses = s.get("uses")
            if not isinstance(uses, str) or uses.startswith(("./", "docker://")):
                continue
            ref = uses.rpartition("@")[2]
            if not SHA.match(ref):
                out.append(f"job {name}: {uses} is not pinned to a commit SHA")
    return out


UNTRUSTED = re.compile(r"\$\{\{[^}]*\b(github\.event\.|github\.head_ref)")


def check_no_untrusted_interpolation(wf: dict) -> list[str]:
    return [
        f"job {name}: run script interpolates {m.group(0)!r}...: pass it through env"
        for name, job in jobs(wf).items()
        for s in steps(job)
        for m in [UNTRUSTED.search(str(s.get("run", "")))]
        if m
    ]


def check_concurrency(wf: dict) -> list[str]:
    c = wf.get("concurrency")
    if not isinstance(c, dict) or not c.get("group"):
        return ["no concurrency group"]
    if c.get("cancel-in-progress") is not True:
        return ["concurrency without cancel-in-progress: true"]
    return []


def check_workflow(wf: dict, *, cancel_in_progress: bool = False) -> list[str]:
    out = []
    for check in (
        check_no_pull_request_target,
        check_permissions,
        check_timeouts,
        check_fork_guard,
        check_always_steps,
        check_strict,
        check_checkout_credentials,
        check_pinned_actions,
        check_no_untrusted_interpolation,
    ):
        out += check(wf)
    if cancel_in_progress:
        out += check_concurrency(wf)
    return out
