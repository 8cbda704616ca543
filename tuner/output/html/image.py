"""The report's key plot as a PNG, written beside the page for people who paste it into a
ticket: the same panels as the page's timeline (:mod:`prefill_tuner.output.html.timeline`),
drawn with matplotlib's Agg renderer. Plotly's own static export needs Kaleido, and Kaleido a
Chrome of its own downloaded at run time; matplotlib installs from the package index alone and
draws offline. It is imported when a picture is drawn, not when the tuner starts.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from prefill_tuner.objectives.slo import Slo
from prefill_tuner.output.html.figures import COLOURS
from prefill_tuner.output.html.timeline import (
    MARKERS,
    OTHER_STREAM,
    ROW_TITLES,
    SLO_COLOUR,
    TITLE,
    X_TITLE,
    TimelinePanel,
    panels,
    slo_lines,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DPI = 100
WIDTH_IN = 7.0
"""Per run's column, in inches (two runs: 1,400 pixels wide)."""
HEIGHT_IN = 8.0
DASHES: dict[str, Any] = {"dash": "--", "dot": ":", "dashdot": "-.", "longdash": (0, (8, 3))}
"""Plotly's dash names as matplotlib line styles."""
TITLE_PAD = 18
"""Points between a column's name and its axes: room for the long prompt's life under it."""


def timeline_image(
    compared: Sequence[tuple[str, dict[str, Any]]], slos: Sequence[Slo] = ()
) -> Figure | None:
    """The timeline as a matplotlib figure (``None``: no run has a window to draw)."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    columns = panels(compared)
    if not any(columns):
        return None
    figure = Figure(figsize=(WIDTH_IN * len(columns), HEIGHT_IN), dpi=DPI, layout="constrained")
    grid = figure.subplots(3, len(columns), sharex="col", sharey="row", squeeze=False)
    lines = slo_lines(slos)
    known = {name for panel in columns if panel is not None for name, *_ in panel.moments()}
    handles: list[Any] = [
        Patch(color=COLOURS["prefill"], label="prefill tokens"),
        Patch(color=COLOURS["decode"], label="decode tokens"),
    ] + [
        Line2D([], [], color=style["color"], linestyle=DASHES[style["dash"]], label=words)
        for name, words, style in MARKERS
        if name in known
    ]
    for column, panel in enumerate(columns):
        axes = [grid[row, column] for row in range(3)]
        if panel is None:
            axes[0].set_title(compared[column][0])
            continue
        axes[0].set_title(compared[column][0], pad=TITLE_PAD)
        axes[0].annotate(
            panel.life_label(),
            (0.5, 1),
            xycoords="axes fraction",
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize="small",
        )
        _draw(axes, panel, lines)
        if panel.slowest is not None:
            label = panel.slowest_label()
            handles.append(Line2D([], [], color=COLOURS[panel.kind], linewidth=2.5, label=label))
    if any(panel is not None and len(panel.streams) > 1 for panel in columns):
        handles.append(Line2D([], [], color=OTHER_STREAM, linewidth=1, label="other streams"))
    handles += [
        Line2D([], [], color=SLO_COLOUR, linestyle="-.", linewidth=2, label=line.label)
        for line in lines
    ]
    for row, title in enumerate(ROW_TITLES):
        grid[row, 0].set_ylabel(title)
    for axes in grid[-1]:
        axes.set_xlabel(X_TITLE)
    figure.suptitle(TITLE)
    figure.legend(handles=handles, loc="outside lower center", ncols=3, frameon=False)
    return figure


def _draw(axes: Sequence[Axes], panel: TimelinePanel, lines: Sequence[Any]) -> None:
    """One run's column: steps, tokens, streams and SLOs, the x axis spanning its window."""
    steps, tokens, streams = axes
    colour = COLOURS[panel.kind]
    steps.step(panel.starts, panel.step_ms, where="post", color=colour, linewidth=1.2)
    tokens.bar(
        panel.starts, panel.prefill, width=panel.widths, align="edge", color=COLOURS["prefill"]
    )
    tokens.bar(
        panel.starts,
        panel.decode,
        width=panel.widths,
        align="edge",
        bottom=panel.prefill,
        color=COLOURS["decode"],
    )
    for stream in reversed(panel.streams):  # the slowest drawn last, on top
        slowest = stream is panel.slowest
        streams.plot(
            stream.times,
            stream.itl_ms,
            color=colour if slowest else OTHER_STREAM,
            linewidth=2.5 if slowest else 1,
            marker="o",
            markersize=3 if slowest else 1.5,
            zorder=3 if slowest else 2,
        )
    for line in lines:
        streams.axhline(line.ms, color=SLO_COLOUR, linestyle="-.", linewidth=2, zorder=4)
        streams.annotate(
            line.label,
            (0, line.ms),
            xycoords=("axes fraction", "data"),
            xytext=(4, 4),
            textcoords="offset points",
            color=SLO_COLOUR,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1, "alpha": 0.8},
        )
    for ax in axes:
        for _, _, style, at in panel.moments():
            ax.axvline(at, color=style["color"], linestyle=DASHES[style["dash"]], linewidth=1.2)
        ax.grid(True, color="#e9ecef")
        ax.set_ylim(bottom=0)
    steps.set_xlim(*panel.span)


def timeline_png(
    compared: Sequence[tuple[str, dict[str, Any]]], slos: Sequence[Slo] = ()
) -> bytes | None:
    """The timeline as PNG bytes (``None``: nothing to draw). No timestamp or version in the
    file: the same study draws the same bytes."""
    figure = timeline_image(compared, slos)
    if figure is None:
        return None
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", metadata={"Software": None})
    return buffer.getvalue()
