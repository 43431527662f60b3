"""Every fenced code block of a markdown file, checked: python blocks run, bash blocks' commands are validated.

```python blocks are executed in a fresh interpreter (this python, a temporary working directory).
```bash / ```sh / ```shell / ```console blocks are read command by command (continuation lines joined,
comments dropped, `a && b` split, leading VAR=value assignments removed) and each command is checked
against the repository rather than run:

  make X            the Makefile has target X (`make -n X` succeeds)
  rlparity ARGS     `rlparity.cli.parser().parse_args(ARGS)` accepts them ($VAR placeholders expanded)
  docker compose    compose.yaml has every service the command names (also docker-compose)
  apptainer ...     the .def file it names exists (docker/rlparity.def when it names none)
  git clone, cd, export, mkdir, echo   accepted

Anything else is reported as an unknown command: a new kind of command must be taught here.
Other fences (```text, ``` with no language, ...) are not code.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

SHELL_LANGS = {"bash", "sh", "shell", "console"}
ACCEPTED = {"cd", "export", "mkdir", "echo"}
# example values for the placeholders README commands use
PLACEHOLDERS = {"PWD": "/work", "HOME": "/home/user", "MATRIX": "quick", "OUT": "/tmp/out", "GPU_TARGETS": "gfx942"}
# docker compose options that take a value (global and per subcommand)
COMPOSE_VALUE_OPTS = {
    "-f", "--file", "-p", "--project-name", "--profile", "--env-file", "--project-directory",
    "--exit-code-from", "-e", "--env", "-u", "--user", "-w", "--workdir", "--entrypoint", "-v", "--volume",
    "--name", "--scale", "-t", "--timeout", "--build-arg", "--label", "-l", "--pull", "--progress",
}  # fmt: skip
COMPOSE_SUBCOMMANDS = {"build", "run", "up", "down", "pull", "push", "logs", "config", "ps", "create", "start", "stop"}


@dataclass(frozen=True)
class Block:
    lang: str
    text: str
    line: int  # of the opening fence, 1-based

    @property
    def name(self) -> str:
        return f"{self.lang}@{self.line}"


def blocks(markdown: str) -> list[Block]:
    """The fenced blocks of a markdown text, with their language (lower case; '' when none)."""
    out: list[Block] = []
    fence: str | None = None
    lang, start, body = "", 0, []
    for n, line in enumerate(markdown.splitlines(), 1):
        m = re.match(r"^ {0,3}(`{3,}|~{3,})\s*([\w+-]*)", line)
        if fence is None:
            if m:
                fence, lang, start, body = m.group(1), m.group(2).lower(), n, []
        elif m and line.strip().startswith(fence) and not line.strip()[len(fence) :].strip():
            out.append(Block(lang, "\n".join(body) + "\n", start))
            fence = None
        else:
            body.append(line)
    if fence is not None:
        raise ValueError(f"fence opened on line {start} is never closed")
    return out


def commands(text: str) -> list[list[str]]:
    """The commands of a shell block as argument lists: continuations joined, comments dropped, && split."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        words = shlex.split(line, comments=True)
        cmd: list[str] = []
        for w in [*words, "&&"]:
            if w in {"&&", "||", ";"}:
                while cmd and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", cmd[0]):
                    cmd.pop(0)  # VAR=value before a command
                if cmd:
                    out.append(cmd)
                cmd = []
            else:
                cmd.append(w)
    return out


def expand(arg: str) -> str:
    def value(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        return PLACEHOLDERS.get(name, f"example-{name.lower()}")

    return re.sub(r"\$\{(\w+)[^}]*\}|\$(\w+)", value, arg)


def _compose_services(args: list[str], repo: Path) -> list[str]:
    problems = []
    compose = repo / "compose.yaml"
    if not compose.is_file():
        return ["compose.yaml does not exist"]
    services = set((yaml.safe_load(compose.read_text()) or {}).get("services", {}))
    i, sub, named = 0, None, []
    while i < len(args):
        a = args[i]
        if a in COMPOSE_VALUE_OPTS:
            if a == "--exit-code-from" and i + 1 < len(args):
                named.append(args[i + 1])
            i += 2
            continue
        if a.startswith("-"):
            i += 1
            continue
        if sub is None:
            sub = a
            if sub not in COMPOSE_SUBCOMMANDS:
                return [f"docker compose {sub}: unknown subcommand"]
        else:
            named.append(a)
            if sub == "run":  # the rest is the command run in the service
                break
        i += 1
    if sub is None:
        return ["docker compose without a subcommand"]
    if sub == "run" and not named:
        problems.append("docker compose run names no service")
    problems += [f"compose.yaml has no service {s!r}" for s in named if s not in services]
    return problems


def _rlparity_args(args: list[str]) -> list[str]:
    argv = [expand(a) for a in args]
    code = (
        "import json, sys\n"
        "from rlparity.cli import parser\n"
        "try:\n"
        "    parser().parse_args(json.loads(sys.argv[1]))\n"
        "except SystemExit as e:\n"
        "    sys.exit(10 if e.code else 0)\n"
    )
    res = subprocess.run([sys.executable, "-c", code, json.dumps(argv)], capture_output=True, text=True, timeout=120)
    if res.returncode:
        tail = (res.stderr.strip().splitlines() or ["?"])[-1]
        return [f"rlparity {' '.join(argv)}: the CLI rejects it: {tail}"]
    return []


def check_command(cmd: list[str], repo: Path) -> list[str]:
    """What is wrong with one command of a shell block ([] when it is valid here)."""
    head, args = cmd[0], cmd[1:]
    if head in ACCEPTED:
        return []
    if head == "git":
        return [] if args[:1] == ["clone"] else [f"git {' '.join(args[:1])}: only git clone is accepted"]
    if head == "make":
        targets = [a for a in args if not a.startswith("-") and "=" not in a]
        if not targets:
            return ["make without a target"]
        res = subprocess.run(["make", "-n", "-C", str(repo), *targets], capture_output=True, text=True, timeout=120)
        return [] if res.returncode == 0 else [f"make {' '.join(targets)}: no such target ({res.stderr.strip()})"]
    if head == "rlparity":
        return _rlparity_args(args)
    if head == "docker-compose":
        return _compose_services(args, repo)
    if head == "docker" and args[:1] == ["compose"]:
        return _compose_services(args[1:], repo)
    if head == "apptainer":
        defs = [a for a in args if a.endswith(".def")] or ["docker/rlparity.def"]
        return [f"apptainer: {d} does not exist" for d in defs if not (repo / d).is_file()]
    return [f"unknown command {head!r} ({shlex.join(cmd)}): teach tests/repo/readme_check.py"]


def check_shell(block: Block, repo: Path) -> list[str]:
    return [p for cmd in commands(block.text) for p in check_command(cmd, repo)]


def run_python(block: Block, cwd: Path, timeout: float = 600) -> list[str]:
    res = subprocess.run([sys.executable, "-c", block.text], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    if res.returncode:
        return [f"python block at line {block.line} failed ({res.returncode}): {res.stderr.strip()[-1500:]}"]
    return []


def check_block(block: Block, repo: Path, cwd: Path) -> list[str]:
    """Problems with one block; [] for a good block or one that is not code."""
    if block.lang == "python":
        return run_python(block, cwd)
    if block.lang in SHELL_LANGS:
        return check_shell(block, repo)
    return []


def check_markdown(markdown: str, repo: Path, cwd: Path) -> list[str]:
    return [f"line {b.line}: {p}" for b in blocks(markdown) for p in check_block(b, repo, cwd)]
