"""Real trials that restart the server only when they must (issue 45).

A vLLM server reads some scheduler knobs at start-up only (the token budget and the sequence
slots size the runner, the KV pool and the CUDA graphs, and enter the compiled graph's hash
from vLLM 0.33), and the others on every step (:attr:`Searched.restart` ``False``). A study
keeps its server while only the second kind changes: the server runs
:mod:`prefill_tuner.engines.real.live_scheduler` (vLLM's own scheduler, given
``--scheduler-cls``), and before each replay :class:`LiveSettings` writes the trial's values of
those knobs to a file the scheduler reads, makes it look (one short request), waits for its
acknowledgement, and empties the prefix cache, so a replay on a kept server starts as one on a
new server does. A fresh server goes through the same steps: a result never depends on whether
its server was kept.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import httpx

from prefill_tuner.engines.real.launcher import VllmServer
from prefill_tuner.engines.real.signals import parse_iteration_log
from prefill_tuner.errors import TunerError
from prefill_tuner.search_spaces.knobs import KNOBS
from prefill_tuner.search_spaces.settings import EngineSettings

SCHEDULER_FLAG = "--scheduler-cls"
MODULE = "prefill_tuner_live"
"""The name the scheduler's module has on the server's ``PYTHONPATH``."""
SETTINGS_ENV = "PREFILL_TUNER_LIVE_SETTINGS"
ACK_SUFFIX = ".ack"
ACK_TIMEOUT_S = 60.0
"""How long the scheduler may take to acknowledge new settings (one short request on an idle
server: well under a second, minutes only on a starved machine)."""
MARKER_PROMPT = [1, 2, 3, 4]
"""The one-token request that makes the scheduler look at new settings, and marks the end of
a trial's steps in a kept server's log."""

LIVE_KNOBS = tuple(name for name, knob in KNOBS.items() if not knob.restart)
"""The knobs a running server takes (``restart=False``), in declaration order."""


class LiveSettingsError(TunerError):
    """The server did not take a trial's per-step settings."""


def live_knobs(accepted_flags: frozenset[str] | None) -> tuple[str, ...]:
    """The per-step knobs this server's vLLM accepts (``None``: flags not probed, none)."""
    if accepted_flags is None or SCHEDULER_FLAG not in accepted_flags:
        return ()
    return tuple(k for k in LIVE_KNOBS if KNOBS[k].flag in accepted_flags)


def live_values(settings: Mapping[str, Any], knobs: tuple[str, ...]) -> dict[str, Any]:
    """Every live knob's value for a trial: its own, else vLLM's default (a kept server must
    not keep the last trial's value of a knob this trial leaves unset)."""
    fields = EngineSettings.model_fields
    return {name: settings.get(name, fields[name].default) for name in knobs}


def scheduler_class(async_scheduling: bool) -> str:
    """The ``--scheduler-cls`` value: the live scheduler of the kind the engine resolves to
    (a synchronous class would turn vLLM's asynchronous scheduling off)."""
    return f"{MODULE}.{'LiveAsyncScheduler' if async_scheduling else 'LiveScheduler'}"


class LiveSettings:
    """The settings file of one engine's servers, with the scheduler's module beside it, in
    a private temporary folder removed by :meth:`close`."""

    def __init__(self) -> None:
        _remove_orphans()
        self.folder = Path(tempfile.mkdtemp(prefix=f"{FOLDER_PREFIX}{os.getpid()}-"))
        source = resources.files("prefill_tuner.engines.real") / "live_scheduler.py"
        (self.folder / f"{MODULE}.py").write_text(source.read_text(encoding="utf-8"))
        self.path = self.folder / "settings.json"
        self.generation = 0

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The server's environment additions: the module first on ``PYTHONPATH`` (before the
        one ``base``, the server's own environment, gives), and the settings file."""
        existing = base.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
        path = str(self.folder) + (os.pathsep + existing if existing else "")
        return {"PYTHONPATH": path, SETTINGS_ENV: str(self.path)}

    def apply(
        self,
        base_url: str,
        values: Mapping[str, Any],
        *,
        model: str,
        headers: Mapping[str, str] | None = None,
        timeout_s: float = ACK_TIMEOUT_S,
    ) -> dict[str, Any]:
        """Set ``values`` on the idle server at ``base_url`` and empty its prefix cache; what
        the scheduler says it now runs with."""
        self.generation += 1
        temporary = self.path.with_suffix(".tmp")
        temporary.write_text(json.dumps({"generation": self.generation, "settings": dict(values)}))
        os.replace(temporary, self.path)
        ack = Path(str(self.path) + ACK_SUFFIX)
        deadline = time.monotonic() + timeout_s
        with httpx.Client(base_url=base_url, headers=headers, timeout=timeout_s) as client:
            response = _one_token(client, model)
            if response.status_code != 200:
                raise LiveSettingsError(
                    f"the server refused the request that applies a trial's settings: "
                    f"HTTP {response.status_code}"
                )
            while True:
                answer = _read_ack(ack)
                if answer is not None and answer.get("generation") == self.generation:
                    break
                if time.monotonic() > deadline:
                    raise LiveSettingsError(
                        f"the server's scheduler did not take new settings in {timeout_s:.0f} s "
                        f"(was it started with {SCHEDULER_FLAG} {MODULE}...?)"
                    )
                time.sleep(0.02)
            if answer.get("refused"):
                name, why = next(iter(answer["refused"].items()))
                raise LiveSettingsError(f"the server's scheduler refused {name}: {why}")
            reset = client.post("/reset_prefix_cache")
            if reset.status_code != 200:
                raise LiveSettingsError(
                    f"the server did not empty its prefix cache: HTTP {reset.status_code}"
                )
        return dict(answer.get("applied") or {})

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


@dataclass
class _Kept:
    """The server kept between trials, and the start-up arguments it was started with."""

    server: VllmServer
    args: tuple[str, ...]
    log_path: Path


class ServerKeeper:
    """An engine's server, kept for the next trial while the start-up arguments stay the same
    and there are knobs it takes while running (:attr:`live_knobs`); else stopped after each
    trial."""

    def __init__(self, live_knobs: tuple[str, ...] = ()) -> None:
        self.live_knobs = live_knobs
        self._kept: _Kept | None = None
        self._settings: LiveSettings | None = None

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """What a server's environment needs for the live scheduler (nothing without live
        knobs)."""
        if not self.live_knobs:
            return {}
        if self._settings is None:
            self._settings = LiveSettings()
        return self._settings.env(base)

    def server_for(
        self, args: Sequence[str], start: Callable[[Sequence[str]], VllmServer]
    ) -> tuple[VllmServer, Path, bool]:
        """A healthy server started with ``args``: the kept one if it was and still runs,
        else a new one (``start(args)``, not started yet; the kept one is stopped first);
        its log, and whether it was kept."""
        kept = self._kept
        if kept is not None and kept.args == tuple(args) and kept.server.alive:
            return kept.server, kept.log_path, True
        self.stop()
        server = start(args)
        server.__enter__()  # stops the server itself if it does not become healthy
        self._kept = _Kept(server, tuple(args), server.spec.log_path)
        return server, server.spec.log_path, False

    def apply(
        self, resolved: Mapping[str, Any], *, model: str, api_key: str | None
    ) -> dict[str, Any]:
        """Give the kept server the values of its live knobs in ``resolved`` (a trial's config
        as vLLM resolves it); what its scheduler says it runs with (``{}``: no live knobs)."""
        if not self.live_knobs or self._kept is None or self._settings is None:
            return {}
        scheduler = resolved.get("scheduler_config", {})
        values = {name: scheduler[name] for name in self.live_knobs if name in scheduler}
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        return self._settings.apply(
            self._kept.server.base_url, values, model=model, headers=headers
        )

    def settled_steps(
        self, offset: int, replay_unix_s: tuple[float, float], *, model: str, api_key: str | None
    ) -> list[dict[str, Any]]:
        """The kept server's steps logged from byte ``offset`` within ``replay_unix_s`` (a
        replay's start and end), once all of them are in its log.

        The server logs a step before its tokens go out, but its log is copied by a thread of
        this process, which a busy replay can leave seconds behind (a CI run parsed half a
        trial's steps): a one-token request after the replay logs a step of its own, and once
        that step is in the log, every step before it is too (a step line is written before
        its request's answer). At most :data:`ACK_TIMEOUT_S`; then the steps logged so far.
        Only for a server that logs its steps (``--enable-logging-iteration-details``)."""
        if self._kept is None:
            return []
        started_unix_s, ended_unix_s = replay_unix_s
        path = self._kept.log_path
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        base_url = self._kept.server.base_url
        deadline = time.monotonic() + ACK_TIMEOUT_S
        try:
            with httpx.Client(base_url=base_url, headers=headers, timeout=ACK_TIMEOUT_S) as c:
                marked = _one_token(c, model).status_code == 200
        except httpx.HTTPError:
            marked = False  # the trial's steps as logged so far; the next trial starts anew
        while True:
            steps = parse_iteration_log(path, offset)
            # Untimed lines (the user's own logging config) cannot be told apart: taken as is.
            timed = all(step["logged_at_s"] is not None for step in steps[-1:])
            mine = [s for s in steps if not timed or s["logged_at_s"] <= ended_unix_s]
            if len(mine) < len(steps) or not timed or not marked or time.monotonic() > deadline:
                # Nor the last settings' one-token request (it may reach the log late too).
                return [s for s in mine if not timed or s["logged_at_s"] >= started_unix_s]
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop the kept server, if any."""
        kept, self._kept = self._kept, None
        if kept is not None:
            kept.server.stop()

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self._settings is not None:
                self._settings.close()
                self._settings = None


FOLDER_PREFIX = "tune-live-"
"""``tune-live-PID-XXXX`` in the temporary directory: a process killed with SIGKILL cannot
remove its own, so the next one removes those whose process is gone."""


def _remove_orphans() -> None:
    for folder in Path(tempfile.gettempdir()).glob(FOLDER_PREFIX + "*-*"):
        pid = folder.name.removeprefix(FOLDER_PREFIX).partition("-")[0]
        if not pid.isdigit() or not folder.is_dir() or folder.is_symlink():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)  # its process is gone
        except OSError:
            continue  # alive (another user's, say): not ours to touch


def _one_token(client: httpx.Client, model: str) -> httpx.Response:
    return client.post(
        "/v1/completions", json={"model": model, "prompt": MARKER_PROMPT, "max_tokens": 1}
    )


def _read_ack(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
