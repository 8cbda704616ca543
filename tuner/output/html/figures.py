"""The report's plots, as plotly figures (rendered offline: the page embeds plotly.js once).

Optuna draws what it understands: the optimisation history and parameter importances
(``optuna.visualization``, one figure per objective through ``target``; Optuna 5's
``plot_optimization_history`` reads ``trial.set_constraint`` and greys infeasible trials).
The Pareto plot is drawn here: Optuna's ``plot_pareto_front`` knows neither the SLO limits,
nor failed trials (completed here with penalty values that would stretch its axes), nor the
baseline and the recommended setting, and its hover cannot show a serve line.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import optuna
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from prefill_tuner.objectives.slo import METRICS
from prefill_tuner.search_spaces.space import knob_of_param
from prefill_tuner.storage.models import TrialRecord
from prefill_tuner.study.plan import RATE_MULTIPLIER

COLOURS = {
    "feasible": "#2a9d8f",
    "infeasible": "#e76f51",
    "failed": "#8d8d8d",
    "baseline": "#264653",
    "recommended": "#e9c46a",
    "prefill": "#e76f51",
    "decode": "#2a9d8f",
}
LAYOUT = {"template": "plotly_white", "margin": {"l": 60, "r": 20, "t": 50, "b": 50}}


def _ms(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else value * 1000.0


def _label(name: str) -> str:
    """An objective's axis title, with its unit."""
    if name == RATE_MULTIPLIER:
        return f"{name} (× the trace's rate)"
    return f"{name} (ms)" if _scale(name) > 1 else name


def _scale(name: str) -> float:
    """Latencies (a class's too: ``p99_ttft[interactive]``) are plotted in ms."""
    statistic = name.partition("[")[0]
    return 1000.0 if statistic.endswith(tuple(f"_{metric}" for metric in METRICS)) else 1.0


def hover_text(trial: TrialRecord) -> str:
    """A trial's settings, verdict and serve line, for a plot's hover box."""
    lines = [f"<b>trial {trial.trial_number}</b>"]
    if trial.is_baseline:
        lines[0] += " (baseline: the engine's defaults)"
    lines += [f"{name}: {value}" for name, value in trial.settings.items()]
    if trial.status == "failed":
        lines.append(f"failed: {trial.failure_reason}")
    else:
        lines.append("meets the SLOs" if trial.feasible else "misses the SLOs")
    command = trial.serve_command
    lines.append("<br>".join(command[i : i + 90] for i in range(0, len(command), 90)))
    return "<br>".join(lines)


def pareto_figure(
    trials: Sequence[TrialRecord],
    objectives: Sequence[str],
    pareto: Sequence[TrialRecord],
    limits: dict[str, float],
    recommended: TrialRecord | None,
) -> go.Figure:
    """Every trial on the first two objectives (p99 TTFT and p99 TPOT when the study has
    them; one objective: by trial number), feasible / infeasible / failed apart, the SLO
    limits drawn, the front joined, the baseline and the recommended setting marked. Failed
    trials have no measurement: they sit on the plot's top edge."""
    names = _axes(objectives)
    fig = go.Figure()
    measured = [t for t in trials if t.status != "failed"]

    def xy(trial: TrialRecord) -> tuple[float, float]:
        if len(names) == 1:
            return trial.trial_number, trial.objectives[names[0]] * _scale(names[0])
        first, second = names
        return trial.objectives[first] * _scale(first), trial.objectives[second] * _scale(second)

    def finite(values: list[float]) -> list[float]:
        return [v for v in values if v is not None and math.isfinite(v) and v > 0]

    ys = finite([xy(t)[1] for t in measured])
    xs = finite([xy(t)[0] for t in measured])
    top = max(ys, default=1.0) * 1.3
    for kind, group in (
        ("feasible", [t for t in measured if t.feasible]),
        ("infeasible", [t for t in measured if not t.feasible]),
    ):
        fig.add_trace(
            go.Scatter(
                x=[xy(t)[0] for t in group],
                y=[xy(t)[1] for t in group],
                mode="markers",
                name=f"{kind} ({len(group)})",
                marker={"color": COLOURS[kind], "size": 9, "symbol": "circle"},
                customdata=[hover_text(t) for t in group],
                hovertemplate="%{customdata}<extra></extra>",
                meta={"kind": kind, "trials": [t.trial_number for t in group]},
            )
        )
    failed = [t for t in trials if t.status == "failed"]
    fig.add_trace(
        go.Scatter(
            x=[t.trial_number if len(names) == 1 else min(xs, default=1.0) for t in failed],
            y=[top for _ in failed],
            mode="markers",
            name=f"failed ({len(failed)})",
            marker={"color": COLOURS["failed"], "size": 9, "symbol": "x"},
            customdata=[hover_text(t) for t in failed],
            hovertemplate="%{customdata}<extra></extra>",
            meta={"kind": "failed", "trials": [t.trial_number for t in failed]},
        )
    )
    if len(names) == 2 and pareto:
        front = sorted(pareto, key=lambda t: xy(t)[0])
        fig.add_trace(
            go.Scatter(
                x=[xy(t)[0] for t in front],
                y=[xy(t)[1] for t in front],
                mode="lines",
                name="Pareto front",
                line={"color": COLOURS["feasible"], "dash": "dot"},
                hoverinfo="skip",
                meta={"kind": "front"},
            )
        )
    baseline = next((t for t in trials if t.is_baseline and t.status != "failed"), None)
    _marks(fig, (("baseline", baseline, "circle-open"), ("recommended", recommended, "star")), xy)
    _slo_lines(fig, names, limits, (min(xs, default=1.0), max(xs, default=1.0)), (ys, top))
    fig.update_layout(
        **LAYOUT,
        title="Every trial: feasible, infeasible and failed (hover for settings and serve line)",
        xaxis_title="trial" if len(names) == 1 else _label(names[0]),
        yaxis_title=_label(names[-1]),
        height=520,
    )
    if len(names) == 2:
        fig.update_xaxes(type="log")
        fig.update_yaxes(type="log")
    return fig


def _marks(
    fig: go.Figure,
    marked: Sequence[tuple[str, TrialRecord | None, str]],
    xy: Callable[[TrialRecord], tuple[float, float]],
) -> None:
    """A large marker for each ``(kind, trial, symbol)`` given a trial (the baseline, the
    recommended setting)."""
    for kind, trial, symbol in marked:
        if trial is None:
            continue
        x, y = xy(trial)
        fig.add_trace(
            go.Scatter(
                x=[x],
                y=[y],
                mode="markers",
                name=f"{kind} (trial {trial.trial_number})",
                marker={"color": COLOURS[kind], "size": 20, "symbol": symbol, "line": {"width": 3}},
                customdata=[hover_text(trial)],
                hovertemplate="%{customdata}<extra></extra>",
                meta={"kind": kind, "trials": [trial.trial_number]},
            )
        )


def _slo_lines(
    fig: go.Figure,
    names: Sequence[str],
    limits: dict[str, float],
    x_range: tuple[float, float],
    y_values: tuple[list[float], float],
) -> None:
    """Each SLO limit on an axis as a dashed line across the other axis's data (as traces,
    not shapes: a shape's annotation on a log axis is misplaced)."""
    (ys, top), (least_x, most_x) = y_values, x_range
    low_x, high_x = least_x / 1.2, most_x * 1.2
    low_y, high_y = min(ys, default=1.0) / 1.2, top
    for axis, name in zip(("x", "y"), names if len(names) == 2 else ("", names[0]), strict=True):
        if name not in limits:
            continue
        limit = limits[name] * _scale(name)
        # Across the other axis's data, no further: that axis is fitted to the trials.
        if axis == "x":
            line_x, line_y = [limit, limit], [low_y, high_y]
        else:
            line_x, line_y = [low_x, high_x], [limit, limit]
        fig.add_trace(
            go.Scatter(
                x=line_x,
                y=line_y,
                mode="lines",
                name=f"SLO {name} ≤ {limit:g}{' ms' if _scale(name) > 1 else ''}",
                line={"color": "#c1121f", "dash": "dash", "width": 1},
                hoverinfo="skip",
                meta={"kind": "slo"},
            )
        )


def _axes(objectives: Sequence[str]) -> list[str]:
    if "p99_ttft" in objectives and "p99_tpot" in objectives:
        return ["p99_ttft", "p99_tpot"]
    return list(objectives[:2]) if len(objectives) >= 2 else list(objectives[:1])


def optuna_figures(study: optuna.Study, objectives: Sequence[str]) -> list[tuple[str, Any]]:
    """Optuna's history and importance plots, one per objective: (title, figure or the
    reason it could not be drawn). Importance is of reaching *good* values: a maximised
    objective is negated for it (Optuna's evaluator looks for low values)."""
    figures: list[tuple[str, Any]] = []
    for index, name in enumerate(objectives):
        sign = -1.0 if study.directions[index] == optuna.study.StudyDirection.MAXIMIZE else 1.0

        def target(trial: optuna.trial.FrozenTrial, index: int = index, name: str = name) -> float:
            return float(trial.values[index]) * _scale(name)

        def goodness(
            trial: optuna.trial.FrozenTrial, index: int = index, sign: float = sign
        ) -> float:
            return sign * float(trial.values[index])

        figure = optuna.visualization.plot_optimization_history(
            study, target=target, target_name=_label(name)
        )
        figure.update_layout(**LAYOUT, title=f"Optimisation history: {name}", height=380)
        figures.append((f"history-{name}", figure))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "low target values": as meant
                importance = optuna.visualization.plot_param_importances(
                    study, target=goodness, target_name=name
                )
            for bars in importance.data:  # the knobs' names, not the parameters'
                params = list(bars.y)
                bars.y = [knob_of_param(param) for param in params]
                if isinstance(bars.hovertemplate, tuple | list):
                    bars.hovertemplate = [
                        text.replace(param, knob_of_param(param), 1)
                        for param, text in zip(params, bars.hovertemplate, strict=True)
                    ]
            importance.update_layout(
                **LAYOUT, title=f"Parameter importance: {name}", height=320, yaxis_title="knob"
            )
            figures.append((f"importance-{name}", importance))
        except (RuntimeError, ValueError, ZeroDivisionError) as exc:
            figures.append((f"importance-{name}", f"parameter importance for {name}: {exc}"))
    return figures


def cdf_figure(compared: Sequence[tuple[str, dict[str, Any]]]) -> go.Figure:
    """TTFT, TPOT and ITL distributions (CDFs from each timeline's percentiles)."""
    names = (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"))
    fig = make_subplots(rows=1, cols=3, subplot_titles=[f"{label} CDF" for _, label in names])
    for column, (key, label) in enumerate(names, start=1):
        for who, timeline in compared:
            values = timeline["quantiles"].get(key) or []
            levels = [i / (len(values) - 1) for i in range(len(values))] if len(values) > 1 else []
            fig.add_trace(
                go.Scatter(
                    x=[v * 1000 for v in values],
                    y=levels,
                    mode="lines",
                    name=who,
                    legendgroup=who,
                    showlegend=column == 1,
                    line={"color": COLOURS[run_kind(who)]},
                    hovertemplate=f"{who}: {label} %{{x:.2f}} ms at %{{y:.0%}}<extra></extra>",
                ),
                row=1,
                col=column,
            )
        fig.update_xaxes(title_text=f"{label} (ms)", type="log", row=1, col=column)
    fig.update_yaxes(title_text="share of requests", row=1, col=1)
    fig.update_layout(**LAYOUT, height=380, title="Latency distributions")
    return fig


def run_kind(who: str) -> str:
    return "baseline" if who.startswith("baseline") else "recommended"


def load_figure(compared: Sequence[tuple[str, dict[str, Any]]]) -> go.Figure:
    """KV use and running / waiting requests over the whole run, side by side."""
    fig = make_subplots(
        rows=2,
        cols=len(compared),
        shared_xaxes=True,
        shared_yaxes=True,
        vertical_spacing=0.08,
        subplot_titles=[who for who, _ in compared],
    )
    for column, (who, timeline) in enumerate(compared, start=1):
        load = timeline["load"]
        fig.add_trace(
            go.Scatter(
                x=load["t_s"],
                y=[None if v is None else v * 100 for v in load["kv_usage"]],
                name="KV cache in use",
                legendgroup="kv",
                showlegend=column == 1,
                line={"color": "#264653"},
                hovertemplate="%{y:.1f}% of the KV pool<extra></extra>",
            ),
            row=1,
            col=column,
        )
        for key, colour in (("running", "#2a9d8f"), ("waiting", "#e76f51")):
            fig.add_trace(
                go.Scatter(
                    x=load["t_s"],
                    y=load[key],
                    name=f"{key} requests",
                    legendgroup=key,
                    showlegend=column == 1,
                    line={"color": colour, "shape": "hv"},
                ),
                row=2,
                col=column,
            )
        if any(load.get("preempted") or []):
            fig.add_trace(
                go.Scatter(
                    x=load["t_s"],
                    y=load["preempted"],
                    name="preemptions so far",
                    legendgroup="preempted",
                    showlegend=column == 1,
                    line={"color": "#6a4c93", "dash": "dot", "shape": "hv"},
                ),
                row=2,
                col=column,
            )
        preempted = timeline.get("preemptions", 0)
        fig.layout.annotations[column - 1].text = f"{who}: {preempted} preemptions"
    fig.update_yaxes(title_text="KV cache (%)", row=1, col=1)
    fig.update_yaxes(title_text="requests", row=2, col=1)
    fig.update_layout(**LAYOUT, height=520, title="Load over the run")
    return fig
