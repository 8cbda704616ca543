"""The report's figures, as data: axis titles carry units, importance names the knobs, every
step of the timeline's window is a bar wide enough to be drawn, the TPOT/ITL SLO is drawn on
the streams and the slowest stream named, the axes span the data, and the timeline's PNG shows
the same (issue 41 item 12); both mark and say the long prompt's front end, queue and prefill
to its first token where the engine knows them, its TTFT where not (issue 42)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from prefill_tuner.engines.timeline import build_timeline, real_steps
from prefill_tuner.objectives.metrics import RequestRecord
from prefill_tuner.objectives.slo import parse_slos
from prefill_tuner.output.html.figures import optuna_figures, pareto_figure
from prefill_tuner.output.html.image import timeline_image, timeline_png
from prefill_tuner.output.html.timeline import LIFE_FONT, MARKERS, panels, timeline_figure
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.summary import summarize_stored
from prefill_tuner.trace.model import Request, Trace
from tests.conftest import AZURE


def _window(
    starts: list[float],
    durations: list[float],
    prefill: list[int],
    streams: list[dict] | None = None,
    arrival: float = 0.0,
    life: dict | None = None,
) -> dict:
    steps = {
        "start_s": starts,
        "duration_s": durations,
        "prefill_tokens": prefill,
        "decode_tokens": [1] * len(starts),
    }
    prompt = {"arrival_s": arrival, "first_token_s": arrival + 3.0, **(life or {})}
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


LIVED = [
    (
        "baseline (trial 0)",
        _window(
            [100.0, 100.4, 100.9, 103.5],
            [0.4, 0.5, 2.6, 0.5],
            [16, 2048, 8192, 0],
            [_stream("a", 100.0, [0.02, 0.4, 2.6])],
            arrival=100.9,
            life={
                "prompt_tokens": 8000,
                "seen_s": 100.912,
                "admitted_s": 101.252,
                "first_token_s": 101.462,
            },
        ),
    ),
    STREAMED[1],  # stored before seen and admitted were kept (as a real server's: unknown)
]
LIFE = "long prompt 8,000 tokens: front end 12 ms, queued 340 ms, prefill to first token 210 ms"
TTFT = "long prompt: TTFT 3,000 ms"
STYLES = {words: style for _, words, style in MARKERS}


def _marks(shapes: list) -> dict[str, set[float]]:
    """Vertical lines by legend name → where they are (s from the arrival, rounded)."""
    found: dict[str, set[float]] = {}
    for shape in shapes:
        assert shape.x0 == shape.x1 and shape.line.color == STYLES[shape.name]["color"]
        assert shape.line.dash == STYLES[shape.name]["dash"]
        found.setdefault(shape.name, set()).add(round(shape.x0, 6))
    return found


def test_the_timeline_marks_and_says_the_long_prompts_front_end_queue_and_prefill() -> None:
    """Between its send and its first token: when the engine saw the long prompt and when its
    first step started, drawn on every row and said in ms under the column's name; a run
    that knows neither (a real server, an old stored timeline) keeps its two lines and says
    its TTFT."""
    figure = timeline_figure(LIVED)
    titles = [annotation.text for annotation in figure.layout.annotations]
    assert titles == [
        f"baseline (trial 0)<br>{LIFE_FONT}{LIFE}</span>",
        f"recommended (trial 7)<br>{LIFE_FONT}{TTFT}</span>",
    ]
    column_of = {"x": 0, "x3": 0, "x5": 0, "x2": 1, "x4": 1, "x6": 1}  # rows 1-3, 2 columns
    columns: list[list] = [[], []]
    for shape in figure.layout.shapes:
        columns[column_of[shape.xref]].append(shape)
    assert _marks(columns[0]) == {
        "long prompt sent": {0.0},
        "seen by the engine": {0.012},
        "its first step": {0.352},
        "its first token": {0.562},
    }
    assert _marks(columns[1]) == {"long prompt sent": {0.0}, "its first token": {3.0}}
    assert len(columns[0]) == 4 * 3 and len(columns[1]) == 2 * 3  # on every row
    legend = [shape.name for shape in figure.layout.shapes if shape.showlegend]
    assert sorted(legend) == sorted(STYLES)  # each named once

    image = timeline_image(LIVED)
    assert image is not None
    for column, (who, words) in enumerate(((LIVED[0][0], LIFE), (LIVED[1][0], TTFT))):
        top = image.axes[column]
        assert top.get_title() == who and [t.get_text() for t in top.texts] == [words]
        colours = {line.get_color() for line in top.get_lines()}
        assert (STYLES["seen by the engine"]["color"] in colours) == (column == 0)
        assert (STYLES["its first step"]["color"] in colours) == (column == 0)
    legend_texts = [text.get_text() for text in image.legends[0].get_texts()]
    assert set(STYLES) <= set(legend_texts)
    assert timeline_png(LIVED) is not None


def test_a_real_servers_timeline_knows_neither_moment_and_still_draws() -> None:
    """A real server's step log names no requests and its records no moment the engine saw
    them: the window says ``None`` for both, and the picture its TTFT."""
    trace = Trace((Request("a", 0.0, 100, 40), Request("long", 0.1, 4000, 2)))
    records = [
        RequestRecord("a", 0.0, [0.02 + 0.01 * i for i in range(40)], 40),
        RequestRecord("long", 0.1, [0.4, 0.41], 2),
    ]
    logged = [
        {
            "step": i,
            "logged_at_s": 1000.0 + 0.01 * (i + 1),
            "duration_s": 0.01,
            "prefill_tokens": 4000 if i == 15 else 0,
            "decode_tokens": 1,
            "prefill_requests": int(i == 15),
            "decode_requests": 1,
        }
        for i in range(45)
    ]
    timeline = build_timeline(trace, records, real_steps(logged, 1000.0))
    prompt = timeline["window"]["long_prompt"]
    assert prompt["id"] == "long" and prompt["seen_s"] is None and prompt["admitted_s"] is None
    compared = [("baseline (trial 0)", timeline)]
    [panel] = panels(compared)
    assert panel is not None and panel.life_label() == "long prompt 4,000 tokens: TTFT 300 ms"
    figure = timeline_figure(compared)
    assert {shape.name for shape in figure.layout.shapes} == {"long prompt sent", "its first token"}
    image = timeline_image(compared)
    assert image is not None
    assert [t.get_text() for t in image.axes[0].texts] == ["long prompt 4,000 tokens: TTFT 300 ms"]


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
