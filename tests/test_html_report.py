"""The HTML report, opened in a real browser (Debian's Chromium driven by Playwright, the
network cut off): it renders without a console error, every trial is a point on the Pareto
plot, every step of the window a point on the timeline, the baseline and the recommended
setting are marked, and its serve line is ``tune export --format shell``'s.

``scripts/setup-browser`` installs Chromium (the README's test command runs it); without it
the test fails in CI and is skipped elsewhere, saying why. ``UPDATE_README_SCREENSHOT=1``
writes the timeline's screenshot to ``docs/images/report-timeline.png`` (the README's)."""

from __future__ import annotations

import html
import json
import os
import shutil
from pathlib import Path

import pytest

from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.summary import summarize_stored
from tests.conftest import AZURE, ROOT

CHROMIUM = Path("/usr/bin/chromium")
README_SCREENSHOT = ROOT / "docs" / "images" / "report-timeline.png"
SECTIONS = ("answer", "definition", "pareto", "history", "comparison", "trials", "serve")


def _need_browser() -> None:
    missing = []
    if not CHROMIUM.exists():
        missing.append(f"{CHROMIUM} (Debian's chromium)")
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package")
    if missing:
        reason = (
            f"no browser to test the report in: {', '.join(missing)}; run scripts/setup-browser"
        )
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)


@pytest.fixture
def study(tune, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """A simulated study whose `tune run` wrote its report by default (in its directory)."""
    folder = tmp_path / "study"
    folder.mkdir()
    storage = f"sqlite:///{folder / 'tune.db'}"
    monkeypatch.delenv("TUNE_NO_REPORT")
    monkeypatch.chdir(folder)
    code, _, err = tune(
        "run", "--trace", str(AZURE), "--max-requests", "300", "--trials", "10",
        "--slo", "p99_tpot=25ms", "--slo", "p99_ttft=1s", "--storage", storage,
        "--study", "shown",
    )  # fmt: skip
    assert code == 0, err
    assert "report: shown-report.html" in err
    code, export, err = tune("export", "--format", "shell", "--storage", storage)
    assert code == 0, err
    return {"storage": storage, "report": folder / "shown-report.html", "export": export}


@pytest.mark.slow
def test_the_report_renders_offline_with_every_trial_and_step(study, tmp_path: Path) -> None:
    _need_browser()
    from playwright.sync_api import sync_playwright

    report = study["report"]
    assert isinstance(report, Path)
    size_mb = report.stat().st_size / 2**20
    assert size_mb < 8, size_mb  # plotly.js embedded once
    store = TunerStore(str(study["storage"]))
    trials = store.trials(store.get_study("shown"))
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"]
        )
        try:
            context = browser.new_context(offline=True, viewport={"width": 1400, "height": 900})
            requests: list[str] = []
            context.route(
                "**/*",
                lambda route: (
                    route.continue_()
                    if route.request.url.startswith("file://")
                    else (requests.append(route.request.url), route.abort())
                ),
            )
            page = context.new_page()
            errors: list[str] = []
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(report.as_uri())
            page.wait_for_function("document.querySelectorAll('.js-plotly-plot').length >= 7")
            assert errors == [] and requests == []

            # Every trial is a point, rendered: feasible, infeasible and failed apart.
            pareto = page.evaluate(POINTS, "fig-pareto")
            kinds = {t["kind"]: t for t in pareto}
            assert sum(kinds[k]["data"] for k in ("feasible", "infeasible", "failed")) == len(
                trials
            )
            assert all(t["rendered"] == t["data"] for t in pareto if t["mode"] == "markers")
            numbers = sorted(
                n for k in ("feasible", "infeasible", "failed") for n in kinds[k]["trials"]
            )
            assert numbers == sorted(t.trial_number for t in trials)
            # The baseline and the recommended setting are marked, and named in the legend.
            recommended = next(t for t in trials if f"recommended (trial {t.trial_number})" in
                               [x["name"] for x in pareto])  # fmt: skip
            assert kinds["baseline"]["trials"] == [0] and kinds["baseline"]["rendered"] == 1
            assert kinds["recommended"]["trials"] == [recommended.trial_number]
            legend = page.locator("#fig-pareto .legendtext").all_text_contents()
            assert "baseline (trial 0)" in legend
            assert f"recommended (trial {recommended.trial_number})" in legend

            # The timeline: one point per step of each window, as the page's data says.
            data = json.loads(page.locator("#timeline-data").inner_text())
            steps = [t for t in page.evaluate(POINTS, "fig-timeline") if t["kind"] == "steps"]
            assert [s["who"] for s in steps] == list(data)
            for trace, timeline in zip(steps, data.values(), strict=True):
                count = len(timeline["window"]["steps"]["start_s"])
                assert count > 10 and trace["data"] == trace["rendered"] == count

            # Axes fitted to the data as drawn: each column's time axis spans its window, each
            # row's y axis goes from zero to the row's top (not plotly.js's empty [-1, 4]).
            axes = page.evaluate(AXES, "fig-timeline")
            top = max(max(t["window"]["steps"]["duration_s"]) for t in data.values()) * 1000
            for trace in steps:
                window = data[trace["who"]]["window"]
                zero = window["long_prompt"]["arrival_s"]
                x_range, y_range = axes[trace["who"]]
                assert x_range == pytest.approx(
                    [window["start_s"] - zero, window["end_s"] - zero], abs=1e-6
                )
                assert y_range[0] == 0 and top <= y_range[1] <= top * 1.2  # one scale a row
            # The SLO on the streams, the slowest stream of each run named in the legend.
            legend = page.locator("#fig-timeline .legendtext").all_text_contents()
            assert "p99 TPOT SLO 25 ms" in legend
            assert [text.split(":")[0] for text in legend if text.startswith("slowest")] == [
                f"slowest stream, {who}" for who in data
            ]

            # The answer comes first: above every figure, its serve line the export's.
            assert page.locator("#answer").bounding_box()["y"] < min(
                box["y"] for box in page.locator(".js-plotly-plot").evaluate_all(BOXES)
            )
            assert page.locator("#answer-serve-line").inner_text() == recommended.serve_command

            # What tune diagnose finds, for both runs.
            findings = page.locator("#findings").inner_text()
            assert "What baseline (trial 0) shows" in findings
            assert f"What recommended (trial {recommended.trial_number}) shows" in findings
            # The serve line is the export's, character for character.
            line = page.locator("#serve-line").inner_text()
            assert line == str(study["export"]).splitlines()[2]
            assert line == recommended.serve_command

            # The trial table sorts: by trial number, descending on the second click.
            header = page.locator("#trial-table th").first
            header.click()
            header.click()
            first = page.locator("#trial-table tbody tr").first.locator("td").first
            assert first.inner_text().startswith(str(max(t.trial_number for t in trials)))

            for section in SECTIONS:
                page.locator(f"#{section}").screenshot(path=str(tmp_path / f"{section}.png"))
                assert (tmp_path / f"{section}.png").stat().st_size > 1000
            timeline = tmp_path / "timeline.png"
            page.locator("#fig-timeline").screenshot(path=str(timeline))
            if os.environ.get("UPDATE_README_SCREENSHOT"):
                README_SCREENSHOT.parent.mkdir(exist_ok=True)
                shutil.copyfile(timeline, README_SCREENSHOT)
        finally:
            browser.close()
    assert README_SCREENSHOT.stat().st_size < 300 * 1024


POINTS = """(id) => {
  const gd = document.getElementById(id);
  return gd._fullData.map((trace, index) => {
    const group = gd.querySelector('.trace' + trace.uid);
    const meta = gd.data[index].meta || {};
    return {
      name: trace.name,
      kind: meta.kind || '',
      who: meta.who || '',
      trials: meta.trials || [],
      mode: trace.mode || '',
      data: (gd.data[index].x || []).length,
      rendered: group ? group.querySelectorAll('.points path.point').length : 0,
    };
  });
}"""


AXES = """(id) => {
  const gd = document.getElementById(id);
  const ranges = {};
  gd._fullData.forEach((trace, index) => {
    const meta = gd.data[index].meta || {};
    if (meta.kind !== 'steps') return;
    const x = gd._fullLayout[trace.xaxis.replace('x', 'xaxis')];
    const y = gd._fullLayout[trace.yaxis.replace('y', 'yaxis')];
    ranges[meta.who] = [x.range, y.range];
  });
  return ranges;
}"""

BOXES = "(elements) => elements.map(e => { const r = e.getBoundingClientRect(); return {y: r.y}; })"


def test_tune_report_writes_again_and_refuses_a_bad_output(tune, tmp_path: Path) -> None:
    """`tune report` from storage: a trace that has since gone is said in the report (no
    timeline to simulate), not an error; a folder as the output is refused in one line."""
    trace = tmp_path / "gone.csv"
    trace.write_bytes(AZURE.read_bytes())
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(
        "run", "--trace", str(trace), "--max-requests", "80", "--trials", "3",
        "--slo", "p99_tpot=50ms", "--storage", storage, "--study", "gone", "--no-report",
    )  # fmt: skip
    assert code == 0, err
    assert not (Path.cwd() / "gone-report.html").exists()
    code, out, err = tune("report", "--storage", storage, "-o", str(tmp_path))
    assert code == 2 and out == "" and err.count("\n") == 1 and "folder" in err
    trace.unlink()
    page = tmp_path / "gone.html"
    code, _, err = tune("report", "--storage", storage, "-o", str(page))
    assert code == 0 and err == f"report: {page}\n"  # no timeline: no picture of it
    assert not (tmp_path / "gone.png").exists()
    text = page.read_text()
    assert "cannot be read here" in text and 'id="serve-line"' in text
    # The recommendation's headroom (issue 29), from the stored checks.
    assert '<p class="headroom">headroom (trial ' in text and "headroom rule:" in text


@pytest.mark.slow
def test_the_report_leads_with_the_answer_and_writes_its_timeline_png(
    tune, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 41 item 12: before any figure, the serve line to deploy (copyable), what it
    changes against the defaults and its load headroom; the timeline as a PNG beside the page,
    written as every output is (a link in its place is refused before the work)."""
    monkeypatch.delenv("TUNE_NO_REPORT")
    monkeypatch.chdir(tmp_path)
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    # The bundled sample, whose defaults miss the SLO.
    code, _, err = tune(
        "run", "--trials", "6", "--slo", "p99_tpot=50ms", "--storage", storage,
        "--study", "the-answer-first",
    )  # fmt: skip
    assert code == 0, err
    # On one line, however long: a pipe's reader greps for it.
    assert (
        "\nreport: the-answer-first-report.html "
        "(its timeline as a picture: the-answer-first-report.png)\n" in err
    )
    image = tmp_path / "the-answer-first-report.png"
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.stat().st_size > 20_000

    text = (tmp_path / "the-answer-first-report.html").read_text()
    answer = text[text.index('<section id="answer">') : text.index("</section>")]
    assert text.index('<section id="answer">') < text.index('class="plotly-graph-div"')
    summary = summarize_stored(TunerStore(storage), "the-answer-first")
    best, baseline = summary.recommended, summary.baseline
    assert best is not None and baseline is not None and best is not baseline
    assert f'<pre id="answer-serve-line">{html.escape(best.serve_command)}</pre>' in answer
    assert '<button data-copy="answer-serve-line">' in answer
    for name, label in (("p99_tpot", "p99 TPOT"), ("p99_ttft", "p99 TTFT")):
        old, new = baseline.objectives[name], best.objectives[name]
        scale, unit = (1, "s") if max(old, new) >= 1 else (1000, "ms")
        assert f"{label} {old * scale:.3g} → {new * scale:.3g} {unit}" in answer
    assert answer.index("p99 TPOT") < answer.index("p99 TTFT")  # the SLO'd one first
    assert summary.headroom is not None
    assert html.escape(summary.headroom.chosen.load_words()) in answer
    assert "trial 0, which misses the SLOs" in answer

    again = tmp_path / "again.html"
    (tmp_path / "again.png").symlink_to(tmp_path / "elsewhere.png")
    code, out, err = tune("report", "--storage", storage, "-o", str(again))
    assert code == 2 and out == "" and err.count("\n") == 1 and "symbolic link" in err
    assert not again.exists() and not (tmp_path / "elsewhere.png").exists()
    (tmp_path / "again.png").unlink()
    code, _, err = tune("report", "--storage", storage, "-o", str(again))
    assert (
        code == 0
        and err == f"report: {again} (its timeline as a picture: {again.with_suffix('.png')})\n"
    )
    assert again.with_suffix(".png").read_bytes() == image.read_bytes()


def test_tune_run_checks_the_picture_path_before_any_trial(
    tune, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PNG beside `--report` is an output like the page: a link, or the study's own trace,
    where it would go is refused before the first trial, not after the study."""
    monkeypatch.delenv("TUNE_NO_REPORT")
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    (tmp_path / "r.png").symlink_to(tmp_path / "elsewhere.png")
    code, out, err = tune(
        "run", "--trace", str(AZURE), "--max-requests", "50", "--trials", "2",
        "--slo", "p99_tpot=50ms", "--storage", storage, "--report", str(tmp_path / "r.html"),
    )  # fmt: skip
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert "r.png: is a symbolic link" in err
    assert not (tmp_path / "tune.db").exists() and not (tmp_path / "r.html").exists()
    trace = tmp_path / "t.png"  # a trace is read by its content, whatever its name
    trace.write_bytes(AZURE.read_bytes())
    code, out, err = tune(
        "run", "--trace", str(trace), "--max-requests", "50", "--trials", "2",
        "--slo", "p99_tpot=50ms", "--storage", storage, "--report", str(tmp_path / "t.html"),
    )  # fmt: skip
    assert code == 2 and "is the input file" in err and trace.read_bytes() == AZURE.read_bytes()


def test_when_nothing_meets_the_slos_the_answer_says_so_first(tune, tmp_path: Path) -> None:
    """No serve line to deploy: the report's first words say so, name the closest trial and
    what it misses, and its serve line is marked as not meeting them."""
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    code, _, err = tune(
        "run", "--trace", str(AZURE), "--max-requests", "50", "--trials", "2",
        "--slo", "p99_tpot=1ms", "--storage", storage, "--study", "none",
    )  # fmt: skip
    assert code not in (0, 2), err
    page = tmp_path / "none.html"
    code, _, err = tune("report", "--storage", storage, "-o", str(page))
    assert code == 0, err
    text = page.read_text()
    answer = text[text.index('<section id="answer">') : text.index("</section>")]
    summary = summarize_stored(TunerStore(storage), "none")
    closest = summary.closest_measured
    assert summary.recommended is None and closest is not None
    tpot = closest.objectives["p99_tpot"] * 1000
    assert f"<b>No setting met the SLOs.</b> The closest is trial {closest.trial_number}" in answer
    assert f"p99 TPOT {tpot:.3g} ms against its 1 ms limit" in answer
    assert "does <b>not</b> meet them" in answer
    assert f'<pre id="answer-serve-line">{html.escape(closest.serve_command)}</pre>' in answer
