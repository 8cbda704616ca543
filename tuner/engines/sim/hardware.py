"""Which machine the simulator stands for: a step-time profile by name or file, or one built
from measured kernels for a model on a GPU at a tensor-parallel size and dtype.

``tune run``, ``simulate``, ``plan``, ``nightly`` and ``worker`` take these as options, so
that ``tune run --model-config ./Qwen3-32B --gpu h100_sxm --tp 2`` needs no separate step;
``tune profile`` writes the same profile to a file.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

from prefill_tuner import defaults
from prefill_tuner.declared import Flag, check_declared
from prefill_tuner.defaults import GPU_MEMORY_UTILIZATION
from prefill_tuner.errors import TunerError

if TYPE_CHECKING:  # the simulator is imported when a profile is wanted, not with the options
    from prefill_tuner.engines.sim.cost_model import StepModel
    from prefill_tuner.engines.sim.kernels import KernelProfile


MAX_TP = 64
"""The largest tensor-parallel size a profile is built for."""


@dataclass(frozen=True)
class ProfileSpec:
    """The simulator's hardware: a shipped or given profile, or one built from measured kernels
    (when ``gpu`` is given)."""

    # The first paragraph of each field's docstring is its option's help.
    profile: str | None = None
    """Simulator step-time profile (name or file); with ``engine`` vllm, the one that screens
    (``screen_trials``) and explains a study nothing met.

    ``None``: the shipped ``defaults.PROFILE``, unless ``gpu`` builds one."""
    model_config: str | None = None
    """With ``gpu``: the model's HuggingFace config.json, or a folder holding one (default: the
    bundled shape of the model ``model`` names)."""
    gpu: str | None = None
    """Build the simulator's profile from measured kernel timings on this GPU, as the shipped
    tables name it (h100_sxm; tune profile --list names them all)."""
    tp: Annotated[int, Field(ge=1, le=MAX_TP)] = 1
    """With ``gpu``: tensor-parallel size (serve lines carry --tensor-parallel-size)."""
    dtype: Literal["bf16", "fp8"] | None = None
    """With ``gpu``: weights and GEMMs, bf16 or fp8 (default: the checkpoint's, from its
    config's quantization_config; bf16 when it has none)."""
    expert_parallel: Annotated[bool, Flag("--enable-expert-parallel")] = False
    """With ``gpu``, a mixture-of-experts model: spread the experts whole over the
    tensor-parallel GPUs, as vLLM's --enable-expert-parallel does (default: split each expert
    over them)."""
    kv_cache_dtype: Literal["auto", "bf16", "fp8"] = "auto"
    """With ``gpu``: the KV cache's dtype (auto: bf16)."""
    gpu_memory_utilization: Annotated[float, Field(ge=0.01, le=1)] = GPU_MEMORY_UTILIZATION
    """With ``gpu``: the share of GPU memory vLLM may use (sizes the KV pool)."""

    def __post_init__(self) -> None:
        check_declared(self)

    @property
    def builds(self) -> bool:
        """Whether the profile is built from measured kernels (``gpu`` is given)."""
        return self.gpu is not None

    @property
    def given(self) -> bool:
        """Whether the user chose a profile at all (not the shipped default)."""
        return self.profile is not None or self.builds

    def check(self) -> None:
        """A one-line error for options that cannot go together."""
        if self.builds and self.profile is not None:
            raise TunerError("give `profile` or `gpu` (a profile built for it), not both")
        if not self.builds:
            unused = [
                name
                for name, given in (
                    ("model_config", self.model_config is not None),
                    ("tp", self.tp != 1),
                    ("dtype", self.dtype is not None),
                    ("expert_parallel", self.expert_parallel),
                    ("kv_cache_dtype", self.kv_cache_dtype != "auto"),
                    (
                        "gpu_memory_utilization",
                        self.gpu_memory_utilization != GPU_MEMORY_UTILIZATION,
                    ),
                )
                if given
            ]
            if unused:
                raise TunerError(
                    f"`{unused[0]}`: only with `gpu` (the GPU whose measured kernels time the "
                    "model)"
                )

    def step_model(
        self, model: str = defaults.MODEL, max_model_len: int | None = None
    ) -> StepModel:
        """The profile: loaded, or built for ``model`` (its bundled shape, unless
        ``model_config`` gives one) serving up to ``max_model_len`` tokens (the model's
        context when ``None``). Built profiles are cached for the process."""
        self.check()
        if not self.builds:
            from prefill_tuner.engines.sim.config import check_engine_defaults
            from prefill_tuner.engines.sim.cost_model import load_profile

            loaded = load_profile(self.profile or defaults.PROFILE)
            check_engine_defaults(loaded, self.profile or defaults.PROFILE)
            return loaded
        return self.build(model, max_model_len)

    def build(
        self, model: str = defaults.MODEL, max_model_len: int | None = None, name: str | None = None
    ) -> KernelProfile:
        """The profile built from measured kernels (``gpu`` is required), cached for the
        process; ``name``: its name (default: model, GPU, TP and dtypes)."""
        if self.gpu is None:
            raise TunerError("`gpu`: give the GPU to build the profile for")
        return _built(
            self.model_config or model,
            str(self.gpu),
            self.tp,
            self.dtype,
            self.kv_cache_dtype,
            self.gpu_memory_utilization,
            max_model_len,
            name,
            self.expert_parallel,
        )

    def serve_name(self, model: str) -> str:
        """What serve lines name: ``model``, unless only a config was given (its folder)."""
        if self.model_config is not None and model == defaults.MODEL:
            path = Path(self.model_config)
            return str(path.parent if path.name == "config.json" else path)
        return model


@functools.lru_cache(maxsize=16)
def _built(
    model: str,
    gpu: str,
    tp: int,
    dtype: Literal["bf16", "fp8"] | None,
    kv_cache_dtype: str,
    gpu_memory_utilization: float,
    max_model_len: int | None,
    name: str | None = None,
    expert_parallel: bool = False,
) -> KernelProfile:
    from prefill_tuner.engines.sim.kernels import build_kernel_profile, load_model_shape

    shape = load_model_shape(model)
    return build_kernel_profile(
        shape,
        gpu,
        tp,
        dtype or shape.default_dtype,
        kv_cache_dtype=kv_cache_dtype,
        gpu_memory_utilization=gpu_memory_utilization,
        max_model_len=max_model_len,
        name=name,
        expert_parallel=expert_parallel,
    )
