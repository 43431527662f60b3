"""The report's plots as PNG bytes: the only module that imports matplotlib.

Agg canvas on a bare Figure: no display, no global pyplot state (safe in a worker or a test).
"""

from __future__ import annotations

import io
from collections import Counter
from collections.abc import Sequence

from rlparity.config import import_extra
from rlparity.report.model import Entry, History, Report, StockDrift, is_number
from rlparity.report.rules import match
from rlparity.results import HIST_PREFIX, STATUSES

COLOURS = {"passed": "#2da44e", "failed": "#cf222e", "error": "#8250df", "skipped": "#afb8c1"}
STOCK = "#bf8700"  # the stock drift's colour
HISTORY = "History per target: cells passed / failed per night, stock drift"
SEVERITY = {"skipped": 1, "passed": 2, "error": 3, "failed": 4}  # the heatmap shows a square's worst


def make_plots(rep: Report) -> dict[str, bytes]:
    """PNG bytes by title; a plot with nothing to show is left out."""
    import_extra("matplotlib", "report")  # imported late: `rlparity --help` stays fast
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    def png(fig: Figure) -> bytes:
        FigureCanvasAgg(fig)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
        return buf.getvalue()

    plots = {}
    if rep.entries:
        plots["Status by target and profile"] = png(_status_figure(Figure, rep.entries))
    if rep.stock:
        plots["Stock PyTorch drift per target (informational)"] = png(_stock_figure(Figure, rep.stock))
    timed = [e for e in rep.entries if e.status != "skipped" and is_number((e.result.timings or {}).get("wall_s"))]
    if timed:
        plots["Wall time per cell"] = png(_timing_figure(Figure, timed, rep.baseline))
    for workload, bins in _mismatch_histograms(rep.entries).items():
        plots[f"|dlogp| between rollout and training, workload {workload} (informational)"] = png(
            _histogram_figure(Figure, bins)
        )
    if rep.history is not None and rep.history.by_target:
        plots[HISTORY] = png(_history_figure(Figure, rep.history))
    return plots


def _status_figure(Figure, entries: Sequence[Entry]):
    """A target x profile heatmap of each square's worst status, beside cells per target by status."""
    from matplotlib.colors import ListedColormap

    targets = sorted({e.result.cell.target for e in entries})
    profiles = sorted({e.result.cell.profile for e in entries})
    worst = [[0] * len(profiles) for _ in targets]
    label = [[""] * len(profiles) for _ in targets]
    for i, tgt in enumerate(targets):
        for j, prof in enumerate(profiles):
            cs = Counter(e.status for e in entries if e.result.cell.target == tgt and e.result.cell.profile == prof)
            if cs:
                worst[i][j] = max(SEVERITY[s] for s in cs)
                ran = cs["passed"] + cs["failed"] + cs["error"]
                label[i][j] = f"{cs['passed']}/{ran}" if ran else "skip"
    fig = Figure(figsize=(max(6.0, 1.0 * len(profiles) + 6.0), max(2.5, 0.45 * len(targets) + 1.5)))
    ax, bx = fig.subplots(1, 2, gridspec_kw={"width_ratios": [max(len(profiles), 2), 3]})
    cmap = ListedColormap(["#ffffff", COLOURS["skipped"], COLOURS["passed"], COLOURS["error"], COLOURS["failed"]])
    ax.imshow(worst, cmap=cmap, vmin=-0.5, vmax=4.5, aspect="auto")
    ax.set_xticks(range(len(profiles)), profiles, rotation=40, ha="right", fontsize=8)
    ax.set_yticks(range(len(targets)), targets, fontsize=8)
    for i in range(len(targets)):
        for j in range(len(profiles)):
            ax.text(j, i, label[i][j], ha="center", va="center", fontsize=7)
    ax.set_title("worst status of the cells (passed/ran; white: no cell)", fontsize=9)
    left = [0] * len(targets)
    for s in STATUSES:
        n = [sum(e.status == s for e in entries if e.result.cell.target == t) for t in targets]
        bx.barh(range(len(targets)), n, left=left, color=COLOURS[s], label=s)
        left = [a + b for a, b in zip(left, n, strict=True)]
    bx.set_yticks(range(len(targets)), targets, fontsize=8)
    bx.invert_yaxis()
    bx.set_title("cells per target", fontsize=9)
    bx.legend(fontsize=7, loc="lower right")
    return fig


def _mismatch_histograms(entries: Sequence[Entry]) -> dict[str, dict[str, float]]:
    """Per workload, the |dlogp| histogram bins (results.HIST_PREFIX) added over its cells."""
    out: dict[str, dict[str, float]] = {}
    for e in entries:
        for k, v in e.result.mismatch.items():
            if k.startswith(HIST_PREFIX):
                bins = out.setdefault(e.result.cell.workload, {})
                bins[k.removeprefix(HIST_PREFIX)] = bins.get(k.removeprefix(HIST_PREFIX), 0.0) + v
    return dict(sorted(out.items()))


def _histogram_figure(Figure, bins: dict[str, float]):
    """How many tokens' |dlogp| fall in each fixed bin (0, then decades)."""
    fig = Figure(figsize=(max(4.0, 0.5 * len(bins) + 2.0), 2.8))
    ax = fig.subplots()
    ax.bar(range(len(bins)), list(bins.values()), color=STOCK)
    ax.set_xticks(range(len(bins)), list(bins), fontsize=7, rotation=45, ha="right")
    ax.set_ylabel("tokens", fontsize=8)
    return fig


def _stock_figure(Figure, stock: Sequence[StockDrift]):
    """Per target, the fraction of stock-PyTorch comparisons that differ."""
    fig = Figure(figsize=(max(4.0, 0.8 * len(stock) + 2.0), 2.8))
    ax = fig.subplots()
    ax.bar(range(len(stock)), [s.fraction for s in stock], color=STOCK)
    for i, s in enumerate(stock):
        ax.text(i, s.fraction, f"{s.differ}/{s.total}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(stock)), [s.target for s in stock], fontsize=8)
    ax.set_ylim(0, 1.1)
    ax.set_ylabel("fraction differing", fontsize=8)
    return fig


def _timing_figure(Figure, timed: Sequence[Entry], baseline: Sequence[Entry] | None, top: int = 40):
    """The `top` slowest cells' wall time, with the baseline's as a tick where there is one."""
    wall = {e.key: float(e.result.timings["wall_s"]) for e in timed}
    shown = sorted(timed, key=lambda e: -wall[e.key])[:top]
    fig = Figure(figsize=(8.0, 0.22 * len(shown) + 1.2))
    ax = fig.subplots()
    y = range(len(shown))
    ax.barh(y, [wall[e.key] for e in shown], color=[COLOURS[e.status] for e in shown])
    if baseline is not None:
        pairs = match(shown, baseline)
        pts = [(i, (b.result.timings or {}).get("wall_s")) for i, (_, b) in enumerate(pairs) if b is not None]
        pts = [(i, w) for i, w in pts if is_number(w)]
        if pts:
            ax.plot([w for _, w in pts], [i for i, _ in pts], "k|", markersize=9, label="baseline")
            ax.legend(fontsize=7)
    ax.set_yticks(list(y), [e.key for e in shown], fontsize=6)
    ax.invert_yaxis()
    ax.set_xlabel("wall s", fontsize=8)
    if len(timed) > top:
        ax.set_title(f"the {top} slowest of {len(timed)} cells", fontsize=9)
    return fig


def _history_figure(Figure, h: History):
    """One panel per target over the nights: cells passed and failed (+ error), the stock drift on a second
    axis where it ran, and a dotted line at the oldest onset of the target's cells failing tonight."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    x = range(len(h.nights))
    fig = Figure(figsize=(max(6.0, 0.7 * len(h.nights) + 3.0), 1.9 * len(h.by_target) + 0.9))
    axes = fig.subplots(len(h.by_target), 1, sharex=True, squeeze=False)[:, 0]
    for ax, (tgt, counts) in zip(axes, h.by_target.items(), strict=True):
        ax.plot(x, [c.passed for c in counts], "o-", color=COLOURS["passed"])
        ax.plot(x, [c.failed for c in counts], "o-", color=COLOURS["failed"])
        ax.set_ylim(0, 1.15 * max(1, *(max(c.passed, c.failed) for c in counts)))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.tick_params(labelsize=7)
        ax.set_ylabel(tgt, fontsize=8)
        since = [o.since for o in h.onsets if o.target == tgt]
        if since:
            ax.axvline(min(since), color=COLOURS["failed"], linestyle=":")
        stock = [c.stock if c.stock is not None else float("nan") for c in counts]
        if any(c.stock is not None for c in counts):
            sx = ax.twinx()
            sx.plot(x, stock, "s--", color=STOCK)
            sx.set_ylim(0, 1.05)
            sx.tick_params(labelsize=7)
            sx.set_ylabel("stock drift", fontsize=7, color=STOCK)
    legend = [
        Line2D([], [], color=COLOURS["passed"], marker="o", label="passed"),
        Line2D([], [], color=COLOURS["failed"], marker="o", label="failed + error"),
        Line2D([], [], color=STOCK, marker="s", linestyle="--", label="stock drift"),
        Line2D([], [], color=COLOURS["failed"], linestyle=":", label="failing since"),
    ]
    axes[0].legend(handles=legend, fontsize=7, ncol=4, loc="lower left", bbox_to_anchor=(0.0, 1.0), frameon=False)
    axes[-1].set_xticks(list(x), list(h.nights), rotation=30, ha="right", fontsize=8)
    fig.suptitle("cells per night (left axis); stock drift: the fraction differing (right axis)", fontsize=9)
    return fig
