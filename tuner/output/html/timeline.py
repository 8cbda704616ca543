"""The report's key plot: the baseline and the recommended setting side by side around the
arrival of the trace's longest prompt (each step's latency, its prefill and decode tokens,
each streaming request's inter-token latency), with the study's TPOT and ITL SLOs drawn on the
streams and the slowest stream named. What both drawings share is here, as data
(:class:`TimelinePanel`); the page draws it with plotly (:func:`timeline_figure`), the PNG beside
the page with matplotlib (:mod:`prefill_tuner.output.html.image`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from prefill_tuner.objectives.slo import Slo
from prefill_tuner.output.html.figures import COLOURS, LAYOUT, run_kind
from prefill_tuner.study.headline import objective_label

TITLE = "Around the longest prompt's arrival (its moments: vertical lines, named in the legend)"
ROW_TITLES = ("step (ms)", "tokens in step", "ITL of streams (ms)")
X_TITLE = "s from the long prompt's arrival"
ARRIVAL = {"color": "#c1121f", "dash": "dash"}
SEEN = {"color": "#0077b6", "dash": "dashdot"}
ADMITTED = {"color": "#2b9348", "dash": "longdash"}
FIRST_TOKEN = {"color": "#6a4c93", "dash": "dot"}
MARKERS = (
    ("arrival", "long prompt sent", ARRIVAL),
    ("seen", "seen by the engine", SEEN),
    ("admitted", "its first step", ADMITTED),
    ("first_token", "its first token", FIRST_TOKEN),
)
"""The long prompt's moments drawn as vertical lines: the :class:`TimelinePanel` attribute
(s from its arrival; ``None``: unknown, not drawn), the legend's words, the line's style."""
PHASES = {
    ("arrival", "seen"): "front end",
    ("seen", "admitted"): "queued",
    ("admitted", "first_token"): "prefill to first token",
    ("arrival", "admitted"): "front end and queue",
    ("seen", "first_token"): "queued and prefill to first token",
    ("arrival", "first_token"): "TTFT",
}
"""What the time between two known moments of the long prompt is called (the moments between
them unknown)."""
LIFE_FONT = '<span style="font-size:12px">'
"""The long prompt's life under a column's name: smaller than the name."""
SLO_COLOUR = "#f77f00"
OTHER_STREAM = "#adb5bd"


@dataclass(frozen=True)
class SloLine:
    """A TPOT or ITL SLO, drawn across the streams' inter-token latencies."""

    label: str
    """``p99 TPOT SLO 50 ms``."""
    ms: float


@dataclass(frozen=True)
class Stream:
    """One streaming request's inter-token latencies in the window."""

    id: str
    times: list[float]
    """When each token came, in s from the long prompt's arrival."""
    itl_ms: list[float]

    @property
    def worst_ms(self) -> float:
        return max(self.itl_ms, default=0.0)


@dataclass(frozen=True)
class TimelinePanel:
    """One run's column, relative to the long prompt's arrival."""

    who: str
    kind: str
    """``baseline`` or ``recommended`` (its colour)."""
    span: tuple[float, float]
    """The window's first step's start and last step's end: the x axis."""
    starts: list[float]
    step_ms: list[float]
    widths: list[float]
    """Each step's bar width (:func:`step_widths`)."""
    prefill: list[int]
    decode: list[int]
    streams: list[Stream]
    """The slowest first (the largest inter-token latency), then as the timeline keeps them."""
    first_token: float | None
    """The long prompt's first token (``None``: it had none)."""
    prompt_tokens: int | None = None
    """The long prompt's length."""
    seen: float | None = None
    """When the engine's scheduler first had the long prompt (``None``: unknown, as on a real
    server, or a timeline stored before it was kept)."""
    admitted: float | None = None
    """When the first step that scheduled any of its prompt started (``None``: unknown)."""
    arrival: float = 0.0
    """Its send: the time axis's zero."""

    def moments(self) -> list[tuple[str, str, dict[str, str], float]]:
        """The long prompt's known moments, in :data:`MARKERS`' order: name, legend words,
        line style, time."""
        known = []
        for name, words, style in MARKERS:
            at = getattr(self, name)
            if at is not None:
                known.append((name, words, style, float(at)))
        return known

    def life_label(self) -> str:
        """The long prompt's life in words: ``long prompt 8,000 tokens: front end 12 ms,
        queued 340 ms, prefill to first token 210 ms`` (``TTFT 560 ms`` where only its send
        and first token are known)."""
        tokens = "" if self.prompt_tokens is None else f" {self.prompt_tokens:,} tokens"
        known = [(name, at) for name, _, _, at in self.moments()]
        phases = [
            f"{PHASES[(before, after)]} {_ms(end - start)}"
            for (before, start), (after, end) in pairwise(known)
        ]
        if self.first_token is None:
            phases.append("no first token")
        return f"long prompt{tokens}: {', '.join(phases)}"

    @property
    def slowest(self) -> Stream | None:
        return self.streams[0] if self.streams else None

    def slowest_label(self) -> str:
        stream = self.slowest
        assert stream is not None
        worst = f"ITL up to {stream.worst_ms:.0f} ms"
        return f"slowest stream, {self.who}: request {stream.id} ({worst})"


def _ms(seconds: float) -> str:
    """``340 ms``; ``4.2 ms`` below 10 ms (a front end takes a few)."""
    ms = seconds * 1000
    return f"{ms:,.0f} ms" if abs(ms) >= 10 else f"{ms:.1f} ms"


def slo_lines(slos: Sequence[Slo]) -> list[SloLine]:
    """The SLOs the streams' inter-token latencies are judged by (TPOT and ITL ones)."""
    return [
        SloLine(f"{objective_label(slo.name)} SLO {slo.limit_s * 1000:g} ms", slo.limit_s * 1000)
        for slo in slos
        if slo.metric in ("tpot", "itl")
    ]


def panels(compared: Sequence[tuple[str, dict[str, Any]]]) -> list[TimelinePanel | None]:
    """Each compared run's column (``None``: its timeline has no window)."""
    result: list[TimelinePanel | None] = []
    for who, timeline in compared:
        window = timeline.get("window")
        if not window:
            result.append(None)
            continue
        zero = window["long_prompt"]["arrival_s"]
        steps = window["steps"]
        starts = [s - zero for s in steps["start_s"]]
        ends = [s + d for s, d in zip(starts, steps["duration_s"], strict=True)]
        low = window.get("start_s", min(starts, default=zero)) - zero
        high = window.get("end_s", max(ends, default=zero)) - zero
        streams = [
            Stream(
                str(stream["id"]),
                [t - zero for t in stream["token_s"]],
                [v * 1000 for v in stream["itl_s"]],
            )
            for stream in window["streams"]
        ]
        if streams:
            slowest = max(range(len(streams)), key=lambda i: (streams[i].worst_ms, -i))
            streams.insert(0, streams.pop(slowest))
        prompt = window["long_prompt"]
        first, seen, admitted = (
            prompt.get(key) for key in ("first_token_s", "seen_s", "admitted_s")
        )  # seen and admitted: absent from timelines stored before they were kept
        result.append(
            TimelinePanel(
                who=who,
                kind=run_kind(who),
                span=(min(low, *starts) if starts else low, max(high, *ends) if ends else high),
                starts=starts,
                step_ms=[d * 1000 for d in steps["duration_s"]],
                widths=step_widths(starts, steps["duration_s"]),
                prefill=list(steps["prefill_tokens"]),
                decode=list(steps["decode_tokens"]),
                streams=streams,
                first_token=None if first is None else first - zero,
                prompt_tokens=prompt.get("prompt_tokens"),
                seen=None if seen is None else seen - zero,
                admitted=None if admitted is None else admitted - zero,
            )
        )
    return result


def timeline_figure(
    compared: Sequence[tuple[str, dict[str, Any]]], slos: Sequence[Slo] = ()
) -> go.Figure:
    """Side by side, around the arrival of the trace's longest prompt: each step's latency,
    its prefill and decode tokens, and each streaming request's inter-token latency (the
    slowest stream highlighted and named, the others grey; the TPOT and ITL SLOs drawn
    across them). Time is relative to the long prompt's arrival; its moments are marked
    (:data:`MARKERS`: its send, the engine seeing it, its first step and its first token, as
    far as known) and said in words under each column's name (:meth:`TimelinePanel.
    life_label`); each column's time axis spans its window, no more."""
    columns = panels(compared)
    fig = make_subplots(
        rows=3,
        cols=len(compared),
        shared_xaxes=True,
        shared_yaxes=True,  # one scale per row: the spike and its absence compare at a glance
        vertical_spacing=0.06,
        horizontal_spacing=0.07,
        subplot_titles=[
            who if panel is None else f"{who}<br>{LIFE_FONT}{panel.life_label()}</span>"
            for (who, _), panel in zip(compared, columns, strict=True)
        ],
        row_heights=[0.34, 0.33, 0.33],
    )
    lines = slo_lines(slos)
    first_other = True
    marked: set[str] = set()
    for column, panel in enumerate(columns, start=1):
        if panel is None:
            continue
        _steps(fig, panel, column)
        for stream in reversed(panel.streams):  # the slowest drawn last, on top
            slowest = stream is panel.slowest
            fig.add_trace(
                go.Scatter(
                    x=stream.times,
                    y=stream.itl_ms,
                    mode="lines+markers",
                    marker={"size": 5 if slowest else 3},
                    line={
                        "width": 2.5 if slowest else 1,
                        "color": COLOURS[panel.kind] if slowest else OTHER_STREAM,
                    },
                    name=panel.slowest_label() if slowest else "other streams",
                    legendgroup=f"slowest {panel.who}" if slowest else "streams",
                    showlegend=slowest or first_other,
                    meta={"kind": "slowest stream" if slowest else "stream", "who": panel.who},
                    hovertemplate=f"request {stream.id}: ITL %{{y:.2f}} ms<extra></extra>",
                ),
                row=3,
                col=column,
            )
            first_other = first_other and slowest
        _slo_lines(fig, panel, column, lines)
        for name, words, style, at in panel.moments():
            for row in (1, 2, 3):
                fig.add_vline(
                    x=at,
                    line=style,
                    row=row,
                    col=column,
                    name=words,
                    legendgroup=name,  # one legend entry shows or hides them all
                    showlegend=name not in marked,
                )
                marked.add(name)
        fig.update_xaxes(range=list(panel.span), row=3, col=column)
    fig.update_layout(
        **LAYOUT,
        barmode="stack",
        bargap=0,
        height=760,
        title=TITLE,
        legend={"orientation": "h", "yanchor": "top", "y": -0.09, "x": 0},
    )
    fig.update_layout(margin_t=100)  # room for the columns' two-line titles
    # From zero to the data's top; said outright, or plotly.js leaves every y axis at [-1, 4]
    # once an x axis has a range.
    fig.update_yaxes(autorange=True, rangemode="tozero")
    for row, title in enumerate(ROW_TITLES, start=1):
        fig.update_yaxes(title_text=title, row=row, col=1)
    for column in range(1, len(compared) + 1):
        fig.update_xaxes(title_text=X_TITLE, row=3, col=column)
    return fig


def _slo_lines(fig: go.Figure, panel: TimelinePanel, column: int, lines: Sequence[SloLine]) -> None:
    """The TPOT and ITL SLOs across a column's inter-token latency row (named in the legend
    once, by the first column)."""
    for line in lines:
        fig.add_trace(
            go.Scatter(
                x=list(panel.span),
                y=[line.ms, line.ms],
                mode="lines+text",
                text=[line.label, ""],
                textposition="top right",
                textfont={"color": SLO_COLOUR},
                line={"color": SLO_COLOUR, "width": 2, "dash": "dashdot"},
                name=line.label,
                legendgroup=line.label,
                showlegend=column == 1,
                meta={"kind": "slo", "who": panel.who},
                hoverinfo="skip",
            ),
            row=3,
            col=column,
        )


def _steps(fig: go.Figure, panel: TimelinePanel, column: int) -> None:
    """A column's first two rows: each step's latency, and its tokens as bars."""
    fig.add_trace(
        go.Scatter(
            x=panel.starts,
            y=panel.step_ms,
            mode="lines+markers",
            name=f"step latency: {panel.who}",
            line={"color": COLOURS[panel.kind], "shape": "hv"},
            marker={"size": 4},
            customdata=list(zip(panel.prefill, panel.decode, strict=True)),
            hovertemplate="step at %{x:.3f} s: %{y:.2f} ms, prefill %{customdata[0]}, "
            "decode %{customdata[1]} tokens<extra></extra>",
            meta={"kind": "steps", "who": panel.who},
            showlegend=False,
        ),
        row=1,
        col=column,
    )
    for key, values in (("prefill", panel.prefill), ("decode", panel.decode)):
        fig.add_trace(
            go.Bar(
                x=panel.starts,
                y=values,
                width=panel.widths,
                offset=0,  # a step's bar starts when the step does
                name=f"{key} tokens",
                marker={"color": COLOURS[key], "line": {"width": 0}},
                meta={"kind": f"{key} tokens", "who": panel.who},
                legendgroup=key,
                showlegend=column == 1,
                hovertemplate=f"%{{y}} {key} tokens<extra></extra>",
            ),
            row=2,
            col=column,
        )


MIN_BAR_SHARE = 1 / 200
"""The narrowest a step's bar is drawn, as a share of the window (a few pixels)."""


def step_widths(starts: Sequence[float], durations: Sequence[float]) -> list[float]:
    """Each step's bar width on the time axis: as long as the step ran, never narrower than
    :data:`MIN_BAR_SHARE` of the window (plotly's own width is the smallest gap between two
    steps: a 300 ms step would be drawn a few ms wide, and short steps not at all)."""
    if not starts:
        return []
    span = max(s + d for s, d in zip(starts, durations, strict=True)) - min(starts)
    return [max(duration, span * MIN_BAR_SHARE) for duration in durations]
