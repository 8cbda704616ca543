"""What every step-time profile shares: the interface the simulator asks of it
(:class:`StepProfile`), the step it is asked about (:class:`StepShape`, built once per
simulated step by :func:`shape_of`), a request's path outside the steps (:class:`RequestPath`)
and the record of how it was made (:class:`Provenance`).

They live apart from :mod:`prefill_tuner.engines.sim.cost_model`, which re-exports them, so
that a profile kind in its own package (:mod:`prefill_tuner.engines.sim.kernels`) can use them
while the cost model's union of profile kinds imports it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from prefill_tuner.names import check_name


@dataclass(frozen=True, slots=True)
class StepShape:
    """What a step computes, as the cost model sees it (a plain dataclass: one is made per
    simulated step)."""

    prefill_tokens: int = 0
    """Prompt (or recomputed) tokens processed in this step."""
    decode_tokens: int = 0
    """Requests generating one token in this step."""
    requests: int = 0
    """Requests scheduled in this step."""
    decode_context_tokens: int = 0
    """KV tokens the decodes' attention reads (sum of their context lengths)."""
    prefill_context_tokens: int = 0
    """KV tokens the prefill chunks' attention reads (each chunk's context, summed)."""
    prefill_attention_pairs: int = 0
    """Query-key pairs the prefill chunks' causal attention computes."""
    prefill_chunks: tuple[tuple[int, int], ...] = field(default=(), compare=False)
    """Each prefill chunk's ``(tokens computed before it, its tokens)``, in scheduling order
    (:func:`shape_of` fills it; a shape made by hand may leave it empty, and a profile that
    needs it then takes the prefill as one chunk). Not compared: two shapes are equal when
    their totals are (what a log of the step can tell)."""


def shape_of(scheduled: Iterable[tuple[int, int, bool]], requests: int) -> StepShape:
    """A step's shape from its ``(computed before, tokens, is a decode)`` per scheduled
    request: a decode reads its context plus the new token; a prefill chunk of ``n`` tokens
    after ``c`` computed ones reads ``c + n`` and computes ``n·c + n(n+1)/2`` causal pairs."""
    prefill = decode = decode_context = prefill_context = pairs = 0
    chunks: list[tuple[int, int]] = []
    for before, tokens, decoding in scheduled:
        if decoding:
            decode += 1
            decode_context += before + 1
        else:
            prefill += tokens
            prefill_context += before + tokens
            pairs += tokens * before + tokens * (tokens + 1) // 2
            chunks.append((before, tokens))
    return StepShape(
        prefill_tokens=prefill,
        decode_tokens=decode,
        requests=requests,
        decode_context_tokens=decode_context,
        prefill_context_tokens=prefill_context,
        prefill_attention_pairs=pairs,
        prefill_chunks=tuple(chunks),
    )


class StepProfile(Protocol):
    """What the simulator asks of a step-time profile: the one interface every profile kind
    implements (``cost_model.StepModel`` lists the kinds a file or a record may hold; the type
    checker holds each to this, and ``tests/test_conformance.py``'s suite checks each kind's
    behaviour, as a new kind's must be).

    The run methods are the fast path's: each element must be exactly the float
    :meth:`step_seconds` gives for that step's shape (the fast-forward's exactness rests on
    it)."""

    @property
    def name(self) -> str: ...

    @property
    def engine_defaults(self) -> dict[str, int | float | bool]:
        """Engine settings the hardware implies (``num_gpu_blocks``, ``block_size``)."""
        ...

    @property
    def serve_args(self) -> tuple[str, ...]:
        """The ``vllm serve`` flags of the machine the profile stands for."""
        ...

    @property
    def request_latency_s(self) -> float: ...
    @property
    def request_interval_s(self) -> float: ...
    @property
    def request_token_s(self) -> float: ...
    @property
    def response_latency_s(self) -> float: ...
    @property
    def response_output_s(self) -> float:
        """The request path's terms in seconds (:class:`RequestPath`)."""
        ...

    def step_seconds(self, shape: StepShape) -> float:
        """How long a step of this shape takes."""
        ...

    def host_seconds(self, requests: int) -> float:
        """Of a step's time, what the host spends outside the device."""
        ...

    def decode_run_seconds(self, requests: int, first_context: int, steps: int) -> np.ndarray:
        """Durations of ``steps`` consecutive plain decode steps of ``requests`` requests whose
        contexts sum to ``first_context`` in the first step and grow by one token each step."""
        ...

    def decode_steps_seconds(self, requests: int, first_context: int, steps: int) -> list[float]:
        """:meth:`decode_run_seconds` as a list (cheaper for a few steps)."""
        ...

    def chunk_run_seconds(
        self,
        decodes: int,
        requests: int,
        decode_context: int,
        chunks: Sequence[tuple[int, int]],
        steps: int,
    ) -> np.ndarray:
        """Durations of ``steps`` consecutive steps of ``decodes`` decodes beside the prefill
        ``chunks`` ``(tokens computed before, tokens)``, each after one more chunk per step."""
        ...

    def chunk_steps_seconds(
        self,
        decodes: int,
        requests: int,
        decode_context: int,
        chunks: Sequence[tuple[int, int]],
        steps: int,
    ) -> list[float]:
        """:meth:`chunk_run_seconds` as a list (cheaper for a few steps)."""
        ...

    def prefill_work_seconds(self, tokens: int, pairs: int) -> float:
        """A lower bound of the device time any schedule spends prefilling ``tokens`` tokens
        with ``pairs`` query-key pairs, additive over requests and chunks."""
        ...


MAX_PART_MS = 60_000.0
"""The most one part of a step (a host overhead, a kernel, a request's latency) may take in a
profile: a minute. Every number a profile holds is bounded (and finite), as options are: a
value beyond these is a mistake, not a machine."""
MAX_BANDWIDTH_GBPS = 1e6
"""The most memory bandwidth a profile may state (GB/s): a thousand times a B200's."""
MAX_KV_BYTES_PER_TOKEN = 1e9
"""The most KV-cache bytes a token may take: a thousand times the largest model's."""
MAX_BYTES = 2**50
"""The most bytes a profile's memory plan may hold (a pebibyte)."""


class RequestPath(BaseModel):
    """A request's life on the server outside the engine's steps, declared once for every
    profile kind that can carry it (``docs/simulator.md``, "A request's life"): the way in
    (the client's send, the API server's front end, the engine core seeing it at its next
    ``schedule()``) and the way out (the engine core's output, the API server detokenising
    and streaming each request's tokens one request at a time, the client reading them).

    Every term is 0 until measured: ``tune calibrate`` fits them on a real server. The three
    terms added with it are left out of a profile's record while they are 0, so that a
    profile made before them keeps its record (and its digest in a study's engine version)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True
    )

    request_latency_ms: float = Field(default=0.0, ge=0, le=MAX_PART_MS)
    """From a request's send to the scheduler seeing it when the front end is free: the
    client, HTTP, validation, handing it to the engine core (0 until calibrated)."""
    request_interval_ms: float = Field(default=0.0, ge=0, le=MAX_PART_MS)
    """Least time between two requests reaching the scheduler: the front end's work on each,
    done one request at a time (0 until calibrated)."""
    request_token_us: float = Field(default=0.0, ge=0, le=MAX_PART_MS * 1000)
    """Per prompt token, the front end's work on a request (tokenising the prompt, copying it
    to the engine core): it delays the request, and the next one behind it (0 until
    calibrated)."""
    response_latency_ms: float = Field(default=0.0, ge=0, le=MAX_PART_MS)
    """From the end of the step that sampled a token to the client reading it: the engine
    core's output, the API server's handling of the step's first output, the stream to the
    client (0 until calibrated)."""
    response_output_us: float = Field(default=0.0, ge=0, le=MAX_PART_MS * 1000)
    """Per output the API server handles before a request's in the same step (detokenising
    and streaming one request's token): the step's outputs reach their clients one after
    another (0 until calibrated)."""
    resend_ms: float = Field(default=0.0, ge=0, le=MAX_PART_MS)
    """In a closed loop, from the client reading a response's last token to its sending the
    next request (the rest of the response: vLLM's usage chunk and the stream's end; the
    client's own handling), one response at a time, as one client process takes them (0
    until calibrated)."""

    left_out_at_default: ClassVar[tuple[str, ...]] = ()
    """Fields a record leaves out while at their defaults (besides the later path terms), so
    that a profile's content, which names it in a study's engine version, is what it was
    before they existed."""

    @model_serializer(mode="wrap")
    def _without_unset_path_terms(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for name in _LATER_PATH_TERMS:
                if name in data and not data[name]:
                    del data[name]
            fields = type(self).model_fields
            for name in self.left_out_at_default:
                if name in data and getattr(self, name) == fields[name].default:
                    del data[name]
        return data

    @property
    def request_latency_s(self) -> float:
        return self.request_latency_ms / 1000.0

    @property
    def request_interval_s(self) -> float:
        return self.request_interval_ms / 1000.0

    @property
    def request_token_s(self) -> float:
        return self.request_token_us / 1e6

    @property
    def response_latency_s(self) -> float:
        return self.response_latency_ms / 1000.0

    @property
    def response_output_s(self) -> float:
        return self.response_output_us / 1e6

    @property
    def resend_s(self) -> float:
        return self.resend_ms / 1000.0


_LATER_PATH_TERMS = ("request_token_us", "response_latency_ms", "response_output_us", "resend_ms")
"""The :class:`RequestPath` terms a record leaves out while they are 0."""

PATH_TERMS = ("request_latency_ms", "request_interval_ms", *_LATER_PATH_TERMS)
"""Every :class:`RequestPath` term, in its order."""


def check_profile_name(name: str, option: str = "`name`") -> str:
    """``name``, if it is a safe name for a profile (it names the simulator in every study's
    engine version); a one-line error if not."""
    return check_name(name, "profile", option)


class Provenance(BaseModel):
    """How a profile was made: what its latencies can be trusted for."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["estimated", "calibrated", "measured-kernels"] = "estimated"
    """``estimated``: from datasheet figures and first principles, never compared with an
    engine (use it to compare settings, not for absolute latencies); ``calibrated``: fitted to
    measurements of a real engine; ``measured-kernels``: the sum of the kernels vLLM runs for
    a step, each timed on the GPU (:mod:`prefill_tuner.engines.sim.kernels`), with the time
    outside kernels estimated."""
    method: str = ""
    """How it was estimated or what it was fitted to (a vLLM per-step log, forward-step
    timings)."""
    vllm_version: str | None = None
    """The engine measured (calibrated profiles; for measured kernels, the vLLM version of
    the kernel tables)."""
    model: str | None = None
    hardware: str | None = None
    """The GPU or CPU as the server or the machine reported it."""
    date: str | None = None
    held_out_error: dict[str, float] | None = None
    """Relative error of the step time on steps the fit did not see (``median``, ``p90``)."""
    workload: str | None = None
    """What the calibration replayed."""
    source: str | None = None
    """Measured kernels: where the timings come from (repository and directory)."""
    source_commit: str | None = None
    """Measured kernels: the source repository's commit."""
    gpu: str | None = None
    """Measured kernels: the GPU's name in the tables (``h100_sxm``)."""
    tables: dict[str, str] | None = None
    """Measured kernels: per table family, the vLLM (or NCCL) version its rows were measured
    with."""
    kernel_sources: dict[str, str] | None = None
    """Measured kernels: per operation, the kernel the tables time (vLLM's choice on that GPU
    for the dtype)."""
    interpolated: tuple[str, ...] = ()
    """Measured kernels: the shapes read between measured points (and how)."""
    extrapolated: tuple[str, ...] = ()
    """Measured kernels: the shapes read beyond measured points (and by what rule)."""
    estimated: tuple[str, ...] = ()
    """Measured kernels: the terms that are not measured at all (and where they come from)."""
    refitted: tuple[str, ...] = ()
    """Measured kernels calibrated to a real server (``tune calibrate --profile``): each term
    outside the kernels that was refitted, from its value before to its value after; the
    kernels stay measured."""

    @model_serializer(mode="wrap")
    def _without_unused_kernel_fields(self, handler: SerializerFunctionWrapHandler) -> Any:
        """An estimated or calibrated profile's record (its YAML, its study record) as it was
        before the measured-kernel fields existed: those left at their defaults are not
        written (they read back as the defaults)."""
        data = handler(self)
        if isinstance(data, dict):
            for name in _KERNEL_FIELDS:
                if name in data and not data[name]:
                    del data[name]
        return data

    def summary(self) -> str:
        """One line: what the profile is and how far to trust it."""
        if self.kind == "estimated":
            how = f" ({self.method})" if self.method else ""
            return f"estimated{how}: absolute latencies are not measured; compare settings with it"
        if self.kind == "measured-kernels":
            where = (self.source or "measured kernel tables").split()[0]
            where = where.removeprefix("https://").removeprefix("github.com/")
            if self.source_commit:
                where += f"@{self.source_commit[:12]}"
            tables = f"vLLM {self.vllm_version} tables, " if self.vllm_version else ""
            what = " on ".join(part for part in (self.model, self.hardware or self.gpu) if part)
            return (
                f"measured kernels ({tables}{where}): {what or 'a model'}; "
                f"{len(self.interpolated)} shapes interpolated, {len(self.extrapolated)} "
                "extrapolated; time outside kernels estimated"
            )
        parts = [
            f"vLLM {self.vllm_version}" if self.vllm_version else "",
            self.model or "",
            f"on {self.hardware}" if self.hardware else "",
            self.date or "",
        ]
        error = self.held_out_error or {}
        if "median" in error:
            parts.append(f"held-out step-time error {error['median']:.0%} (median)")
        text = ", ".join(part for part in parts if part)
        return f"calibrated ({self.method or 'fitted to measurements'}): {text}".rstrip(": ")


_KERNEL_FIELDS = (
    "source",
    "source_commit",
    "gpu",
    "tables",
    "kernel_sources",
    "interpolated",
    "extrapolated",
    "estimated",
    "refitted",
)
"""The :class:`Provenance` fields only a measured-kernels profile fills."""
