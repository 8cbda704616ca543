"""The report's figures, as data: axis titles carry units, importance names the knobs, and
every step of the timeline's window is a bar wide enough to be drawn."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest

from prefill_tuner.output.html.figures import optuna_figures, timeline_figure
from prefill_tuner.search_spaces.knobs import KNOBS
from tests.conftest import AZURE


def _window(starts: list[float], durations: list[float], prefill: list[int]) -> dict:
    steps = {
        "start_s": starts,
        "duration_s": durations,
        "prefill_tokens": prefill,
        "decode_tokens": [1] * len(starts),
    }
    prompt = {"arrival_s": 0.0, "first_token_s": 3.0}
    return {"window": {"long_prompt": prompt, "steps": steps, "streams": []}}


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
def study(tune, tmp_path: Path) -> optuna.Study:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(
        "run", "--trace", str(AZURE), "--max-requests", "120", "--trials", "8",
        "--slo", "p99_tpot=50ms", "--storage", storage, "--study", "s",
    )  # fmt: skip
    assert code == 0, err
    return optuna.load_study(study_name="s", storage=storage)


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
