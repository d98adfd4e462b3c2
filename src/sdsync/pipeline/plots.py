"""PNG figures for the evidence pages, drawn with matplotlib's Agg canvas.

Theory of operation: Spark computes every number; what reaches this module is a few
hundred points at most, already aggregated.  Figures are built with the object API on
an Agg canvas (no pyplot, no global backend state, nothing opened on a display), so the
pipeline runs headless and in worker threads alike.  Each function draws one kind of
chart and writes one PNG.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

DPI = 110
Number = float | int


def _figure(width: float = 7.0, height: float = 4.0) -> Figure:
    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
    return path


def _style(axes: Axes, title: str, xlabel: str, ylabel: str) -> None:
    axes.set_title(title, fontsize=10)
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.grid(True, alpha=0.3)


def lines(
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    x: Sequence[Number],
    series: Mapping[str, Sequence[Number]],
    *,
    ylim: tuple[float, float] | None = None,
) -> Path:
    """One line per series over a shared x axis (a step plot: values hold until the next x)."""
    figure = _figure()
    axes = figure.add_subplot()
    for name, values in series.items():
        axes.step(x, values, where="post", label=name)
    if ylim is not None:
        axes.set_ylim(*ylim)
    _style(axes, title, xlabel, ylabel)
    axes.legend(fontsize=8)
    return _save(figure, path)


def histogram(
    path: Path,
    title: str,
    xlabel: str,
    edges: Sequence[Number],
    counts: Sequence[Number],
    markers: Mapping[str, float | None],
    *,
    log_x: bool = False,
) -> Path:
    """Bars from precomputed bins (``len(edges) == len(counts) + 1``), with marker lines."""
    figure = _figure()
    axes = figure.add_subplot()
    if log_x:
        axes.set_xscale("log")
    if counts:
        widths = [b - a for a, b in itertools.pairwise(edges)]
        axes.bar(edges[:-1], counts, width=widths, align="edge", color="#4c72b0")
    for (name, value), color in zip(
        markers.items(), ("#dd8452", "#c44e52", "#8172b2"), strict=False
    ):
        if value is not None:
            axes.axvline(value, color=color, linestyle="--", label=f"{name} {value:,.0f}")
    _style(axes, title, xlabel, "messages")
    if any(v is not None for v in markers.values()):
        axes.legend(fontsize=8)
    return _save(figure, path)


def bars(
    path: Path,
    title: str,
    ylabel: str,
    labels: Sequence[str],
    series: Mapping[str, Sequence[Number]],
    *,
    stacked: bool = False,
    log: bool = False,
) -> Path:
    """Grouped (or stacked) bars, one group per label."""
    figure = _figure(max(7.0, 0.35 * len(labels) * max(1, len(series))), 4.0)
    axes = figure.add_subplot()
    positions = list(range(len(labels)))
    width = 0.8 if stacked else 0.8 / max(1, len(series))
    bottom = [0.0] * len(labels)
    for i, (name, values) in enumerate(series.items()):
        if stacked:
            axes.bar(positions, values, width, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        else:
            offset = (i - (len(series) - 1) / 2) * width
            axes.bar([p + offset for p in positions], values, width, label=name)
    if log:
        axes.set_yscale("log")
    axes.set_xticks(positions, labels, rotation=60 if len(labels) > 8 else 0, fontsize=8)
    _style(axes, title, "", ylabel)
    axes.legend(fontsize=8)
    return _save(figure, path)


@dataclass(frozen=True)
class Panel:
    """One metric over the points of a sweep: mean, and the range over seeds."""

    title: str
    ylabel: str
    series: Mapping[str, Sequence[float | None]]
    low: Mapping[str, Sequence[float | None]]
    high: Mapping[str, Sequence[float | None]]
    log: bool = False


def panels(
    path: Path, title: str, xlabel: str, labels: Sequence[str], grid: Sequence[Panel]
) -> Path:
    """A 2-column grid of metric panels over the same categorical x axis."""
    rows = (len(grid) + 1) // 2
    # Upright tick labels need room below each panel, and many points a wider figure.
    tall = max(map(len, labels), default=0) * 0.06 if len(labels) > 8 else 0.0
    figure = _figure(max(10.0, 0.22 * len(labels)), (3.2 + tall) * rows)
    figure.suptitle(title, fontsize=11)
    positions = list(range(len(labels)))
    for index, panel in enumerate(grid):
        axes = figure.add_subplot(rows, 2, index + 1)
        for name, values in panel.series.items():
            points = [
                (p, v, lo, hi)
                for p, v, lo, hi in zip(
                    positions, values, panel.low[name], panel.high[name], strict=True
                )
                if v is not None and lo is not None and hi is not None
            ]
            if not points:
                continue
            xs = [p for p, *_ in points]
            ys = [v for _, v, *_ in points]
            errors = [[v - lo for _, v, lo, _ in points], [hi - v for _, v, _, hi in points]]
            axes.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, label=name)
        if panel.log:
            axes.set_yscale("log")
        # Many points (a sweep crossing several axes): upright labels, one per point.
        crowded = len(labels) > 8 or max(map(len, labels), default=0) > 12
        axes.set_xticks(
            positions, labels, fontsize=6 if crowded else 8, rotation=90 if crowded else 0
        )
        _style(axes, panel.title, xlabel, panel.ylabel)
        if len(panel.series) > 1:
            axes.legend(fontsize=8)
    return _save(figure, path)
