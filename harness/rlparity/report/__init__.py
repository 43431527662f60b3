"""`rlparity report`: the nightly regression report (report.md + report.html), as a package.

The data flows load -> rules -> sections -> markdown / html (+ plots):

- model.py: the dataclasses, and the edges: reading results dirs (`load`) and merging runners (`merge`);
- rules.py: the comparisons, pure functions (`build` runs them all into a Report);
- history.py: the nightly trend over --history dirs, pure (`trend`, given to `build`);
- sections.py: every table of the report, as plain-text rows (the one place that decides them);
- markdown.py, html.py: format those tables; plots.py: the only matplotlib user;
- output.py: `write` puts report.md and report.html in a directory.

The command line is rlparity.report.command (`rlparity report`, `python -m rlparity.report`). The rules are in
docs/harness.md.
"""

from __future__ import annotations

from rlparity.report.history import order, trend
from rlparity.report.html import HTML_ROWS, render_html
from rlparity.report.html import NAME as HTML_NAME
from rlparity.report.markdown import MD_LIMIT, MD_ROWS, render_markdown
from rlparity.report.markdown import NAME as MD_NAME
from rlparity.report.model import (
    DEFAULT_THRESHOLD,
    MIN_SECONDS,
    Drift,
    Entry,
    EnvChange,
    Failure,
    History,
    Night,
    NightCount,
    Onset,
    PerfDelta,
    Report,
    StatusChange,
    StockDrift,
    Totals,
    labels,
    load,
    load_nights,
    merge,
)
from rlparity.report.output import write
from rlparity.report.plots import make_plots
from rlparity.report.rules import (
    build,
    digest_drift,
    env_changes,
    failures,
    fixed,
    match,
    new_failures,
    perf_deltas,
    regressions,
    stock_drift,
    totals,
)
from rlparity.report.sections import NO_BASELINE, Section, summary_lines

__all__ = [
    "DEFAULT_THRESHOLD",
    "HTML_NAME",
    "HTML_ROWS",
    "MD_LIMIT",
    "MD_NAME",
    "MD_ROWS",
    "MIN_SECONDS",
    "NO_BASELINE",
    "Drift",
    "Entry",
    "EnvChange",
    "Failure",
    "History",
    "Night",
    "NightCount",
    "Onset",
    "PerfDelta",
    "Report",
    "Section",
    "StatusChange",
    "StockDrift",
    "Totals",
    "build",
    "digest_drift",
    "env_changes",
    "failures",
    "fixed",
    "labels",
    "load",
    "load_nights",
    "make_plots",
    "match",
    "merge",
    "new_failures",
    "order",
    "perf_deltas",
    "regressions",
    "render_html",
    "render_markdown",
    "stock_drift",
    "summary_lines",
    "totals",
    "trend",
    "write",
]
