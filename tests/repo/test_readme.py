"""Every fenced code block of README.md works: python blocks run, shell blocks' commands are valid here.

The checker (tests/repo/readme_check.py) is itself tested: on small synthetic markdown and on a copy of the
README with a snippet broken, it must report the fault. The README's claims that have numbers or names in
them are held to their sources: docs/benchmarks.md for figures, the matrices for tiers, the harness's
workloads for where it starts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib

from rlparity.config import IMAGES_FILE

from repo import readme_check as rc

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
BLOCKS = rc.blocks(README)


def test_the_readme_has_code_blocks_of_each_kind() -> None:
    langs = {b.lang for b in BLOCKS}
    assert {"python", "bash"} <= langs, langs


@pytest.mark.slow
@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang == "python"], ids=lambda b: b.name)
def test_python_block_runs(block: rc.Block, tmp_path: Path) -> None:
    assert rc.run_python(block, tmp_path) == []


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.lang in rc.SHELL_LANGS], ids=lambda b: b.name)
def test_shell_block_commands_are_valid(block: rc.Block) -> None:
    assert rc.commands(block.text), "a shell block without a command"
    assert rc.check_shell(block, REPO) == []


def test_the_kernels_snippet_uses_bitwise_diff_right_after_import() -> None:
    (snippet,) = [  # the first block of "Using the kernels" (the quick start above it calls token_logprobs too)
        b.text
        for b in rc.blocks(_section(README, "Using the kernels"))
        if b.lang == "python" and "rl_kernel.token_logprobs" in b.text and "parallel" not in b.text
    ]
    assert "import rl_kernel\n" in snippet and "rl_kernel.bitwise.diff(" in snippet
    assert "from rl_kernel import bitwise" not in snippet and "import rl_kernel.bitwise" not in snippet
    assert "policy(" not in re.sub(r"#.*", "", snippet), "the snippet must run: no placeholder calls"


# ---- the checker itself must be able to fail ----------------------------------------------------------


def _md(lang: str, body: str) -> str:
    return f"intro\n\n```{lang}\n{body}\n```\n\ntail\n"


def test_blocks_reads_fences_and_languages() -> None:
    md = "a\n```python\nx = 1\n```\n```text\nnot code\n```\n````bash\nmake run\n````\n"
    assert [(b.lang, b.text, b.line) for b in rc.blocks(md)] == [
        ("python", "x = 1\n", 2),
        ("text", "not code\n", 5),
        ("bash", "make run\n", 8),
    ]
    with pytest.raises(ValueError, match="never closed"):
        rc.blocks("```python\nx = 1\n")


def test_commands_join_continuations_and_drop_comments() -> None:
    text = "A=1 B=2 docker compose run --rm test   # comment\n# only a comment\ncd x && make run \\\n  lint\n"
    assert rc.commands(text) == [["docker", "compose", "run", "--rm", "test"], ["cd", "x"], ["make", "run", "lint"]]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ("make no-such-target", "no such target"),
        ("rlparity run --no-such-flag", "the CLI rejects it"),
        ("rlparity no-such-command", "the CLI rejects it"),
        ("rlparity run --matrix $MATRIX --jobs many", "the CLI rejects it"),
        ("docker compose run --rm no-such-service", "no service 'no-such-service'"),
        ("docker compose up --exit-code-from nope test", "no service 'nope'"),
        ("docker-compose build nope", "no service 'nope'"),
        ("docker compose frobnicate", "unknown subcommand"),
        ("apptainer build x.sif docker/missing.def", "docker/missing.def does not exist"),
        ("curl https://example.com | sh", "unknown command 'curl'"),
        ("git push", "only git clone"),
    ],
)
def test_a_bad_shell_command_is_reported(body: str, problem: str, tmp_path: Path) -> None:
    problems = rc.check_markdown(_md("bash", body), REPO, tmp_path)
    assert problems and problem in problems[0], problems


@pytest.mark.parametrize(
    "body",
    [
        "make test lint",
        "rlparity run --matrix $MATRIX --strict --out results/",
        "RLPARITY_UID=1 docker compose run --rm test   # a comment",
        "docker compose up --exit-code-from test test",
        "git clone <this repository> rlparity && cd rlparity",
        "export X=$(id -u)\nmkdir -p results\necho $?",
        "apptainer build rlparity.sif docker/rlparity.def",
    ],
)
def test_a_good_shell_command_passes(body: str, tmp_path: Path) -> None:
    assert rc.check_markdown(_md("bash", body), REPO, tmp_path) == []


@pytest.mark.slow
def test_a_failing_python_block_is_reported_and_text_is_not_code(tmp_path: Path) -> None:
    assert (
        rc.check_markdown(_md("python", 'import rl_kernel\nprint(rl_kernel.tiers.get("exact").scope)'), REPO, tmp_path)
        == []
    )
    problems = rc.check_markdown(_md("python", "raise SystemExit('broken snippet')"), REPO, tmp_path)
    assert problems and "broken snippet" in problems[0]
    assert rc.check_markdown(_md("text", "rlparity run [--matrix quick|nightly]"), REPO, tmp_path) == []


def _broken_blocks(markdown: str) -> str:
    """The blocks of a broken copy of the README that differ from the README's own, as markdown: the checker
    runs only those (every unbroken block already runs in the tests above, and each python block takes seconds)."""
    kept = {b.text for b in BLOCKS}
    changed = [b for b in rc.blocks(markdown) if b.text not in kept]
    assert changed, "the copy breaks no block"
    return "".join(f"```{b.lang}\n{b.text}\n```\n\n" for b in changed)


@pytest.mark.slow
def test_a_broken_readme_copy_is_caught(tmp_path: Path) -> None:
    """The README's own snippets, each broken in a copy: the checker names the fault."""
    broken_python = README.replace("rl_kernel.bitwise.diff(rollout", "rl_kernel.bitwise.dif(rollout", 1)
    problems = rc.check_markdown(_broken_blocks(broken_python), REPO, tmp_path)
    assert any("AttributeError" in p and "dif" in p for p in problems), problems
    broken_make = README.replace("make run    #", "make runn   #", 1)
    problems = rc.check_markdown(_broken_blocks(broken_make), REPO, tmp_path)
    assert any("make runn: no such target" in p for p in problems), problems


# ---- claims held to their sources ------------------------------------------------------------------------


def _section(text: str, heading: str) -> str:
    """The body of a markdown section, up to the next heading of its level or above (not counting code)."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, ln in enumerate(lines) if re.fullmatch(rf"#+ {re.escape(heading)}\s*", ln)), None)
    assert start is not None, f"no section {heading!r}"
    level, in_code, body = len(lines[start]) - len(lines[start].lstrip("#")), False, []
    for ln in lines[start + 1 :]:
        if ln.lstrip().startswith(("```", "~~~")):
            in_code = not in_code
        elif not in_code and re.match(rf"#{{1,{level}}} ", ln):
            break
        body.append(ln)
    return "".join(body)


FLAT = " ".join(README.split())  # prose with line breaks removed


def test_tiers_are_defined_for_every_tier_a_matrix_names() -> None:
    tiers = set()
    from rlparity.config import MATRICES_DIR  # wherever the matrices live

    for toml in MATRICES_DIR.glob("*.toml"):
        for m in re.finditer(r"^tier\s*=\s*(.*)$", toml.read_text(), re.M):
            tiers |= set(re.findall(r'"(\w+)"', m.group(1)))
    assert tiers == {"exact", "fast"}, tiers
    section = _section(README, "Tiers")
    for tier in tiers:
        assert re.search(rf"^- \*\*{tier}\*\*", section, re.M), f"README's Tiers does not define {tier}"
    assert "same bits on every device" in section and "within one architecture" in section
    flat = " ".join(section.split())
    assert "No CPU kernels" in flat and '"no GPU"' in flat and "recorded per target" in flat
    numerics = (REPO / "docs" / "numerics.md").read_text()
    assert "**exact**" in numerics and "**fast**" in numerics and "within one architecture" in numerics
    nightly = (MATRICES_DIR / "nightly.toml").read_text()
    before_tier = nightly[: nightly.index('tier = ["exact", "fast"]')].splitlines()[-3:]
    assert any(line.startswith("# exact:") for line in before_tier) and any("# fast:" in ln for ln in before_tier)


def test_the_fast_tier_skips_on_a_cpu_as_the_readme_says() -> None:
    from rlparity import applicability
    from rlparity.inventory import Inventory

    from harness.factories import make_cell

    inv = Inventory(tiers={"fast": {"platforms": ["cuda", "rocm"], "dtypes": ["bf16"]}})
    assert applicability.skip_reason(make_cell("cpu", tier="fast", dtype="bf16"), inv).startswith("no GPU")


def test_the_headline_says_what_is_proven_and_where() -> None:
    """The headline claims the bits up to a Hugging Face model and qualifies it: CPU and H200 run, AMD not."""
    flat = " ".join(README[: README.index("## Two commands")].split())
    assert "makes them agree bit for bit, and proves it" not in flat  # the old, unqualified headline
    assert "What is proven today" in flat and "not yet run" in flat and "What is not yet" in flat
    assert "model workload" in flat


RECORD = "## 2026-12-01 (third session) — contract v3"  # the record README's figures quote


def _record_section() -> str:
    record = (REPO / "docs" / "benchmarks.md").read_text()
    return record[record.index(RECORD) :].split("\n## ", 1)[0]


def test_comparison_counts_match_the_benchmark_record() -> None:
    bench = _record_section()
    m = re.search(r"(\d+)/(\d+) comparisons\s+bitwise equal, of which \*\*(\d+)/\d+ CPU vs GPU\*\*", bench)
    assert m, "the record's self-check count"
    total, cpu_gpu = int(m.group(1)), int(m.group(3))
    assert f"{total} of {total}" in FLAT and f"of which {cpu_gpu} are CPU vs GPU" in FLAT
    r2r, batch = (
        int(x) for x in re.search(r"GPU run-to-run \((\d+)\) and batch invariance on the GPU \((\d+)\)", FLAT).groups()
    )
    assert cpu_gpu + r2r + batch == total


def test_speed_claims_name_every_baseline_with_recorded_figures() -> None:
    """Every row of README's speed table is a row of the record's tables: the same contender, the same ms
    and x floor, and every baseline a user would pick is named (copy, stock, torch.compile, Liger)."""
    bench = _record_section()
    table = README[README.index("| dtype | contender | synced ms | x floor |") :].split("\n\n", 1)[0]
    rows = re.findall(r"^\| (bf16|fp32) \| ([^|]+) \| ([\d.]+) \| ([\d.]+) \|$", table, re.M)
    assert len(rows) == 7, rows
    for dtype, who, ms, floor in rows:
        key = {"rl": "rl token_logprobs", "`tor": "torch.compile", "Lig": "Liger", "tor": "torch log_softmax"}
        name = next(v for k, v in key.items() if who.startswith(k))
        recorded = [
            line
            for line in bench.splitlines()
            if line.startswith(f"| {dtype} | 4096 |") and name in line.replace("`", "")
        ]
        cells = [[c.strip().strip("*") for c in line.split("|")] for line in recorded]
        assert any(any(x.startswith(ms) for x in c) and floor in c for c in cells), (dtype, who, ms, floor, recorded)
    for baseline in ("torch.compile", "Liger", "log_softmax(x.float()"):
        assert baseline in table
    assert "not met" in FLAT  # the targets are said to be missed, not hidden


def test_the_readme_warns_to_run_rl_kernel_on_both_sides() -> None:
    text = _section(README, "Using the kernels")
    m = re.search(r"^> \*\*Warning: run the same rl_kernel function on both sides\.\*\*(.*?)\n\n", text, re.M | re.S)
    assert m, "the warning box is missing"
    warning = " ".join(m.group(1).replace("> ", " ").split())
    assert "one side only" in warning and "gives different bits" in warning
    assert (REPO / "tests" / "kernels" / "test_one_side_only.py").is_file()


def _images_table(text: str) -> dict[str, list[str]]:
    """README's images table (after its marker comment): entry name -> its cells."""
    body = text.split("<!-- images-table:", 1)[1].split("\n\n", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in body.splitlines()[1:] if line.startswith("|")]
    return {re.match(r"`([^`]+)`", r[0]).group(1): r for r in rows[2:]}


def test_the_images_table_says_what_is_published_pinned_and_what_verified() -> None:
    """Each images.toml entry has a row with its tag, the start of its digest, where it was pinned from, and
    whether it is verified; a stale row (the digest or the verification changed in the file) fails."""
    entries = tomllib.loads(IMAGES_FILE.read_text())["images"]
    table = _images_table(README)
    assert set(table) == set(entries), (sorted(table), sorted(entries))
    for name, e in entries.items():
        _, tag, _, digest, source, verified = table[name]
        if not e["digest"]:
            assert "built locally" in digest, name
            continue
        assert tag == f"`{e['tag']}`", name
        assert digest.strip("`…") and e["digest"].startswith(digest.strip("`…")), (name, digest)
        assert source.startswith("published") == e["digest_source"].startswith("published"), name
        assert verified == ("yes" if e.get("verified") else "no"), name
