"""Writing the report: report.md and report.html (with its plots) under one directory."""

from __future__ import annotations

from pathlib import Path

from rlparity.config import ConfigError
from rlparity.report import html, markdown
from rlparity.report.model import Report
from rlparity.report.plots import make_plots


def write(rep: Report, out: Path, plots: dict[str, bytes] | None = None) -> tuple[Path, Path]:
    """report.md and report.html under out (plots made here unless given); returns their paths."""
    md = markdown.render_markdown(rep)
    page = html.render_html(rep, make_plots(rep) if plots is None else plots)
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / markdown.NAME).write_text(md)
        (out / html.NAME).write_text(page)
    except OSError as exc:
        raise ConfigError(f"cannot write the report: {exc.strerror or exc}", out) from exc
    return out / markdown.NAME, out / html.NAME
