"""``tune plan``: how many replicas behind a router a trace needs, and their settings."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from prefill_tuner import defaults, exit_codes
from prefill_tuner.cli.declared_options import group, option
from prefill_tuner.cli.display import (
    ProgressDisplay,
    error_console,
    output_console,
    print_document,
    print_study_header,
    quiet_optuna,
)
from prefill_tuner.cli.options import (
    HARDWARE,
    SPACE,
    TRACE,
    JsonOpt,
    ModelOpt,
    SampledTraceOpt,
    SeedOpt,
    SloOpt,
    StorageOpt,
    TraceChoice,
    with_options,
)
from prefill_tuner.cli.tables import render_summary
from prefill_tuner.engines.sim.hardware import ProfileSpec
from prefill_tuner.engines.sim.trial_engine import SimEngine
from prefill_tuner.objectives.scoring import ERRORS
from prefill_tuner.output.documents import plan_document
from prefill_tuner.stopping import stop_signals
from prefill_tuner.storage.store import TunerStore
from prefill_tuner.study.plan import (
    SpaceSpec,
    StudyPlan,
    build_plan,
    check_study_name,
    default_study_name,
)
from prefill_tuner.study.replica_count import (
    CountResult,
    ReplicaPlan,
    ReplicaSearch,
    count_study_name,
    plan_replicas,
    replica_details,
)
from prefill_tuner.study.run import StudyProgress

SEARCH = group(ReplicaSearch, ("router", "max_replicas"), panel="Replicas")
"""The router and the most replicas (:class:`ReplicaSearch`'s fields)."""


@with_options(search=SEARCH, trace=TRACE, space=SPACE, hardware=HARDWARE)
def plan_command(
    slo: SloOpt,
    trace_file: SampledTraceOpt = defaults.SAMPLE_TRACE,
    trials: Annotated[
        int,
        option(
            StudyPlan,
            "trials",
            help="Trials per replica count: a count is not met when none of these meets the "
            "SLOs; the answer's study runs them all to find the best settings.",
        ),
    ] = defaults.PLAN_TRIALS,
    model: ModelOpt = defaults.MODEL,
    study_name: Annotated[
        str | None,
        typer.Option(
            "--study",
            help="Name the studies start with (STUDY-1x, STUDY-2x, ...; default: "
            "TRACE-plan-ROUTER).",
        ),
    ] = None,
    storage: StorageOpt = defaults.STORAGE,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
    *,
    search: ReplicaSearch,
    trace: TraceChoice,
    space: SpaceSpec,
    hardware: ProfileSpec,
) -> None:
    """Find the fewest replicas (behind a router, on the simulator) whose scheduler settings
    meet the SLOs, and those settings. Exit code 0: found; 4: not within --max-replicas;
    2: bad input; 130: interrupted (the same command resumes)."""
    err = error_console()
    router, max_replicas = search.router, search.max_replicas  # checked before the trace is read
    model = hardware.serve_name(model)
    step_model = hardware.step_model(model, space.fixed.get("max_model_len"))
    plan = build_plan(
        SimEngine(step_model),
        trace.at(trace_file),
        space,
        slos=slo,
        name=study_name or default_study_name(trace_file, f"plan-{router}"),
        storage_url=storage,
        model=model,
        trials=trials,
        seed=seed,
    )
    # every count's study name must be a study name too (the longest: the most replicas)
    check_study_name(count_study_name(plan.name, max_replicas), "--study, with its count,")
    store = TunerStore(storage)
    quiet_optuna()
    trace_name = "the bundled sample" if trace_file == defaults.SAMPLE_TRACE else str(trace_file)
    title = (
        f"plan {plan.name}: up to {max_replicas} replicas behind a {router} router, "
        f"{trials} trials per count,"
    )
    print_study_header(err, plan, trace_name, SimEngine(step_model), title=title)
    displays = _CountDisplays(err)
    interrupted = False
    with stop_signals(err):
        try:
            result = plan_replicas(
                plan, step_model, store, router=router, max_replicas=max_replicas, progress=displays
            )
        except KeyboardInterrupt:
            interrupted = True
        finally:
            displays.close()
    if interrupted:
        err.print("interrupted: every finished trial is kept; run the same command to resume")
        raise typer.Exit(exit_codes.INTERRUPTED)
    if as_json:
        print_document(plan_document(store, result))
    else:
        _print_plan(result)
    if result.replicas is None:
        raise typer.Exit(exit_codes.NOTHING_MEETS_SLOS)


class _CountDisplays:
    """A progress bar per replica count searched, one after the other."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.current: ProgressDisplay | None = None
        self.searched: set[int] = set()

    def __call__(self, replicas: int, plan: StudyPlan, met: bool) -> StudyProgress:
        self.close()
        again = replicas in self.searched
        self.searched.add(replicas)
        if again:
            what = "the rest of its trials, for the best settings"
        else:
            what = "met by a stored trial" if met else "searching"
        self.console.print(
            escape(f"{_replicas(replicas)}: {what} (study {plan.name})"), soft_wrap=True
        )
        idle = "met; no better trial yet" if met else "no trial meets the SLOs yet"
        self.current = ProgressDisplay(self.console, plan, idle=idle).__enter__()
        return self.current.progress

    def close(self) -> None:
        if self.current is not None:
            self.current.__exit__(None, None, None)
            self.current = None


def _replicas(count: int) -> str:
    return f"{count} replica{'s' if count != 1 else ''}"


def _print_plan(result: ReplicaPlan) -> None:
    out = output_console()
    answer = result.answer
    if not result.counts:
        out.print(
            f"no count up to {_replicas(result.max_replicas)} can meet these SLOs, whatever "
            "the settings:",
            soft_wrap=True,
        )
        for floor in result.floors_below:
            out.print(escape(f"  {floor.line()}"), soft_wrap=True)
        return
    if answer is None:
        last = result.counts[max(result.counts)]
        out.print(
            escape(
                f"no count up to {_replicas(result.max_replicas)} behind a {result.router} "
                f"router met every SLO; {_missed(last)}"
            ),
            soft_wrap=True,
        )
        return
    trial = answer.summary.recommended
    assert trial is not None
    out.print(
        escape(
            f"{_replicas(answer.replicas)} behind a {result.router} router "
            f"{'meets' if answer.replicas == 1 else 'meet'} every SLO "
            f"(study {answer.study}, trial {trial.trial_number})"
        ),
        soft_wrap=True,
    )
    below = result.below
    if below is not None:
        out.print(escape(f"{_replicas(below.replicas)}: {_missed(below)}"), soft_wrap=True)
    if result.floors_below:
        out.print(
            f"{_replicas(result.fewest_possible - 1)} cannot meet them, whatever the settings:",
            soft_wrap=True,
        )
        for floor in result.floors_below:
            out.print(escape(f"  {floor.line()}"), soft_wrap=True)
    replicas = replica_details(answer.summary)
    if replicas:
        shares = " ".join(f"{share['utilisation']:.0%}" for share in replicas)
        sent = " ".join(str(int(share["requests"])) for share in replicas)
        out.print(f"utilisation (busy share of the run): {shares}", soft_wrap=True)
        out.print(f"requests per replica: {sent}", soft_wrap=True)
    wall = (trial.metrics or {}).get("details", {}).get("wall_s")
    if wall is not None:
        out.print(
            f"simulator cost: {wall:.2f} s a run of {_replicas(answer.replicas)} "
            f"({wall / answer.replicas:.3f} s a replica)",
            soft_wrap=True,
        )
    out.print(escape(f"each replica: {trial.serve_command}"), soft_wrap=True)
    out.print()
    out.print(render_summary(answer.summary), crop=False)


def _missed(result: CountResult) -> str:
    """Why a count was not met: how many settings were tried and how close the best came."""
    tried = result.summary.finished
    closest = result.summary.closest_measured
    if closest is None:
        return f"none of {tried} settings ran to the end"
    binding = max(closest.constraints, key=lambda name: closest.constraints[name])
    excess = closest.constraints[binding]
    how = (
        f"{excess:.0%} of requests failed beyond the error budget"
        if binding == ERRORS
        else f"{binding} {excess:+.0%} over its limit"
    )
    return f"none of {tried} settings met the SLOs (closest: trial {closest.trial_number}, {how})"
