"""The report's figures, as data: axis titles carry units, importance names the knobs, every
step of the timeline's window is a bar wide enough to be drawn, the TPOT/ITL SLO is drawn on
the streams and the slowest stream named, the axes span the data, and the timeline's PNG shows
the same (issue 41 item 12)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from prefill_tuner.objectives.slo import parse_slos
from prefill_tuner.output.html.figures import optuna_figures, pareto_figure
from prefill_tuner.output.html.image import timeline_image, timeline_png
from prefill_tuner.output.html.timeline import timeline_figure
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.summary import summarize_stored
from tests.conftest import AZURE


def _window(
    starts: list[float],
    durations: list[float],
    prefill: list[int],
    streams: list[dict] | None = None,
    arrival: float = 0.0,
) -> dict:
    steps = {
        "start_s": starts,
        "duration_s": durations,
        "prefill_tokens": prefill,
        "decode_tokens": [1] * len(starts),
    }
    prompt = {"arrival_s": arrival, "first_token_s": arrival + 3.0}
    window = {
        "long_prompt": prompt,
        "start_s": min(starts),
        "end_s": max(s + d for s, d in zip(starts, durations, strict=True)),
        "steps": steps,
        "streams": streams or [],
    }
    return {"window": window}


def _stream(name: str, start: float, gaps: list[float]) -> dict:
    times = [start + sum(gaps[: i + 1]) for i in range(len(gaps))]
    return {"id": name, "token_s": times, "itl_s": gaps}


STREAMED = [
    (
        "baseline (trial 0)",
        _window(
            [100.0, 100.4, 100.9, 103.5],
            [0.4, 0.5, 2.6, 0.5],
            [16, 2048, 8192, 0],
            [_stream("a", 100.0, [0.02, 0.4, 2.6]), _stream("b", 100.0, [0.02, 0.5, 0.3])],
            arrival=100.9,
        ),
    ),
    (
        "recommended (trial 7)",
        _window(
            [100.0 + 0.3 * i for i in range(12)],
            [0.29] * 12,
            [512] * 12,
            [_stream("c", 100.0, [0.03] * 9), _stream("d", 100.1, [0.03, 0.04, 0.031])],
            arrival=100.9,
        ),
    ),
]
"""Two runs with two streams each, on a clock that starts 100 s before the window."""


def test_every_step_of_the_window_is_a_bar_a_few_pixels_wide() -> None:
    """Plotly's own bar width is the smallest gap between two steps: two steps 1 ms apart in a
    5 s window made every bar a tenth of a pixel, and most were not drawn."""
    compared = [
        ("baseline", _window([0, 1e-3, 2, 5], [1e-3, 1.9, 2.9, 0.5], [16, 2048, 2048, 0])),
        ("recommended", _window([0.3 * i for i in range(17)], [0.29] * 17, [256] * 17)),
    ]  # fmt: skip
    figure = timeline_figure(compared)
    bars = [trace for trace in figure.data if trace.type == "bar"]
    assert len(bars) == 4  # prefill and decode tokens, for each run
    for trace in bars:
        timeline = dict(compared)[trace.meta["who"]]["window"]["steps"]
        starts, durations = timeline["start_s"], timeline["duration_s"]
        span = max(s + d for s, d in zip(starts, durations, strict=True)) - min(starts)
        assert list(trace.x) == starts and trace.offset == 0  # each bar starts with its step
        assert trace.width is not None and len(trace.width) == len(starts)
        for width, duration in zip(trace.width, durations, strict=True):
            assert width >= duration and width >= span / 200  # 3 pixels in a 600-pixel panel


@pytest.fixture
def storage(tune, tmp_path: Path) -> str:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(
        "run", "--trace", str(AZURE), "--max-requests", "120", "--trials", "8",
        "--slo", "p99_tpot=50ms", "--storage", storage, "--study", "s",
    )  # fmt: skip
    assert code == 0, err
    return storage


@pytest.fixture
def study(storage: str) -> optuna.Study:
    return optuna.load_study(study_name="s", storage=storage)


@pytest.fixture
def store_and_name(storage: str) -> tuple[TunerStore, str]:
    return TunerStore(storage, create=False), "s"


def test_history_axes_have_units_and_importance_names_the_knobs(study) -> None:
    figures = dict(optuna_figures(study, ["p99_ttft", "p99_tpot"]))
    history = figures["history-p99_ttft"]
    assert history.layout.yaxis.title.text == "p99_ttft (ms)"
    values = [v for trace in history.data for v in trace.y if v is not None]
    measured = [trial.values[0] * 1000 for trial in study.trials if trial.values]
    assert max(values) == pytest.approx(max(measured))  # plotted in ms, as the title says
    importance = figures["importance-p99_ttft"]
    names = [name for trace in importance.data for name in trace.y]
    assert "long_prefill_token_threshold" in names, names
    assert set(names) <= set(KNOBS) and not any("log2" in str(t) for t in importance.data)


def test_the_timeline_draws_the_tpot_and_itl_slos_across_the_streams() -> None:
    slos = parse_slos(["p99_tpot=50ms", "p90_itl[chat]=200ms", "p99_ttft=1s"])
    figure = timeline_figure(STREAMED, slos)
    lines = [trace for trace in figure.data if trace.meta and trace.meta["kind"] == "slo"]
    assert sorted({trace.name for trace in lines}) == [
        "p90 ITL (chat) SLO 200 ms",
        "p99 TPOT SLO 50 ms",
    ]  # the TTFT SLO is not an inter-token latency
    itl_axes = {figure.get_subplot(3, column).yaxis.plotly_name for column in (1, 2)}
    for trace in lines:
        assert set(trace.y) == {50.0 if "TPOT" in trace.name else 200.0}
        assert f"yaxis{trace.yaxis[1:]}" in itl_axes  # on the streams' row, in both columns
        assert trace.mode == "lines+text" and trace.text[0] == trace.name  # labelled on the plot
    assert len(lines) == 4 and sum(trace.showlegend for trace in lines) == 2
    assert not [t for t in timeline_figure(STREAMED).data if t.meta and t.meta["kind"] == "slo"]


def test_the_slowest_stream_is_highlighted_and_named_the_others_grey() -> None:
    figure = timeline_figure(STREAMED)
    streams = [t for t in figure.data if t.meta and "stream" in t.meta["kind"]]
    slowest = {t.meta["who"]: t for t in streams if t.meta["kind"] == "slowest stream"}
    assert set(slowest) == {"baseline (trial 0)", "recommended (trial 7)"}
    assert slowest["baseline (trial 0)"].name == (
        "slowest stream, baseline (trial 0): request a (ITL up to 2600 ms)"
    )
    assert slowest["recommended (trial 7)"].name.startswith(
        "slowest stream, recommended (trial 7): request d (ITL up to 40 ms)"
    )
    assert all(t.showlegend for t in slowest.values())
    others = [t for t in streams if t.meta["kind"] == "stream"]
    assert [t.name for t in others] == ["other streams"] * 2
    assert [t.showlegend for t in others] == [True, False]  # one legend entry for them all
    colours = {t.line.color for t in others}
    assert len(colours) == 1 and colours.isdisjoint(t.line.color for t in slowest.values())
    assert all(t.line.width > others[0].line.width for t in slowest.values())
    assert figure.layout.showlegend is not False


def test_the_timeline_axes_span_each_window_and_no_more() -> None:
    figure = timeline_figure(STREAMED)
    for column, (_, run) in enumerate(STREAMED, start=1):
        window = run["window"]
        zero = window["long_prompt"]["arrival_s"]
        expected = [window["start_s"] - zero, window["end_s"] - zero]
        for row in (1, 2, 3):
            axis = figure.get_subplot(row, column).xaxis
            # shared per column: the bottom axis carries the range, the others follow it
            assert list(axis.range or figure.get_subplot(3, column).xaxis.range) == (
                pytest.approx(expected)
            )


def test_the_timeline_png_draws_the_same_picture() -> None:
    """The picture beside the report: the same panels, SLO line, named slowest streams and
    ranges, as a PNG of the size it says."""
    slos = parse_slos(["p99_tpot=50ms"])
    image = timeline_image(STREAMED, slos)
    assert image is not None
    grid = image.axes
    assert len(grid) == 6  # three rows, two runs
    legend = [text.get_text() for text in image.legends[0].get_texts()]
    assert "p99 TPOT SLO 50 ms" in legend and "other streams" in legend
    assert "slowest stream, baseline (trial 0): request a (ITL up to 2600 ms)" in legend
    for column, (who, run) in enumerate(STREAMED):
        window = run["window"]
        zero = window["long_prompt"]["arrival_s"]
        steps, _, streams = grid[column], grid[2 + column], grid[4 + column]
        assert steps.get_title() == who
        assert steps.get_xlim() == pytest.approx((window["start_s"] - zero, window["end_s"] - zero))
        flat = [line for line in streams.get_lines() if set(line.get_ydata()) == {50.0}]
        assert len(flat) == 1  # the SLO across the streams
        assert [t.get_text() for t in streams.texts] == ["p99 TPOT SLO 50 ms"]
    data = timeline_png(STREAMED, slos)
    assert data is not None and data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1400, 800)
    assert timeline_png(STREAMED, slos) == data  # no timestamp in it: the same study, the same file
    assert timeline_png([("baseline (trial 0)", {"window": None})]) is None


def test_the_pareto_axes_span_the_trials_not_the_other_axis_slo(store_and_name) -> None:
    """A TPOT SLO of 50 ms drew its line from 50 ms on the TTFT axis: two decades of nothing
    left of the trials."""
    store, name = store_and_name
    summary = summarize_stored(store, name)
    trials = store.trials(summary.study)
    figure = pareto_figure(
        trials, summary.objectives, summary.pareto, {"p99_tpot": 0.05}, summary.recommended
    )
    measured = [t.objectives["p99_ttft"] * 1000 for t in trials if t.status != "failed"]
    xs = [x for trace in figure.data for x in trace.x]
    assert min(xs) >= min(measured) / 1.2 and max(xs) <= max(measured) * 1.2
    (line,) = [trace for trace in figure.data if trace.meta["kind"] == "slo"]
    assert set(line.y) == {50.0}
