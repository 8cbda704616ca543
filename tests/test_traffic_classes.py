"""Per-class SLOs: traffic classes on requests (the native ``class`` field, ``--classes``
bands), SLOs naming a class, metrics and early-abort bounds per class, the study end to end,
and a trace built so that judging per class must change which setting wins."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

from prefill_tuner.engines.sim import SimConfig, load_profile, simulate
from prefill_tuner.engines.sim.trial_engine import SimEngine
from prefill_tuner.errors import TunerError
from prefill_tuner.objectives.early_abort import EarlyAbortRule, Snapshot
from prefill_tuner.objectives.metrics import RequestRecord, summarize_run
from prefill_tuner.objectives.scoring import UNMEASURED, judge, statistic
from prefill_tuner.objectives.slo import parse_slo, parse_slos
from prefill_tuner.search_spaces.space import SearchSpace
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.first_trials import decode_batch
from prefill_tuner.study.infeasibility import latency_floor
from prefill_tuner.study.plan import StudyPlan
from prefill_tuner.trace import ShapeOptions, load_trace
from prefill_tuner.trace.classes import ClassBand, parse_classes
from prefill_tuner.trace.model import Request, Trace
from prefill_tuner.trace.native import write_native
from prefill_tuner.trace.stats import trace_stats
from prefill_tuner.worker.definition import plan_from_record

H100 = load_profile("llama-3.1-8b-h100")


# --- Classes on requests ----------------------------------------------------------------------
def test_bands_parse_and_are_stored_in_one_spelling() -> None:
    assert parse_classes("interactive=..1024, longdoc=8192..,mid=1025..8191") == (
        ClassBand("interactive", None, 1024),
        ClassBand("longdoc", 8192, None),
        ClassBand("mid", 1025, 8191),
    )
    options = ShapeOptions(classes=" a=..10 , b=11.. ")
    assert options.classes == "a=..10,b=11.."


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("a=..10,b=10..", "overlap"),
        ("a=..10,a=20..", "'a' given more than once"),
        ("=..10", "a class name is"),
        ("a b=..10", "a class name is"),
        ("x" * 33 + "=..10", "a class name is"),
        ("a=ten..20", "'ten' is not a whole number"),
        ("a=-1..20", "'-1' is not a whole number"),
        ("a=20..10", "low end 20 is above 10"),
        ("a=..", "at least one end"),
        ("a=10", "expected NAME=LO..HI"),
        ("", "expected NAME=LO..HI"),
    ],
)
def test_bad_bands_are_one_line_errors_with_exit_code_2(
    tune, tmp_path: Path, text: str, says: str
) -> None:
    with pytest.raises(TunerError, match=says):
        parse_classes(text)
    path = _written(_mixed_trace(), tmp_path)
    code, out, err = tune("trace", "stats", str(path), "--classes", text)
    assert code == 2 and says in err and len(err.strip().splitlines()) == 1
    assert "Traceback" not in err and out == ""


def test_bands_assign_classes_by_prompt_length_both_ends_inclusive(tmp_path: Path) -> None:
    requests = tuple(
        Request(str(i), float(i), prompt, 8, traffic_class="file")
        for i, prompt in enumerate([1024, 1025, 8191, 8192, 20000])
    )
    path = _written(Trace(requests), tmp_path)
    shaped = load_trace(str(path), options=ShapeOptions(classes="short=..1024,long=8192.."))
    assert [r.traffic_class for r in shaped.requests] == ["short", None, None, "long", "long"]
    assert [str(note) for note in shaped.adjustments] == [
        "unclassed 2 requests: prompt length in no band of `classes` short=..1024,long=8192.."
    ]
    # Without bands, the file's own classes stay.
    assert {r.traffic_class for r in load_trace(str(path)).requests} == {"file"}


def test_the_native_class_field_is_checked_and_counted(tune, tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 2, "class": "chat"}\n'
        '{"timestamp": 5, "input_length": 10, "output_length": 2, "class": "chat me"}\n'
    )
    code, _, err = tune("trace", "stats", str(path))
    assert code == 2
    assert err.strip() == (
        f"error: {path}:2: field 'class': expected a class name of 1-32 letters, digits, "
        "'_' or '-', got 'chat me'"
    )
    path.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 2, "class": "chat"}\n'
        '{"timestamp": 5, "input_length": 10, "output_length": 2}\n'
        '{"timestamp": 9, "input_length": 10, "output_length": 2, "class": "chat"}\n'
    )
    code, out, err = tune("trace", "stats", str(path))
    assert code == 0, err
    assert "chat 2, none 1" in out


# --- SLOs naming a class ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "text", ["p99_ttft[interactive]=500ms", "p95_TPOT[Long-Doc_2]=20ms", "max_e2el[x]=1.5s"]
)
def test_class_slos_round_trip_through_their_text(text: str) -> None:
    slo = parse_slo(text)
    assert slo.traffic_class is not None and slo.name.endswith(f"[{slo.traffic_class}]")
    assert parse_slo(str(slo)) == slo
    assert parse_slo("p99_ttft[Chat]=1s").traffic_class == "Chat"  # class names keep their case


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("p99_ttft[]=1s", "a traffic class is"),
        ("p99_ttft[a b]=1s", "expected STAT_METRIC"),
        ("p99_ttft[a=1s", "expected STAT_METRIC"),
        ("p99_ttft[a]]=1s", "expected STAT_METRIC"),
        ("p99_ttft[" + "x" * 33 + "]=1s", "a traffic class is"),
        ("p99_foo[a]=1s", "unknown metric"),
    ],
)
def test_bad_class_slos_are_one_line_errors(text: str, says: str) -> None:
    with pytest.raises(TunerError, match=says):
        parse_slo(text)


def test_the_same_slo_twice_is_an_error_but_per_class_ones_are_not() -> None:
    slos = parse_slos(["p99_ttft=2s", "p99_ttft[a]=1s", "p99_ttft[b]=3s"])
    assert [slo.name for slo in slos] == ["p99_ttft", "p99_ttft[a]", "p99_ttft[b]"]
    with pytest.raises(TunerError, match=r"p99_ttft\[a\] given more than once"):
        parse_slos(["p99_ttft[a]=1s", "p99_ttft[a]=2s"])


# --- Metrics per class ------------------------------------------------------------------------
def _records(with_classes: bool) -> list[RequestRecord]:
    def cls(name: str) -> str | None:
        return name if with_classes else None

    return [
        RequestRecord("a", 0.0, [0.1, 0.2, 0.3], 3, traffic_class=cls("chat")),
        RequestRecord("b", 0.5, [0.7, 0.8], 2, traffic_class=cls("chat")),
        RequestRecord("c", 1.0, [4.0, 4.5], 2, traffic_class=cls("doc")),
        RequestRecord("d", 1.0, [], 2, error="rejected", traffic_class=cls("doc")),
        RequestRecord("e", 2.0, [2.5, 2.6], 2),
    ]


def test_each_class_is_summarised_alone_and_the_whole_run_as_before() -> None:
    plain = summarize_run(_records(False))
    classed = summarize_run(_records(True))
    assert plain.by_class == {}
    assert set(classed.as_dict()["by_class"]) == {"chat", "doc"}
    assert {k: v for k, v in classed.as_dict().items() if k != "by_class"} == {
        k: v for k, v in plain.as_dict().items() if k != "by_class"
    }
    chat, doc = classed.by_class["chat"], classed.by_class["doc"]
    assert (chat.requests, chat.completed, chat.failed) == (2, 2, 0)
    assert (doc.requests, doc.completed, doc.failed) == (2, 1, 1)
    assert chat.ttft_s["max"] == pytest.approx(0.2) and doc.ttft_s["max"] == pytest.approx(3.0)
    assert statistic(classed, "max_ttft[chat]") == pytest.approx(0.2)
    assert statistic(classed, "max_ttft") == pytest.approx(3.0)
    assert math.isnan(statistic(classed, "max_ttft[nobody]"))


def test_a_class_with_no_completed_request_is_unmeasured_and_fails() -> None:
    records = [
        RequestRecord("a", 0.0, [0.1, 0.2], 2, traffic_class="chat"),
        RequestRecord("b", 0.0, [], 2, error="rejected", traffic_class="doc"),
    ]
    verdict = judge(summarize_run(records), parse_slos(["p99_ttft[doc]=10s"]), error_budget=0.5)
    assert verdict.constraints["p99_ttft[doc]"] == UNMEASURED
    assert verdict.constraints["errors"] <= 0 and not verdict.feasible


# --- Early abort per class --------------------------------------------------------------------
def test_early_abort_bounds_each_class_over_its_own_requests() -> None:
    # Two chats answered at once, and a document waiting 5 s for its first token.
    snapshot = Snapshot(
        now_s=5.0,
        sent_s=np.array([0.0, 0.0, 0.0]),
        first_token_s=np.array([0.1, 0.1, np.nan]),
        last_token_s=np.array([0.2, 0.2, np.nan]),
        tokens=np.array([2, 2, 0]),
        expected=np.array([2, 2, 2]),
        failed=np.zeros(3, dtype=bool),
        traffic_class=np.array(["chat", "chat", "doc"], dtype=object),
    )
    lenient = EarlyAbortRule(tuple(parse_slos(["max_ttft[chat]=1s", "max_ttft[doc]=10s"])))
    assert lenient.check(snapshot) is None
    bounds = lenient.lower_bounds(snapshot, droppable=0)
    assert bounds["max_ttft[chat]"] == pytest.approx(0.1)
    assert bounds["max_ttft[doc]"] == pytest.approx(5.0)
    strict = EarlyAbortRule(tuple(parse_slos(["max_ttft[chat]=1s", "max_ttft[doc]=2s"])))
    certainty = strict.check(snapshot)
    assert certainty is not None and certainty.reason.startswith("max_ttft[doc] ≥ 5s > 2s")
    # The chats alone are fine, and so is the class-less bound the document does not reach.
    chats_only = EarlyAbortRule(tuple(parse_slos(["max_ttft[chat]=1s", "p50_ttft=1s"])))
    assert chats_only.check(snapshot) is None


# --- The study: a class no request carries; end to end; workers -----------------------------
def _mixed_trace(chats: int = 40, docs: int = 4, gap_s: float = 0.25) -> Trace:
    rng = random.Random(0)
    requests = [
        Request(f"chat-{i}", i * gap_s, rng.randint(100, 600), rng.randint(20, 80))
        for i in range(chats)
    ]
    requests += [
        Request(f"doc-{i}", 1.0 + 2.5 * i, rng.randint(14000, 16000), rng.randint(10, 30))
        for i in range(docs)
    ]
    return Trace(tuple(sorted(requests, key=lambda r: r.arrival_s)))


def _written(trace: Trace, directory: Path) -> Path:
    path = directory / "mixed.jsonl"
    write_native(trace.requests, path)
    return path


def test_an_slo_naming_a_class_no_request_has_is_refused(tune, tmp_path: Path) -> None:
    trace = load_trace(
        str(_written(_mixed_trace(), tmp_path)), options=ShapeOptions(classes="chat=..1000")
    )
    with pytest.raises(TunerError, match=r"class 'doc'; the trace's classes: chat"):
        StudyPlan(
            name="s",
            trace=trace,
            shaping=ShapeOptions(),
            slos=parse_slos(["p99_ttft[doc]=1s"]),
            space=SearchSpace(ranges={}, fixed={}),
        )
    code, _, err = tune(
        "run", "--trace", str(_written(_mixed_trace(), tmp_path)), "--slo", "p99_ttft[chat]=1s",
        "--storage", f"sqlite:///{tmp_path / 'tune.db'}", "--trials", "1",
    )  # fmt: skip
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "no request of the trace is of class 'chat'; the trace's classes: none" in err


CLASSES = "chat=..1024,doc=8192.."
CLASS_SLOS = (
    "--slo",
    "p99_ttft[chat]=300ms",
    "--slo",
    "p99_ttft[doc]=5s",
    "--slo",
    "p99_tpot=50ms",
)


def test_tune_run_with_classes_end_to_end_and_a_worker_rebuilds_the_same_plan(
    tune, tmp_path: Path
) -> None:
    storage = f"sqlite:///{tmp_path / 'tune.db'}"
    trace = _written(_mixed_trace(), tmp_path)
    args = ["run", "--trace", str(trace), "--classes", CLASSES, *CLASS_SLOS, "--storage", storage]
    code, out, err = tune(*args, "--trials", "3", "--study", "s")
    assert code == 0, err
    store = TunerStore(storage)
    record = store.get_study("s")
    assert record is not None
    assert record.shaping["classes"] == CLASSES
    assert sorted(record.slos) == ["p99_tpot=50ms", "p99_ttft[chat]=300ms", "p99_ttft[doc]=5s"]
    trials = store.trials(record)
    assert len(trials) == 3
    for trial in trials:
        assert set(trial.constraints) == {"p99_ttft[chat]", "p99_ttft[doc]", "p99_tpot", "errors"}
        assert set(trial.objectives) == {"p99_ttft", "p99_tpot", "p99_ttft[chat]", "p99_ttft[doc]"}
        by_class = trial.metrics["by_class"]
        assert (by_class["chat"]["requests"], by_class["doc"]["requests"]) == (40, 4)
        assert trial.objectives["p99_ttft[doc]"] == pytest.approx(by_class["doc"]["ttft_s"]["p99"])
    assert "Per traffic class" in out and "[chat]" in out
    # The HTML report names the classes and plots the class SLOs.
    page = tmp_path / "s.html"
    code, _, err = tune("report", "--storage", storage, "--study", "s", "-o", str(page))
    assert code == 0, err
    text = page.read_text()
    assert "traffic classes: chat 40, doc 4" in text and "p99_ttft[chat]" in text
    # A worker rebuilds the same plan from the study's definition: classes and class SLOs.
    code, _, err = tune(*args, "--trials", "4", "--study", "w", "--create-only")
    assert code == 0, err
    worker_record = store.get_study("w")
    assert worker_record is not None
    plan = plan_from_record(worker_record, storage_url=storage, engine=SimEngine(H100))
    assert [str(slo) for slo in plan.slos] == [arg for arg in CLASS_SLOS if arg != "--slo"]
    assert plan.shaping.classes == CLASSES
    counts = {
        name: sum(r.traffic_class == name for r in plan.trace.requests) for name in ("chat", "doc")
    }
    assert counts == {"chat": 40, "doc": 4}
    code, _, err = tune("worker", "--study", "w", "--storage", storage)
    assert code == 0, err
    assert all("p99_ttft[chat]" in t.constraints for t in store.trials(worker_record))
    # Resuming with other bands is refused, naming the option and both values.
    other = [a if a != CLASSES else "chat=..512,doc=8192.." for a in args]
    code, _, err = tune(*other, "--trials", "3", "--study", "s")
    assert code == 2 and "classes" in err and CLASSES in err


# --- Per-class SLOs change the winner ---------------------------------------------------------
SETTINGS = {
    # One long prompt fills a whole step: documents are prefilled at once, chats wait.
    "whole prompts": {"max_num_batched_tokens": 16384, "long_prefill_token_threshold": 0},
    # Long prompts in 512-token chunks beside the chats: chats first, documents later.
    "chunked long prompts": {"max_num_batched_tokens": 4096, "long_prefill_token_threshold": 512},
}


def _winner(metrics: dict[str, object], slos: list[str]) -> str | None:
    """The feasible setting furthest inside every SLO (the recommendation when every
    objective is SLO'd), or ``None`` when none is feasible."""
    verdicts = {name: judge(m, parse_slos(slos)) for name, m in metrics.items()}  # type: ignore[arg-type]
    feasible = {name: v.min_slack for name, v in verdicts.items() if v.feasible}
    return max(feasible, key=lambda name: feasible[name]) if feasible else None


def test_per_class_slos_change_which_setting_wins(tmp_path: Path) -> None:
    """A steady stream of chats and a 15k-token document every 2.5 s. Judged class-less, the
    only TTFT limit the trace can meet is the documents' loose one, and the setting that
    prefills each document whole has the most room under it. Promised a tight TTFT, the chats
    would wait behind those whole-document steps: per class, only chunking long prompts keeps
    that promise, and it wins."""
    trace = load_trace(
        str(_written(_mixed_trace(chats=200, docs=8, gap_s=0.1), tmp_path)),
        options=ShapeOptions(classes="interactive=..1024,longdoc=8192.."),
    )
    metrics = {
        name: simulate(trace, SimConfig(**{**H100.engine_defaults, **s}), H100).metrics
        for name, s in SETTINGS.items()
    }
    whole, chunked = metrics["whole prompts"], metrics["chunked long prompts"]
    # Why: whole-document steps make chats wait; chunking delays the documents a little.
    assert (
        whole.by_class["interactive"].ttft_s["p99"]
        > 0.3
        > chunked.by_class["interactive"].ttft_s["p99"]
    )
    assert whole.ttft_s["p99"] < chunked.ttft_s["p99"] < 2.0
    # Class-less, the chats' tight limit is out of reach for the documents themselves...
    assert _winner(metrics, ["p99_ttft=300ms"]) is None
    # ...so the class-less study can only promise the loose one, and prefilling whole wins.
    assert _winner(metrics, ["p99_ttft=2s"]) == "whole prompts"
    # Per class, the same two limits: chunking long prompts wins.
    per_class = ["p99_ttft[interactive]=300ms", "p99_ttft[longdoc]=2s"]
    assert _winner(metrics, per_class) == "chunked long prompts"


def test_a_class_ttft_floor_is_over_its_requests_and_its_tpot_limit_sets_the_rule_trials(
    tmp_path: Path,
) -> None:
    trace = load_trace(
        str(_written(_mixed_trace(), tmp_path)), options=ShapeOptions(classes=CLASSES)
    )
    slos = parse_slos(["max_ttft[chat]=1s", "max_ttft[doc]=1s", "max_ttft=1s"])
    floors = {floor.slo.name: floor.floor_s for floor in latency_floor(trace, H100, slos)}
    # the documents' own bursts bound theirs; all requests' work bounds the class-less one more
    assert floors["max_ttft[chat]"] < 0.1 < floors["max_ttft[doc]"] <= floors["max_ttft"]
    plan = StudyPlan(
        name="s",
        trace=trace,
        shaping=ShapeOptions(classes=CLASSES),
        slos=parse_slos(["p99_tpot[chat]=40ms", "p99_tpot=80ms"]),
        space=SearchSpace(ranges={}, fixed={}),
    )
    batch = decode_batch(plan)
    assert batch is not None
    assert batch == pytest.approx(max(1.0, trace_stats(trace).output_tokens_per_s * 0.04))


def test_tune_simulate_shows_each_class(tune, tmp_path: Path) -> None:
    trace = _written(_mixed_trace(), tmp_path)
    code, out, err = tune("simulate", "--trace", str(trace), "--classes", CLASSES)
    assert code == 0, err
    flat = " ".join(out.split())
    assert "class chat 40 requests (40 completed, 0 failed)" in flat
    assert "class doc 4 requests (4 completed, 0 failed)" in flat
