"""report.html in a real browser: headless Chromium renders the page and its plots (with the history's).

The check compares pixels: the page is not blank, the plots' stock-drift gold (a colour the page's CSS never
uses) covers many pixels, and the same page with every plot's <img> pointing nowhere looks very different.
That broken page is also the negative control: it must fail the "plots visible" check.
Chromium is Debian's package `chromium` (CI installs it: a missing one fails there, skips elsewhere).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from rlparity.report import command as report
from rlparity.report.plots import HISTORY, STOCK
from rlparity.results import CellResult

from harness.report_data import NEWFAIL, baseline_set, current_set, result, write_set
from tooling import find_tool, require

WIDTH, HEIGHT = 1280, 4000
TIMEOUT_S = 120
GOLD = np.array([int(STOCK[i : i + 2], 16) for i in (1, 3, 5)])  # the stock drift's bars and lines
MIN_GOLD = 2000  # pixels: the stock bars alone cover far more; text and tables none
IMG = re.compile(r'(<img alt="([^"]*)" src=")data:image/png;base64,[^"]*"')


def at(rs: list[CellResult], day: int) -> list[CellResult]:
    return [replace(r, started=f"2025-06-{day:02d}T02:00:00+00:00") for r in rs]


def write_report(root: Path) -> Path:
    """report.html of the report_data sets, with a baseline and three nights of history (NEWFAIL failing
    from night-2 on)."""
    nights = []
    for n in (1, 2, 3):
        rs = [result(NEWFAIL, "failed") if r.cell == NEWFAIL and n >= 2 else r for r in baseline_set()]
        nights.append(write_set(root / f"night-{n}", at(rs, n)))
    cur = write_set(root / "nightly", at(current_set(), 4))
    out = root / "report"
    argv = [str(cur), "--baseline", str(nights[-1]), "--history", *map(str, nights), "--out", str(out)]
    assert report.main(argv) == 0
    return out / "report.html"


def broken(page: Path, dest: Path, only: str | None = None) -> Path:
    """A copy of the page whose plot <img> (each, or only the one titled `only`) points to a missing file."""

    def point_nowhere(m: re.Match[str]) -> str:
        kept = only is not None and m.group(2) != only
        return m.group(0) if kept else m.group(1) + 'no-such-plot.png"'

    text, n = IMG.subn(point_nowhere, page.read_text())
    assert n >= 4 and "no-such-plot.png" in text
    dest.write_text(text)
    return dest


def screenshot(chromium: str, page: Path, png: Path) -> np.ndarray:
    """The page at WIDTH x HEIGHT as an RGB uint8 array (a profile of its own: xdist workers run in parallel)."""
    cmd = [
        chromium,
        "--headless=new",
        "--disable-gpu",
        "--no-sandbox",  # as root (CI containers) Chromium refuses to start with its sandbox
        "--disable-dev-shm-usage",
        "--hide-scrollbars",
        "--no-first-run",
        f"--user-data-dir={png.with_suffix('.profile')}",
        f"--window-size={WIDTH},{HEIGHT}",
        f"--screenshot={png}",
        page.as_uri(),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0 and png.is_file(), f"chromium exited {proc.returncode}: {proc.stderr[-3000:]}"
    from matplotlib.image import imread  # PNG as floats in [0, 1]

    rgb = np.round(imread(png)[..., :3] * 255).astype(np.int32)
    assert rgb.shape == (HEIGHT, WIDTH, 3), rgb.shape
    return rgb


# ---- the checks --------------------------------------------------------------------------------------------
def rendered(rgb: np.ndarray) -> bool:
    """Not blank: enough non-white pixels and colours (text, tables, the status colours)."""
    ink = (rgb < 240).any(axis=-1).mean()
    colours = len(np.unique((rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]))
    return ink > 0.01 and colours > 50


def gold_pixels(rgb: np.ndarray) -> int:
    return int((np.abs(rgb - GOLD).max(axis=-1) < 40).sum())


def plots_visible(rgb: np.ndarray) -> bool:
    return gold_pixels(rgb) >= MIN_GOLD


def differ(a: np.ndarray, b: np.ndarray) -> float:
    """The fraction of pixels that differ."""
    return float((np.abs(a - b).max(axis=-1) > 24).mean())


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    chromium = find_tool("chromium")
    require("chromium (Debian package chromium)", chromium, "not on PATH")
    root = tmp_path_factory.mktemp("screenshot")
    page = write_report(root)
    pages = {
        "good": page,
        "no-plots": broken(page, root / "no-plots.html"),
        "no-history-plot": broken(page, root / "no-history-plot.html", only=HISTORY),
    }
    return {name: screenshot(chromium, p, root / f"{name}.png") for name, p in pages.items()}


def test_the_page_and_its_plots_render(shots):
    good = shots["good"]
    assert rendered(good)
    assert plots_visible(good), f"{gold_pixels(good)} gold pixels"
    assert differ(good, shots["no-plots"]) > 0.03  # the plots are a large part of the page


def test_the_history_plot_is_drawn(shots):
    """Only the history plot broken: many pixels change, some of the gold (its stock drift line) goes."""
    good, gone = shots["good"], shots["no-history-plot"]
    assert differ(good, gone) > 0.02
    assert gold_pixels(gone) < gold_pixels(good) - 100


def test_broken_plots_fail_the_check(shots):
    """The negative control: the same page with the plots pointing nowhere renders, but not its plots."""
    bad = shots["no-plots"]
    assert rendered(bad)
    assert not plots_visible(bad), f"{gold_pixels(bad)} gold pixels without any plot"
