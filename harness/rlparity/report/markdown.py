"""report.md: the compact page for a GitHub job summary (< 1 MiB). Formats sections.py's tables.

Tables stop at MD_ROWS rows ("... and N more (see report.html)"); passing cells are counted per target and
listed only when at most MD_ROWS cells ran.
"""

from __future__ import annotations

import html

from rlparity.report import sections
from rlparity.report.html import NAME as HTML_NAME  # where the rows cut here are
from rlparity.report.model import Report
from rlparity.report.sections import NO_BASELINE, VERDICT, Section, short, status_line

NAME = "report.md"
MD_ROWS = 40  # rows per Markdown table before "... and N more (report.html)"
MD_LIMIT = 1024 * 1024 - 16 * 1024  # GitHub's job summary takes at most 1 MiB
STOCK_NOTE = "Stock drift: informational stock-PyTorch comparisons that differ / all of them, over the cells that ran."


def cell(s: str, code: bool = False) -> str:
    """One table cell (or list item) on one line: code in backticks, other text HTML-escaped; pipes escaped."""
    s = " ".join(str(s).split())
    if code and s:
        return "`" + s.replace("`", "'").replace("|", "\\|") + "`"
    return html.escape(s, quote=False).replace("|", "\\|")


def table(header: list[str], rows: list[list[str]], limit: int = MD_ROWS, code: frozenset[str] = frozenset()) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows[:limit]:
        lines.append("| " + " | ".join(cell(v, h in code) for h, v in zip(header, row, strict=True)) + " |")
    if len(rows) > limit:
        lines.append(f"\n… and {len(rows) - limit} more (see {HTML_NAME})")
    return "\n".join(lines)


def _section(sec: Section) -> list[str]:
    out = [f"## {sec.title}", ""]
    if sec.note:
        out += [sec.note, ""]
    return [*out, table(sec.header, sec.rows, code=sec.code) if sec.rows else sec.empty + ".", ""]


def _sources(sources: list[tuple[str, int]] | None) -> str:
    return ", ".join(f"`{label}` ({n} cells)" for label, n in sources or [])


def _head(rep: Report) -> list[str]:
    t = rep.totals
    base = (_sources(rep.baseline_sources) or "given") if rep.has_baseline else NO_BASELINE
    verdict = VERDICT.get(t.verdict, str(t.verdict))
    if rep.regressions:
        reg = f"**{len(rep.regressions)} regression(s)**"
    else:
        reg = "no regressions" if rep.has_baseline else "regressions: " + NO_BASELINE
    return [
        "# rlparity report",
        "",
        f"Results: {_sources(rep.sources) or '(none)'}. Baseline: {base}.",
        "",
        f"**Gate: {verdict}** · {reg} · {status_line(t.counts)}",
        "",
    ]


def _bullets(items: list[str], limit: int) -> list[str]:
    return items[:limit] + ([f"- … and {len(items) - limit} more"] if len(items) > limit else [])


def _totals(rep: Report) -> list[str]:
    t = rep.totals
    by_kind, by_target = sections.totals(rep)
    out = ["## Totals", "", table(by_kind.header, by_kind.rows), "", table(by_target.header, by_target.rows), ""]
    out += [STOCK_NOTE, ""]
    if t.reasons:
        out += ["Gate reasons:", "", *_bullets([f"- {cell(short(r, 300))}" for r in t.reasons], 10), ""]
    if rep.regressions:
        out += ["Regressions (`--fail-on-regression` fails on these):", ""]
        out += [*_bullets([f"- {cell(r)}" for r in rep.regressions], MD_ROWS), ""]
    if t.skipped_reasons:
        out += ["<details><summary>Skipped cells by reason</summary>", ""]
        out += [f"- {n} × {cell(short(r, 200))}" for r, n in t.skipped_reasons[:20]]
        out += ["", "</details>", ""]
    for note in rep.notes:
        out += [f"Note: {cell(note)}", ""]
    if rep.gone:
        listed = ", ".join(f"`{g}`" for g in rep.gone[:20]) + (" …" if len(rep.gone) > 20 else "")
        out += [f"Cells that ran in the baseline but are not in these results ({len(rep.gone)}): {listed}", ""]
    return out


def _cells(rep: Report) -> list[str]:
    ran = [e for e in rep.entries if e.status != "skipped"]
    out = ["## Cells", ""]
    if ran and len(ran) <= MD_ROWS:
        listed = sections.cells("Cells that ran", ran)
        table_md = table(listed.header, listed.rows, code=listed.code)
        out += [f"<details><summary>{listed.title}</summary>", "", table_md, "", "</details>", ""]
    return [*out, f"{len(ran)} cell(s) ran; every cell and the plots are in {HTML_NAME}.", ""]


def render_markdown(rep: Report) -> str:
    out = _head(rep) + _totals(rep) + _section(sections.failures(rep, full=False))
    for sec in [*sections.comparisons(rep, full=False), sections.mismatch(rep), *sections.history(rep)]:
        out += _section(sec)
    text = "\n".join(out + _cells(rep))
    if len(text.encode()) > MD_LIMIT:
        cut = text.encode()[:MD_LIMIT].decode(errors="ignore")
        text = cut + f"\n\n… truncated at {MD_LIMIT} bytes (see {HTML_NAME})\n"
    return text
