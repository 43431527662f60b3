"""The GitHub Actions workflows (.github/workflows/*.yml): actionlint, and the safety rules checked statically.

actionlint must be installed (`.ci/run` and the workflows install it): under CI=true a missing binary is a
failure, elsewhere a skip. The safety rules are plain functions over the parsed workflow (PyYAML reads the
`on:` key as True); each takes a workflow dict and returns its violations, and the negative controls below
feed deliberately unsafe workflows through the same functions.

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
import math
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from tooling import find_tool, require

try:
    import yaml
except ImportError:  # pragma: no cover - PyYAML is installed by CI
    yaml = None

ROOT = Path(__file__).resolve().parents[1]
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


# ---- GitHub's expression language: enough of it to evaluate an `if:` --------------------------------------
class UnsupportedExpression(ValueError):
    pass


_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<num>0x[0-9a-fA-F]+|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)"
    r"|(?P<op>&&|\|\||==|!=|<=|>=|<|>|!|\(|\)|\[|\]|\.|,|\*)|(?P<ident>[A-Za-z_][A-Za-z0-9_-]*))"
)


class _Filtered(list):
    """The result of a `.*` object filter: a following property access maps over the elements."""


def _tokens(expr: str) -> list[tuple[str, str]]:
    out, pos, expr = [], 0, expr.strip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        if not m or m.end() == pos:
            raise UnsupportedExpression(f"cannot read {expr[pos:]!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def _number(v: Any) -> float:
    if v is None:
        return 0.0
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float):
        return float(v)
    if isinstance(v, str):
        s = v.strip()
        if not s:
            return 0.0
        try:
            return float(int(s, 16)) if s.lower().startswith("0x") else float(s)
        except ValueError:
            return math.nan
    return math.nan


def truthy(v: Any) -> bool:
    if isinstance(v, float) and math.isnan(v):
        return False
    return v not in (False, None, 0, "") if not isinstance(v, list | dict) else True


def loose_eq(a: Any, b: Any) -> bool:
    """GitHub's ==: strings compare case-insensitively; mixed types are compared as numbers."""
    if isinstance(a, str) and isinstance(b, str):
        return a.casefold() == b.casefold()
    if isinstance(a, list | dict) or isinstance(b, list | dict):
        return a is b
    if type(a) is type(b):
        return a == b
    return _number(a) == _number(b)


def _contains(search: Any, item: Any) -> bool:
    if isinstance(search, list):
        return any(loose_eq(x, item) for x in search)
    return str(item if item is not None else "").casefold() in str(search if search is not None else "").casefold()


def _str(v: Any) -> str:
    return "" if v is None else ("true" if v is True else "false" if v is False else str(v))


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "contains": _contains,
    "startswith": lambda a, b: _str(a).casefold().startswith(_str(b).casefold()),
    "endswith": lambda a, b: _str(a).casefold().endswith(_str(b).casefold()),
    "always": lambda: True,
    "success": lambda: True,
    "failure": lambda: False,
    "cancelled": lambda: False,
}


class _Parser:
    def __init__(self, expr: str, context: dict) -> None:
        self.toks, self.i, self.ctx = _tokens(expr), 0, context

    def peek(self) -> str | None:
        return self.toks[self.i][1] if self.i < len(self.toks) else None

    def take(self, want: str | None = None) -> tuple[str, str]:
        if self.i >= len(self.toks) or (want is not None and self.toks[self.i][1] != want):
            raise UnsupportedExpression(f"expected {want!r} at token {self.i}")
        self.i += 1
        return self.toks[self.i - 1]

    def parse(self) -> Any:
        v = self.or_()
        if self.i != len(self.toks):
            raise UnsupportedExpression(f"unexpected {self.peek()!r}")
        return v

    def or_(self) -> Any:
        v = self.and_()
        while self.peek() == "||":
            self.take()
            rhs = self.and_()
            v = v if truthy(v) else rhs
        return v

    def and_(self) -> Any:
        v = self.cmp()
        while self.peek() == "&&":
            self.take()
            rhs = self.cmp()
            v = rhs if truthy(v) else v
        return v

    def cmp(self) -> Any:
        v = self.unary()
        while self.peek() in ("==", "!=", "<", "<=", ">", ">="):
            op = self.take()[1]
            rhs = self.unary()
            if op in ("==", "!="):
                v = loose_eq(v, rhs) == (op == "==")
            else:
                a, b = _number(v), _number(rhs)
                v = {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
        return v

    def unary(self) -> Any:
        if self.peek() == "!":
            self.take()
            return not truthy(self.unary())
        return self.postfix()

    def postfix(self) -> Any:
        v = self.primary()
        while self.peek() in (".", "["):
            if self.take()[1] == ".":
                kind, name = self.take()
                if name == "*":
                    v = self.star(v)
                elif kind == "ident":
                    v = self.prop(v, name)
                else:
                    raise UnsupportedExpression(f"bad property {name!r}")
            else:
                if self.peek() == "*":
                    self.take()
                    v = self.star(v)
                else:
                    v = self.prop(v, _str(self.or_()))
                self.take("]")
        return v

    @staticmethod
    def star(v: Any) -> _Filtered:
        if isinstance(v, dict):
            return _Filtered(v.values())
        return _Filtered(v if isinstance(v, list) else [])

    def prop(self, v: Any, name: str) -> Any:
        if isinstance(v, _Filtered):
            return _Filtered(x for x in (self.prop(e, name) for e in v) if x is not None)
        if isinstance(v, dict):
            for k, val in v.items():
                if str(k).casefold() == name.casefold():
                    return val
        return None

    def primary(self) -> Any:
        kind, tok = self.take()
        if kind == "str":
            return tok[1:-1].replace("''", "'")
        if kind == "num":
            return _number(tok)
        if tok == "(":
            v = self.or_()
            self.take(")")
            return v
        if kind != "ident":
            raise UnsupportedExpression(f"unexpected {tok!r}")
        if tok in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[tok]
        if self.peek() == "(":
            fn = FUNCTIONS.get(tok.casefold())
            if fn is None:
                raise UnsupportedExpression(f"function {tok}() is not modelled here")
            self.take("(")
            args = []
            while self.peek() != ")":
                args.append(self.or_())
                if self.peek() == ",":
                    self.take()
            self.take(")")
            return fn(*args)
        return self.prop(self.ctx, tok)


def strip_braces(expr: str) -> str:
    s = expr.strip()
    return s[3:-2].strip() if s.startswith("${{") and s.endswith("}}") else s


def evaluate(expr: str, context: dict) -> Any:
    return _Parser(strip_braces(expr), context).parse()


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


def _is_always(cond: Any) -> bool:
    return isinstance(cond, str) and re.sub(r"\s+", "", strip_braces(cond)) == "always()"


def _is_upload(step: dict) -> bool:
    return str(step.get("uses", "")).startswith("actions/upload-artifact@")


def _is_cleanup(step: dict) -> bool:
    run = str(step.get("run", ""))
    return bool(re.search(r"clean", str(step.get("name", "")), re.I)) or any(
        k in run for k in ("docker compose down", "docker rm", "rm -rf")
    )


def check_always_steps(wf: dict) -> list[str]:
    out = []
    for name, job in self_hosted_jobs(wf).items():
        ss = steps(job)
        uploads = [i for i, s in enumerate(ss) if _is_upload(s)]
        cleanups = [i for i, s in enumerate(ss) if _is_cleanup(s)]
        if not uploads:
            out.append(f"job {name}: no results upload step")
        if not cleanups:
            out.append(f"job {name}: no cleanup step")
        for i in uploads + cleanups:
            if not _is_always(ss[i].get("if")):
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


# ---- actionlint --------------------------------------------------------------------------------------------
def actionlint() -> str | None:
    return find_tool("actionlint")


def test_workflows_exist() -> None:
    names = {p.name for p in workflow_files()}
    assert {"ci.yml", "nightly.yml"} <= names, names
    assert ACTIONLINT_CONFIG.is_file(), "the self-hosted runner labels are declared in .github/actionlint.yaml"


def test_actionlint_passes() -> None:
    binary = actionlint()
    require("actionlint", binary)
    files = [str(p.relative_to(ROOT)) for p in workflow_files()]
    proc = subprocess.run(
        [binary, "-no-color", "-config-file", str(ACTIONLINT_CONFIG.relative_to(ROOT)), *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path: Path) -> None:
    """Negative control: the binary found really lints (a stub that always exits 0 would pass the test above)."""
    binary = actionlint()
    require("actionlint", binary)
    bad = tmp_path / ".github" / "workflows" / "bad.yml"
    bad.parent.mkdir(parents=True)
    bad.write_text(
        "on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    timeout-minutes: 5\n"
        "    steps:\n      - run: echo ${{ github.event.no_such_thing.oops( }}\n"
        "      - uses: actions/checkout@v4\n        with:\n          no-such-input: 1\n"
    )
    proc = subprocess.run([binary, "-no-color", str(bad)], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "bad.yml:7:" in proc.stdout, proc.stdout


def test_shellcheck_available_to_actionlint() -> None:
    """actionlint checks run: scripts with shellcheck only where shellcheck is on PATH (it is on GitHub's runners)."""
    require("shellcheck", find_tool("shellcheck"))


# ---- the safety rules on the real workflows ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["ci.yml", "nightly.yml"])
def test_workflow_is_safe(name: str) -> None:
    wf = load(WORKFLOWS / name)
    assert check_workflow(wf, cancel_in_progress=name == "ci.yml") == []


def test_every_workflow_file_is_safe() -> None:
    for path in workflow_files():
        assert check_workflow(load(path)) == [], path.name


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
    assert "--matrix quick" in run and '--filter "target=cpu|${GFX}"' in run


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
            lambda m: _str(evaluate(m.group(1), {**ctx, "github": {**ctx["github"], "workflow": "ci"}})),
            group,
            flags=re.S,
        )

    push = resolve(pr_context(fork=True, action="synchronize"))
    safe = resolve(pr_context(fork=True, action="labeled", labels=(SAFE_LABEL,), label=SAFE_LABEL))
    bug = resolve(pr_context(fork=True, action="labeled", labels=("bug",), label="bug"))
    assert len({push, safe, bug}) == 3, (push, safe, bug)
    assert push == resolve(pr_context(fork=True, action="opened")), "a new push must cancel the previous run"


def test_nightly_layout() -> None:
    wf = load(WORKFLOWS / "nightly.yml")
    on = triggers(wf)
    assert set(on) == {"schedule", "workflow_dispatch"} and on["schedule"][0]["cron"]
    amd, summary = wf["jobs"]["amd"], wf["jobs"]["summary"]
    sets = runner_labels(amd)
    assert sets and ["self-hosted", "linux", "rocm", "gfx90a", "dual-gcd"] in sets
    assert all(labels[:3] == ["self-hosted", "linux", "rocm"] for labels in sets)
    assert truthy(evaluate(amd["if"], event_context("schedule")))
    upload = next(s for s in steps(amd) if _is_upload(s))
    assert upload["with"]["name"] == "results-${{ matrix.label }}"
    assert summary["needs"] == ["amd"] and _is_always(summary["if"])
    assert summary["permissions"] == {"contents": "read", "actions": "read"}
    assert not is_self_hosted(summary)
    download = next(s for s in steps(summary) if str(s.get("uses", "")).startswith("actions/download-artifact@"))
    assert download["with"]["pattern"] == "results-*"
    scripts = "\n".join(str(s.get("run", "")) for s in steps(summary))
    assert "gh run download" in scripts and "rlparity report" in scripts and "GITHUB_STEP_SUMMARY" in scripts


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
    "upload without always()": ("ci.yml", lambda wf: _step(_job(wf, "amd"), _is_upload).pop("if")),
    "cleanup without always()": ("nightly.yml", lambda wf: _step(_job(wf, "amd"), _is_cleanup).pop("if")),
    "no upload step": ("ci.yml", lambda wf: _job(wf, "amd")["steps"].remove(_step(_job(wf, "amd"), _is_upload))),
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


def test_expression_evaluator() -> None:
    ctx = pr_context(fork=True, action="labeled", labels=("A", SAFE_LABEL), label="A")
    assert evaluate("${{ github.event_name == 'PULL_REQUEST' }}", ctx) is True  # case-insensitive strings
    assert evaluate("contains(github.event.pull_request.labels.*.name, 'safe-to-test')", ctx) is True
    assert evaluate("github.event.pull_request.head.repo.full_name == github.repository", ctx) is False
    assert evaluate("github.event['label'].name", ctx) == "A"
    assert evaluate("!(1 == 2) && 'x' || 'y'", ctx) == "x"
    assert evaluate("null == 0 && '' == 0 && 'it''s' == 'IT''S'", ctx) is True
    assert evaluate("github.no.such.thing", ctx) is None
    assert evaluate("startsWith(github.ref, 'refs/pull/') && endsWith(github.ref, '/MERGE')", ctx) is True
    with pytest.raises(UnsupportedExpression):
        evaluate("fromJSON('[]')", ctx)
    with pytest.raises(UnsupportedExpression):
        evaluate("github.event_name == ", ctx)
