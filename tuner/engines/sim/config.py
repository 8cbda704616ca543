"""The simulator's engine configuration, named and validated exactly as vLLM names them.

Every field is a ``vllm serve`` flag (``max_num_batched_tokens`` is ``--max-num-batched-tokens``)
or, for the KV pool, the value vLLM resolves at start-up (``num_gpu_blocks``). Validation mirrors
vLLM's ``SchedulerConfig`` so that no simulated trial uses a config vLLM would refuse.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, ValidationError, create_model, model_validator

from prefill_tuner.defaults import GPU_MEMORY_UTILIZATION
from prefill_tuner.engines.sim.cost_model import StepModel
from prefill_tuner.engines.sim.kernels.memory import H100_TIER_DEFAULTS, LARGE_GPU_BYTES
from prefill_tuner.engines.sim.kernels.profile import KernelProfile
from prefill_tuner.errors import TunerError
from prefill_tuner.search_spaces.knobs import release
from prefill_tuner.search_spaces.rules import first_broken
from prefill_tuner.search_spaces.settings import EngineSettings


class SimConfig(EngineSettings):
    """Scheduler and KV-cache settings of one simulated engine (vLLM V1 semantics): vLLM's
    settings as :class:`EngineSettings` declares them, checked together as vLLM checks them."""

    @model_validator(mode="after")
    def _mirror_vllm_validation(self) -> SimConfig:
        """The checks vLLM's ``SchedulerConfig`` makes (the rules between knobs, kept once in
        :mod:`prefill_tuner.search_spaces.rules`), and vLLM's KV pool check."""
        broken = first_broken(self.model_dump())
        if broken:
            raise ValueError(broken)
        # vLLM's check_enough_kv_cache_memory (vllm/v1/core/kv_cache_utils.py): the pool,
        # less the null block, must hold one request of max_model_len tokens, or the server
        # refuses to start.
        needed = -(-self.max_model_len // self.block_size)
        if self.usable_blocks < needed:
            raise ValueError(
                f"to serve at least one request with max_model_len ({self.max_model_len}), "
                f"{needed} KV blocks of {self.block_size} tokens are needed besides vLLM's "
                f"null block, and num_gpu_blocks ({self.num_gpu_blocks}) leaves "
                f"{self.usable_blocks}: vLLM refuses to start; lower max_model_len to at most "
                f"{self.usable_blocks * self.block_size} or give more blocks"
            )
        return self

    @property
    def usable_blocks(self) -> int:
        return self.num_gpu_blocks - 1


ASYNC_SCHEDULING_SINCE = (0, 14, 0)
"""The first vLLM release that schedules asynchronously by default on GPU: its
``SchedulerConfig.async_scheduling`` defaults to ``None``, which ``VllmConfig`` resolves to on
unless an option forbids it. Up to 0.13 it defaulted to ``False`` (``docs/vllm-facts.md``)."""


def async_scheduling_default(vllm_version: str) -> bool:
    """Whether a vLLM release of ``vllm_version`` (``0.12.0``) schedules asynchronously on GPU
    when not told: from 0.14.0 on. A version that cannot be read counts as a current one."""
    running = release(vllm_version)
    return running is None or running >= ASYNC_SCHEDULING_SINCE


LARGE_GPU_TIER_SINCE = (0, 28, 0)
"""The first vLLM release whose ``vllm serve`` defaults have a tier for GPUs of 160 GiB or more
(B200, B300): a 16,384-token budget, which kernel profiles hold (``kernels/memory.py``,
``batch_defaults``). Before it those GPUs had the 70 GiB tier's 8,192 (read in the 0.12.0,
0.17.0, 0.19.0, 0.24.0-0.27.1 and 0.28.0 wheels' ``vllm/engine/arg_utils.py``)."""


def release_defaults(profile: StepModel, vllm_version: str) -> dict[str, Any]:
    """The engine settings a vLLM release of ``vllm_version`` defaults to on ``profile``'s
    hardware where they differ from the current release's, which profiles built from kernels
    hold: synchronous scheduling up to 0.13 (:func:`async_scheduling_default`), and before 0.28
    an 8,192-token budget on GPUs of 160 GiB or more (:data:`LARGE_GPU_TIER_SINCE`). A profile
    fitted to a real server keeps the budget that server resolved. The KV pool stays as the
    profile sized it (a smaller budget's profiling run leaves it slightly larger)."""
    settings: dict[str, Any] = {"async_scheduling": async_scheduling_default(vllm_version)}
    running = release(vllm_version)
    if (
        isinstance(profile, KernelProfile)
        and running is not None
        and running < LARGE_GPU_TIER_SINCE
        and profile.memory.capacity_bytes >= LARGE_GPU_BYTES
    ):
        settings["max_num_batched_tokens"] = H100_TIER_DEFAULTS[0]
    return settings


MEMORY_SHARE_SINCE = (0, 20, 0)
"""The first vLLM release whose ``gpu_memory_utilization`` defaults to 0.92
(:data:`~prefill_tuner.defaults.GPU_MEMORY_UTILIZATION`); before, 0.9 (read in the 0.12.0,
0.19.0, 0.20.0, 0.21.0 and 0.22.0 wheels' ``vllm/config/cache.py``)."""
OLD_MEMORY_SHARE = 0.9


def release_memory_share(vllm_version: str) -> float:
    """The share of GPU memory a vLLM release of ``vllm_version`` gives itself when not told
    (it sizes the KV pool a profile built from kernels holds). A version that cannot be read
    counts as a current one."""
    running = release(vllm_version)
    old = running is not None and running < MEMORY_SHARE_SINCE
    return OLD_MEMORY_SHARE if old else GPU_MEMORY_UTILIZATION


SIM_FIELDS = create_model(
    "SimFields",
    __config__=ConfigDict(extra="forbid"),
    **{name: (field.annotation, field) for name, field in SimConfig.model_fields.items()},  # type: ignore[call-overload]
)
"""SimConfig's fields without its rules between them (those are checked once repaired)."""


def check_engine_defaults(profile: StepModel, source: str) -> None:
    """A profile's ``engine_defaults``, each a setting the simulated engine takes with a
    value it takes; a one-line error naming ``source`` (the profile's file) and the field as
    the profile spells it, not as a flag (the user wrote it in the profile)."""
    try:
        SIM_FIELDS.model_validate(profile.engine_defaults)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        message = str(first["msg"]).removeprefix("Value error, ")
        raise TunerError(f"{source}: field 'engine_defaults.{where}': {message}") from None


def resolve_config(
    profile: StepModel,
    settings: dict[str, Any],
    kv_cache_memory_bytes: int | None = None,
) -> SimConfig:
    """The engine config vLLM would build: the user's settings over the profile's hardware
    defaults over vLLM's; ``kv_cache_memory_bytes`` sizes the KV pool as vLLM's flag of that
    name does. A setting vLLM would refuse is a one-line :class:`TunerError` naming its field
    (a pool that ``kv_cache_memory_bytes`` sized wrong names that)."""
    values = dict(profile.engine_defaults)
    values.update({key: value for key, value in settings.items() if value is not None})
    if kv_cache_memory_bytes is not None:
        if settings.get("num_gpu_blocks") is not None:
            raise TunerError("give `num_gpu_blocks` or `kv_cache_memory_bytes`, not both")
        per_token = getattr(profile, "kv_bytes_per_token", None)
        if not per_token:
            raise TunerError(
                f"`kv_cache_memory_bytes` needs a profile with kv_bytes_per_token (profile "
                f"{profile.name!r} has none); give `num_gpu_blocks` instead"
            )
        size = int(values.get("block_size", SimConfig.model_fields["block_size"].default))
        values["num_gpu_blocks"] = int(kv_cache_memory_bytes // (size * per_token))
    try:
        return SimConfig.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        message = str(first["msg"]).removeprefix("Value error, ")
        if first["loc"] == ("num_gpu_blocks",) and kv_cache_memory_bytes is not None:
            # blamed on the size the user gave, not on the blocks it made
            raise TunerError(
                f"`kv_cache_memory_bytes` {kv_cache_memory_bytes}: the KV blocks it makes "
                f"(num_gpu_blocks): {message}"
            ) from None
        field = f"`{first['loc'][0]}`: " if first["loc"] else ""
        raise TunerError(f"invalid engine config: {field}{message}") from None
