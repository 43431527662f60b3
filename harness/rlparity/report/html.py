"""report.html: one self-contained page (CSS inline, plots as base64 data URIs) that lists every cell.

Formats sections.py's tables (their `full` variants); every value is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
from typing import Any

from rlparity.report import sections
from rlparity.report.model import Report
from rlparity.report.sections import NO_BASELINE, Section
from rlparity.results import STATUSES

NAME = "report.html"
HTML_ROWS = 5000  # rows per table: a browser still opens the page
CSS = """body{font:14px/1.4 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#1f2328}
table{border-collapse:collapse;margin:.5em 0}th,td{border:1px solid #d0d7de;padding:2px 8px;text-align:left}
th{background:#f6f8fa}code,td.c{font-family:ui-monospace,monospace;font-size:12px}img{max-width:100%}
.passed{color:#1a7f37}.failed{color:#cf222e;font-weight:bold}.error{color:#8250df;font-weight:bold}
.skipped{color:#6e7781}.muted{color:#6e7781}"""


def _h(s: Any) -> str:
    return html.escape(str(s))


def table(header: list[str], rows: list[list[str]], code: frozenset[str] = frozenset()) -> str:
    """A table; a status value gets its colour class, a code column the monospace one."""
    head = "".join(f"<th>{_h(h)}</th>" for h in header)
    body = []
    for row in rows[:HTML_ROWS]:
        tds = []
        for h, v in zip(header, row, strict=True):
            cls = v if v in STATUSES else "c" if h in code else ""
            tds.append(f'<td class="{cls}">{_h(v)}</td>' if cls else f"<td>{_h(v)}</td>")
        body.append("<tr>" + "".join(tds) + "</tr>")
    more = f'<p class="muted">… and {len(rows) - HTML_ROWS} more</p>' if len(rows) > HTML_ROWS else ""
    return f"<table><tr>{head}</tr>{''.join(body)}</table>{more}"


def _section(sec: Section) -> list[str]:
    out = [f"<h2>{_h(sec.title)}</h2>"]
    if sec.note:
        out.append(f'<p class="muted">{_h(sec.note)}</p>')
    return [*out, table(sec.header, sec.rows, sec.code) if sec.rows else f"<p>{_h(sec.empty)}.</p>"]


def _sources(sources: list[tuple[str, int]]) -> str:
    return ", ".join(f"<code>{_h(lbl)}</code> ({n} cells)" for lbl, n in sources)


def _head(rep: Report) -> list[str]:
    base = _sources(rep.baseline_sources or []) if rep.has_baseline else NO_BASELINE
    return [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8"><title>rlparity report</title>',
        f"<style>{CSS}</style></head><body>",
        "<h1>rlparity report</h1>",
        f"<p>Results: {_sources(rep.sources)}. Baseline: {base}.</p>",
        *(f"<p><b>{_h(line)}</b></p>" for line in sections.summary_lines(rep)),
    ]


def _totals(rep: Report) -> list[str]:
    t = rep.totals
    out = ["<h2>Totals</h2>", *(table(s.header, s.rows, s.code) for s in sections.totals(rep))]
    if t.reasons:
        out += ["<p>Gate reasons:</p><ul>", *(f"<li>{_h(r)}</li>" for r in t.reasons), "</ul>"]
    if rep.regressions:
        out += ["<p>Regressions (--fail-on-regression fails on these):</p><ul>"]
        out += [*(f'<li class="failed">{_h(r)}</li>' for r in rep.regressions), "</ul>"]
    if t.skipped_reasons:
        out += ["<details><summary>Skipped cells by reason</summary><ul>"]
        out += [*(f"<li>{n} × {_h(r)}</li>" for r, n in t.skipped_reasons), "</ul></details>"]
    out += [f'<p class="muted">Note: {_h(n)}</p>' for n in rep.notes]
    if rep.gone:
        listed = ", ".join(f"<code>{_h(g)}</code>" for g in rep.gone)
        out.append(f"<p>Cells that ran in the baseline but are not in these results ({len(rep.gone)}): {listed}</p>")
    return out


def _plots(plots: dict[str, bytes]) -> list[str]:
    """Each PNG inline as a data URI: the page needs no other file."""
    out = []
    for title, data in plots.items():
        b64 = base64.b64encode(data).decode("ascii")
        out.append(f'<h3>{_h(title)}</h3><img alt="{_h(title)}" src="data:image/png;base64,{b64}">')
    return out


def render_html(rep: Report, plots: dict[str, bytes] | None = None) -> str:
    parts = _head(rep) + _totals(rep) + _plots(plots or {})
    parts += _section(sections.failures(rep, full=True))
    for sec in [*sections.comparisons(rep, full=True), sections.mismatch(rep), *sections.history(rep)]:
        parts += _section(sec)
    every = sections.cells("All cells", rep.entries)
    parts += [f"<h2>{_h(every.title)}</h2>", table(every.header, every.rows, every.code), "</body></html>"]
    return "\n".join(parts) + "\n"
