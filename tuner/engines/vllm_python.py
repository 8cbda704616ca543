"""Running one of our helper scripts in vLLM's own Python (it may live in another venv)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path

from prefill_tuner.errors import TunerError


def run_vllm_script(
    python: str | Path,
    script: Path,
    args: Sequence[str] = (),
    *,
    stdin: str | None = None,
    timeout_s: float = 600,
) -> subprocess.CompletedProcess[str]:
    """Run ``python script args...``; a missing Python or a timeout is a :class:`TunerError`,
    the exit status and output are the caller's to judge."""
    try:
        return subprocess.run(
            [str(python), str(script), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise TunerError(f"cannot run {script.name} in vLLM's Python {python}: {exc}") from None
