"""What the commands print: consoles, the study header, the progress display, one line per
trial (stop signals: :mod:`prefill_tuner.stopping`)."""

from __future__ import annotations

import io
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO, cast

import optuna
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Column, Table

from prefill_tuner.cli.fields import with_flags
from prefill_tuner.engines.base import TrialEngine
from prefill_tuner.engines.sim import SimResult
from prefill_tuner.engines.sim.waves import lockstep
from prefill_tuner.objectives.scoring import Objective
from prefill_tuner.objectives.slo import format_seconds
from prefill_tuner.search_spaces.space import baseline_outside_note
from prefill_tuner.study.plan import RATE_MULTIPLIER, StudyPlan
from prefill_tuner.study.run import StudyProgress, TrialResult
from prefill_tuner.trace import Trace
from prefill_tuner.trace.stats import TraceStats
from prefill_tuner.worker.claim import Claimed, Wait
from prefill_tuner.worker.loop import WorkerEvents


def output_console() -> Console:
    """Rich console for results: in a terminal, its own width; piped, plain text: no line
    ends in spaces, and prose is never wrapped (a grep for a sentence finds it whole; tables
    are laid out as for 160 columns), unless ``COLUMNS`` gives a width (rich reads it)."""
    console = Console(highlight=False)
    if console.is_terminal:  # a TTY, or one forced (TTY_COMPATIBLE=1, FORCE_COLOR)
        return console
    plain = cast(TextIO, PlainText(sys.stdout))
    if os.environ.get("COLUMNS", "").isdigit():
        return Console(file=plain, highlight=False)
    return Console(file=plain, highlight=False, width=160, soft_wrap=True)


class PlainText(io.TextIOBase):
    """A text stream that writes each line to ``stream`` without its trailing spaces (rich
    pads a table's title and caption, and wrapped prose, to the table's or the console's
    width)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.pending = ""

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        lines = (self.pending + text).split("\n")
        self.pending = lines.pop()
        if lines:
            self.stream.write("".join(line.rstrip() + "\n" for line in lines))
        return len(text)

    def flush(self) -> None:
        if self.pending:
            self.stream.write(self.pending)
            self.pending = ""
        self.stream.flush()


def error_console() -> Console:
    """Rich console on stderr for progress and notes (stdout keeps the results)."""
    return Console(stderr=True, highlight=False)


def json_safe(value: object) -> object:
    """JSON has no NaN: write null instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_safe(item) for item in value]
    return value


def quiet_optuna() -> None:
    """Optuna logs every trial at INFO; our own display says what matters."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.getLogger("optuna").setLevel(logging.ERROR)


def print_study_header(
    console: Console,
    plan: StudyPlan,
    trace_name: str,
    engine: TrialEngine,
    baseline_outside: dict[str, Any] | None = None,
    *,
    title: str | None = None,
) -> None:
    """What is about to be tuned: the study (or ``title``), the trace, the engine (and how far
    its numbers go), the space (and the engine defaults it leaves out, which the baseline runs
    all the same)."""
    console.print(
        escape(
            f"{title or f'study {plan.name}'} on {trace_name} ({len(plan.trace):,} requests) "
            f"with {engine.version}"
        ),
        soft_wrap=True,
    )
    for line in engine.about:
        console.print(escape(f"  {line}"), soft_wrap=True)
    for line in plan.space.describe():
        console.print(escape(f"  search {line}"), soft_wrap=True)
    for dropped in plan.space.dropped:
        console.print(escape(f"  dropped {dropped}"), soft_wrap=True)
    if baseline_outside:
        console.print(escape(f"  note: {baseline_outside_note(baseline_outside)}"), soft_wrap=True)
    for note in plan.trace.adjustments:
        console.print(escape(with_flags(f"  trace: {note}")), soft_wrap=True)
    if plan.shaping.max_concurrency is not None:
        console.print(
            f"  load: closed loop, at most {plan.shaping.max_concurrency:,} requests in flight "
            "(a request waits for a slot; its latencies count from its send)",
            soft_wrap=True,
        )


class ProgressDisplay:
    """A progress bar with the best feasible result so far (and, when trials take minutes, a
    line per finished trial)."""

    def __init__(
        self,
        console: Console,
        plan: StudyPlan,
        verbose: bool = False,
        *,
        idle: str = "no feasible trial yet",
    ) -> None:
        """``idle``: what the bar says until a trial of this run meets the SLOs."""
        self.plan, self.verbose, self.idle = plan, verbose, idle
        self.bar = Progress(
            TextColumn("[bold]trials"),
            BarColumn(bar_width=8),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[last]}"),
            # The description yields (cut short with an ellipsis), never the counts.
            TextColumn(
                "{task.description}",
                table_column=Column(ratio=1, no_wrap=True, overflow="ellipsis"),
            ),
            console=console,
            transient=False,
            expand=True,
        )
        self.task = self.bar.add_task(escape(idle), total=None, last="")
        self.best: TrialResult | None = None
        self.failed = 0
        self.ran = 0
        """Trials this run finished."""
        self.asked: tuple[int, int] | None = None
        """Trials finished before this run, and those it was to run (once it starts)."""
        self.progress = StudyProgress(
            on_start=self._start, on_trial=self._trial, on_recovered=self._recovered
        )

    def __enter__(self) -> ProgressDisplay:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.asked is not None and self.ran >= self.asked[1] and self.best is None:
            self.bar.update(self.task, description=escape(self.done()))
        self.bar.stop()

    def done(self) -> str:
        """What the bar says once every trial asked for ran and none of them met the SLOs
        (not "no feasible trial yet": nothing more is coming)."""
        assert self.asked is not None
        before, _ = self.asked
        if not self.ran:
            return f"done: the study already has its {before} trials"
        which = "trial of this run" if before else "trial"
        failed = f"; {self.failed} failed" if self.failed else ""
        return f"done: no {which} met the SLOs{failed}"

    def _start(self, finished: int, remaining: int) -> None:
        self.asked = (finished, remaining)
        self.bar.update(self.task, total=finished + remaining, completed=finished)
        if finished and remaining:
            self.bar.console.print(
                f"resuming: {finished} of {finished + remaining} trials done", markup=False
            )

    def _recovered(self, numbers: list[int]) -> None:
        """Trials an earlier run did not finish (stopped, killed): they run again."""
        one = len(numbers) == 1
        self.bar.console.print(
            f"trial{'' if one else 's'} {', '.join(str(number) for number in numbers)} did not "
            f"finish in an earlier run and {'runs' if one else 'run'} again",
            markup=False,
            soft_wrap=True,
        )

    def _trial(self, result: TrialResult) -> None:
        objectives = self.plan.objectives
        if result.verdict.feasible:
            first = objectives[0]
            better = self.best is None or (result.values[0] < self.best.values[0]) == (
                first.direction == "minimize"
            )
            if better:
                self.best = result
        self.failed += bool(result.failure)
        self.ran += 1
        description = self.idle
        if self.best is not None:
            shown = ", ".join(
                f"{o.name} {format_value(o.name, v)}"
                for o, v in zip(objectives, self.best.values, strict=True)
            )
            description = f"best feasible #{self.best.number}: {shown}"
        if self.failed:
            description += f"; {self.failed} failed"
        self.bar.update(
            self.task,
            advance=1,
            description=escape(description),
            last=f"last {format_duration(result.wall_s)}",
        )
        if self.verbose:
            self.bar.console.print(escape(trial_line(result, objectives)), soft_wrap=True)


def format_duration(seconds: float) -> str:
    """A trial's wall time: tenths of a second, then minutes."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest:02d} s"


def format_value(name: str, value: float) -> str:
    """An objective's value as people read it."""
    return f"{value:.3g}×" if name == RATE_MULTIPLIER else format_seconds(value)


def trial_line(result: TrialResult, objectives: Sequence[Objective]) -> str:
    """One line per finished trial: its values and verdict, or, for a failed trial, that it
    failed and why (its values are the optimiser's penalties, not measurements)."""
    took = f"; took {format_duration(result.wall_s)}" if result.wall_s else ""
    if result.overhead_s:
        took += (
            " ("
            + ", ".join(f"{part} {seconds:.1f} s" for part, seconds in result.overhead_s.items())
            + ")"
        )
    if result.failure:
        log = f" (log: {result.log_path})" if result.log_path else ""
        return f"trial {result.number} failed: {result.failure}{log}{took}"
    shown = ", ".join(
        f"{o.name} {'≥ ' if result.cut_short else ''}{format_value(o.name, v)}"
        for o, v in zip(objectives, result.values, strict=True)
    )
    verdict = "meets the SLOs" if result.verdict.feasible else "misses the SLOs"
    why = f"; cut short: {result.cut_short}" if result.cut_short else ""
    if result.same_as is not None:
        why += f"; the settings of trial {result.same_as}: its result reused, not rerun"
    return f"trial {result.number} {verdict}: {shown}{why}{took}"


class WorkerDisplay:
    """One line per event, prefixed with the worker's name (logs of many machines mix)."""

    def __init__(self, console: Console, worker: str, plan: StudyPlan) -> None:
        self.console, self.worker, self.plan = console, worker, plan
        self.interrupted = False

    def say(self, text: str) -> None:
        self.console.print(escape(with_flags(f"worker {self.worker}: {text}")), soft_wrap=True)

    def events(self) -> WorkerEvents:
        return WorkerEvents(
            claimed=self._claimed,
            finished=self._finished,
            waiting=self._waiting,
            lost=lambda number: self.say(
                f"trial {number} was failed by another worker (heartbeats late by more than "
                "--grace) and queued again; this result is dropped"
            ),
            gave_up=self._gave_up,
            screening=self.say,
        )

    def _claimed(self, claim: Claimed) -> None:
        retry = f" (retry of trial {claim.retry_of})" if claim.retry_of is not None else ""
        screened = claim.trial.user_attrs.get("screened_from")
        if screened is not None:
            retry += f" (simulated trial {screened}'s settings)"
        self.say(f"trial {claim.trial.number} started{retry}")

    def _finished(self, result: TrialResult) -> None:
        self.say(trial_line(result, self.plan.objectives))

    def _waiting(self, wait: Wait) -> None:
        if wait.for_baseline:
            self.say("waiting for the baseline, running on another worker: the screening needs it")
        else:
            self.say(f"waiting: {wait.running} trial(s) still running on other workers")

    def _gave_up(self, number: int | None) -> None:
        self.interrupted = True
        if number is None:
            self.say("interrupted")
        else:
            self.say(f"interrupted: trial {number} marked failed and queued for another worker")


def summary_table(
    unit: str,
    rows: Mapping[str, Mapping[str, float]],
    keys: Sequence[str],
    show: Callable[[float], str],
) -> Table:
    """A small table of summaries (rows) by statistic (columns)."""
    table = Table(box=None, pad_edge=False)
    table.add_column(unit)
    for key in keys:
        table.add_column(key, justify="right")
    for name, summary in rows.items():
        table.add_row(escape(name), *(show(summary[key]) for key in keys))
    return table


def render_sim_result(trace: Trace, result: SimResult, profile_note: str = "") -> Table:
    """The metric summary as a table."""
    metrics = result.metrics
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    config = result.config
    table.add_row("engine", escape(f"{result.engine_version}; profile {result.profile}"))
    if profile_note:
        table.add_row("profile", escape(profile_note))
    table.add_row(
        "config",
        f"max_num_batched_tokens={config.max_num_batched_tokens} "
        f"max_num_seqs={config.max_num_seqs} chunked={config.enable_chunked_prefill} "
        f"threshold={config.long_prefill_token_threshold}"
        f"{' (adaptive)' if config.long_prefill_token_threshold_adaptive else ''} "
        f"reserve_full_isl={config.scheduler_reserve_full_isl} "
        f"blocks={config.num_gpu_blocks}x{config.block_size} "
        f"{'async' if config.async_scheduling else 'sync'} scheduling",
    )
    table.add_row(
        "requests",
        f"{metrics.requests:,} ({metrics.completed:,} completed, {metrics.failed:,} failed)",
    )
    rates = (
        f"{metrics.request_throughput:.2f} req/s, {metrics.output_throughput:,.0f} output tok/s"
        if metrics.completed
        else "no request completed: no rate, no latency (why: failed, below)"
    )
    table.add_row("duration", f"{metrics.duration_s:,.1f} s simulated; {rates}")
    if result.max_concurrency is not None:
        waits = [wait for wait in result.client_waits(trace) if wait > 0]
        held = (
            f"{len(waits):,} of {len(trace):,} requests waited for a slot (up to "
            f"{max(waits):,.2f} s; their latencies count from their sends)"
            if waits
            else "no request waited for a slot"
        )
        table.add_row(
            "client", f"closed loop, at most {result.max_concurrency:,} in flight: {held}"
        )
    latency = summary_table(
        "ms",
        {
            "TTFT": metrics.ttft_s,
            "TPOT": metrics.tpot_s,
            "ITL": metrics.itl_s,
            "E2E": metrics.e2el_s,
        },
        ("mean", "p50", "p90", "p99", "max"),
        lambda seconds: f"{seconds * 1000:,.1f}",
    )
    if metrics.completed:
        table.add_row("latency", latency)
    if (waves := lockstep(trace, result.max_concurrency, result.admitted_together)) is not None:
        table.add_row("TTFT caveat", escape(waves.line()))
    for name, own in metrics.by_class.items():  # what per-class SLOs would judge
        table.add_row(
            escape(f"class {name}"),
            f"{own.requests:,} requests ({own.completed:,} completed, {own.failed:,} failed)",
        )
        table.add_row(
            "",
            summary_table(
                "ms",
                {"TTFT": own.ttft_s, "TPOT": own.tpot_s},
                ("mean", "p50", "p90", "p99", "max"),
                lambda seconds: f"{seconds * 1000:,.1f}",
            ),
        )
    table.add_row(
        "engine load",
        f"{result.steps:,} steps; {result.preemptions:,} preemptions; peak KV "
        f"{result.peak_kv_usage:.1%} of {result.usable_kv_blocks:,} blocks",
    )
    if result.prefix_cache_queries:
        rate = result.prefix_cache_hits / result.prefix_cache_queries
        table.add_row(
            "prefix cache",
            f"{rate:.1%} of {result.prefix_cache_queries:,} prompt tokens looked up were hits",
        )
    if metrics.single_token_requests:
        table.add_row("note", f"{metrics.single_token_requests:,} one-token requests have no TPOT")
    for reason, count in metrics.failure_reasons.items():
        table.add_row("failed", escape(f"{count:,}: {reason}"))
    for note in trace.adjustments:
        table.add_row("note", escape(with_flags(str(note))))
    table.add_row("wall time", f"{result.wall_s:.2f} s")
    return table


def render_stats(trace: Trace, stats: TraceStats) -> Table:
    """The stats as a two-column table (a token sub-table inside)."""
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    if trace.source is not None:
        digest = f", sha256 {trace.source.sha256[:12]}…" if trace.source.sha256 else ""
        table.add_row("trace", escape(f"{trace.source.path} ({trace.source.format}{digest})"))
    table.add_row("requests", f"{stats.requests:,}")
    table.add_row("duration", f"{stats.duration_s:,.1f} s ({stats.duration_s / 60:,.1f} min)")
    table.add_row(
        "mean rate",
        f"{stats.mean_rate:.2f} req/s"
        if math.isfinite(stats.mean_rate)
        else "n/a (all requests arrive at once)",
    )
    table.add_row(
        "burstiness",
        f"index of dispersion {stats.index_of_dispersion:.2f} (1 = Poisson); "
        f"at most {stats.max_per_second} requests in one second",
    )
    tokens = summary_table(
        "tokens",
        {"prompt": stats.prompt_tokens, "output": stats.output_tokens},
        ("p50", "p90", "p99", "max", "mean"),
        lambda count: f"{count:,.0f}",
    )
    table.add_row("lengths", tokens)
    table.add_row(
        "offered load",
        f"{_si(stats.prompt_tokens_per_s)} prompt tok/s, {_si(stats.output_tokens_per_s)} "
        "output tok/s",
    )
    if stats.classes:
        unclassed = stats.requests - sum(stats.classes.values())
        counts = [escape(f"{name} {count:,}") for name, count in stats.classes.items()]
        table.add_row("classes", ", ".join(counts + ([f"none {unclassed:,}"] if unclassed else [])))
    if stats.prefix_reuse is None:
        table.add_row("prefix reuse", "no prefix-block ids in this trace")
    else:
        table.add_row(
            "prefix reuse",
            f"{stats.prefix_reuse:.1%} of {stats.prefix_blocks:,} prefix blocks were seen "
            "before (upper bound on the prefix-cache hit rate)",
        )
    for note in trace.adjustments:
        table.add_row("note", escape(with_flags(str(note))))
    return table


def _si(value: float) -> str:
    if not math.isfinite(value):
        return "n/a"
    return f"{value / 1000:.3g}k" if abs(value) >= 1000 else f"{value:.3g}"


def print_document(document: BaseModel) -> None:
    """A JSON document on stdout, whole (no terminal wrapping, no colour)."""
    sys.stdout.write(document.model_dump_json(indent=2) + "\n")
