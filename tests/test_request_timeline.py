"""A request's whole life on a simulated vLLM server (issue 42): which scheduling loop the
server's release runs, the front end before the engine sees a request, and the way back to
the client after its tokens are sampled."""

from __future__ import annotations

import pytest

from prefill_tuner.engines.sim.config import async_scheduling_default


@pytest.mark.parametrize(
    ("version", "asynchronous"),
    [
        ("0.12.0", False),
        ("0.13.0", False),
        ("v0.13.1rc2", False),
        ("0.14.0", True),
        ("0.32.0", True),
        ("a build whose version cannot be read", True),
    ],
)
def test_vllm_schedules_asynchronously_by_default_from_0_14(
    version: str, asynchronous: bool
) -> None:
    """vLLM 0.12 and 0.13 defaulted ``async_scheduling`` to False; 0.14.0 made it None,
    resolved to on (read in the three wheels: docs/vllm-facts.md)."""
    assert async_scheduling_default(version) is asynchronous
