"""vLLM's engine settings the tuner knows, each declared once, as vLLM's own config classes
declare theirs: a field's type, vLLM's default, the values vLLM accepts and its docstring
(what it does; ``tune simulate --help`` shows it), and for a knob the tuner searches a
:class:`Searched` marker: how it is searched, its short label in tables, and the vLLM releases
that have it.

Everything else reads these: :data:`~prefill_tuner.search_spaces.knobs.KNOBS` (what is
searched) is made of the marked fields; the simulator's config
(:class:`~prefill_tuner.engines.sim.config.SimConfig`) is this model with vLLM's checks between
the fields (:mod:`prefill_tuner.search_spaces.rules`); a serve line and a ``--config`` YAML
render a field by its name (:mod:`prefill_tuner.search_spaces.render`). The scheduler's rule for
a knob is written once, in ``engines/sim/scheduler.py`` beside vLLM's; the fast path
(``engines/sim/steady_runs.py``) is checked against it by ``tests/test_sim_engine.py``.

Which of them a running server can take, and which need a new one: :attr:`Searched.restart`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_GPU_BLOCKS = 2**24
"""The simulator keeps a few words per KV block: 16.7M blocks (about 1 GB) is more than any
GPU holds (an H200 holds about 1.1M tokens of Llama-3.1-8B's KV cache)."""


@dataclass(frozen=True, slots=True)
class Searched:
    """How the tuner searches a setting (in the field's ``Annotated``)."""

    kind: Literal["int", "bool", "threshold", "share"]
    """``int``: log-scale integer; ``bool``: on/off; ``threshold``: 0 (off) or a log-scale
    integer (searched as one ordered parameter whose lowest value means off); ``share``: 0
    (off) or a share of a pool, each searched value twice the last (its range in
    thousandths)."""
    label: str
    """Its short column name in tables (they fit 80 columns; a legend gives the flags)."""
    effect: str
    """Why it is searched: what moving it does to latency."""
    low: int = 0
    high: int = 0
    """The default range (``int`` and ``threshold``; ``share``: in thousandths)."""
    searched_by_default: bool = True
    """False: searched only when ``--space`` names it (its engine default stands otherwise)."""
    added_in: str | None = None
    """The first vLLM release with the flag (``None``: every release the tuner knows)."""
    honoured_from: str | None = None
    """The first vLLM release where it does what the simulator does on one engine (an earlier
    one accepts the flag and ignores it there); ``None``: wherever it is accepted."""
    restart: bool = True
    """Whether a server must restart to change it: ``False`` for a knob vLLM's scheduler reads
    on every step and nothing sized at start-up depends on, which a real study changes on a
    running server (``tuner/engines/real/live_scheduler.py`` sets each)."""
    sheds_load: bool = False
    """It turns requests away (HTTP 503), and a turned-away request fails the SLOs: searched
    only with an error budget, so a study never wins latency by shedding load."""


class EngineSettings(BaseModel):
    """Scheduler and KV-cache settings of one vLLM engine (V1 semantics), by vLLM's names."""

    # Each field's docstring is its description: `tune simulate --help` shows it.
    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    max_num_batched_tokens: Annotated[
        int,
        Field(ge=1),
        Searched(
            "int",
            "tokens",
            "Token budget per step: small smooths decode latency, large speeds prefill.",
            256,
            16384,
        ),
    ] = 8192
    """Token budget of one step (vLLM's default for ``vllm serve`` on H100-class GPUs)."""
    max_num_seqs: Annotated[
        int, Field(ge=1), Searched("int", "seqs", "Most requests running at once.", 8, 1024)
    ] = 1024
    """Most requests running at once."""
    max_num_active_seqs: Annotated[
        int | None,
        Field(ge=1),
        Searched(
            "int",
            "act.",
            "Most requests admitted to run, the runner's slots left alone: read every step, "
            "so a server takes a new value without a restart.",
            8,
            1024,
            searched_by_default=False,
            added_in="0.32.0",
            restart=False,
        ),
    ] = None
    """Most requests admitted to run at once, at most ``max_num_seqs`` (vLLM 0.32 on; ``None``:
    ``max_num_seqs``). Unlike ``max_num_seqs`` it leaves the model runner, the KV pool's sizing
    and the CUDA graphs alone, so a server takes a new value without a restart; the scheduler
    treats the two alike."""
    prefill_schedule_interval: Annotated[
        int,
        Field(ge=1),
        Searched(
            "int",
            "cad.",
            "Prefill only every N-th step: decodes run the steps between uninterrupted.",
            1,
            16,
            searched_by_default=False,
            honoured_from="0.33.0",
            restart=False,
        ),
    ] = 1
    """Start prefill only every N-th step (vLLM 0.33 on one engine; before, data-parallel
    engines only): a held step carries decodes alone, no new admission and no chunk of a
    prompt already started, timed from the last step that carried a prefill; 1: every step.
    When a step that may prefill cannot drain the waiting queue, holding stops until one
    does."""
    max_num_queued_reqs: Annotated[
        int | None,
        Field(ge=0),
        Searched(
            "int",
            "q.reqs",
            "Turn requests away (HTTP 503) beyond this many waiting or running: bounds the "
            "queue, at the cost of the requests turned away.",
            16,
            4096,
            searched_by_default=False,
            added_in="0.32.0",
            sheds_load=True,
        ),
    ] = None
    """The API server answers HTTP 503 to a request arriving when this many are unfinished
    (waiting or running); ``None``: no limit (vLLM 0.32 on, PR #49445). The simulator counts
    them as the engine has them when it first sees the new request."""
    max_num_queued_tokens: Annotated[
        int | None,
        Field(ge=0),
        Searched(
            "int",
            "q.tok.",
            "Turn requests away (HTTP 503) while this many prompt tokens await their first "
            "token: caps the prefill backlog, hence TTFT, at the cost of the requests turned "
            "away.",
            1024,
            1048576,
            searched_by_default=False,
            added_in="0.32.0",
            sheds_load=True,
        ),
    ] = None
    """The API server answers HTTP 503 to a request arriving while the prompts of requests not
    yet past their first token hold at least this many tokens (whole prompts, however far
    their prefill has gone); ``None``: no limit (vLLM 0.32 on, PR #49445)."""
    max_model_len: int = Field(default=131072, ge=2)
    """Context length: a request's prompt plus output must fit (longer ones are rejected)."""
    enable_chunked_prefill: Annotated[
        bool,
        Searched("bool", "chunked", "Split long prompts over steps under the token budget."),
    ] = True
    """Split prompts over steps; off, a prompt that does not fit the remaining budget waits."""
    long_prefill_token_threshold: Annotated[
        int,
        Field(ge=0),
        Searched(
            "threshold",
            "thresh.",
            "Per-request, per-step prefill cap (0 = off): stops one prompt taking the step.",
            64,
            8192,
            restart=False,
        ),
    ] = 0
    """Per-request, per-step token cap for prefills (0 = off). Ignored with one request."""
    long_prefill_token_threshold_adaptive: bool = False
    """Raise the cap to ``max_num_batched_tokens // (running + waiting)`` when that is larger."""
    scheduler_reserve_full_isl: Annotated[
        bool,
        Searched(
            "bool",
            "reserve",
            "Admit only when the whole prompt fits in free KV blocks.",
            restart=False,
        ),
    ] = True
    """Admit a request only if its whole current sequence fits in free KV blocks."""
    watermark: Annotated[
        float,
        Field(ge=0.0, lt=1.0),
        Searched(
            "share",
            "wmark",
            "KV blocks kept free when admitting: fewer preemptions under KV pressure, "
            "fewer requests running at once.",
            1,
            128,
            searched_by_default=False,
            restart=False,
        ),
    ] = 0.0
    """Share of the KV pool's blocks kept free when admitting a waiting or preempted request
    while others run (0: none). Read at each admission, so a server takes a new value
    without a restart."""
    block_size: int = Field(default=16, ge=1)
    """Tokens per KV cache block (16 on GPU, 128 on CPU); not a trace's ``block_size``, the
    tokens per prefix-hash block of its ``hash_ids``."""
    num_gpu_blocks: int = Field(default=32768, ge=2, le=MAX_GPU_BLOCKS)
    """KV blocks in the pool, including the one vLLM reserves (usable: ``num_gpu_blocks - 1``)."""
    enable_prefix_caching: bool = True
    """Reuse the KV blocks of identical full prompt blocks across requests."""
    async_scheduling: Annotated[
        bool,
        Searched(
            "bool",
            "async",
            "Schedule the next step while one runs: hides host time from TPOT, admits "
            "arrivals a step later (TTFT). Measured, not searched unless asked "
            "(docs/simulator.md).",
            searched_by_default=False,
        ),
    ] = True
    """Schedule the next step while the current one runs (vLLM's default on GPU since 0.14.0,
    :func:`~prefill_tuner.engines.sim.config.async_scheduling_default`; vLLM turns it off on
    CPU): a finished request frees its slot and KV blocks one step later, and the host's
    scheduling time hides behind the step in flight."""


def searched_settings() -> dict[str, Searched]:
    """Each searched field of :class:`EngineSettings`, in declaration order, with its marker."""
    found: dict[str, Searched] = {}
    for name, field in EngineSettings.model_fields.items():
        marker = next((item for item in field.metadata if isinstance(item, Searched)), None)
        if marker is not None:
            found[name] = marker
    return found
