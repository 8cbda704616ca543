"""A discrete-event simulator of vLLM V1's scheduler with a step-time cost model.

Its scheduling decisions match vLLM's step for step (``tests/test_sim_vs_vllm.py`` drives
vLLM's own ``Scheduler`` to check); its step durations come from a profile
(:mod:`prefill_tuner.engines.sim.cost_model`; measured-kernel profiles are built by
:mod:`prefill_tuner.engines.sim.kernels`).
"""

from prefill_tuner.engines.sim.config import SimConfig
from prefill_tuner.engines.sim.cost_model import (
    ConstantProfile,
    FittedProfile,
    StepModel,
    load_profile,
)
from prefill_tuner.engines.sim.kernels import KernelProfile, build_kernel_profile
from prefill_tuner.engines.sim.loop import SimResult, StepRecord, simulate

__all__ = [
    "ConstantProfile",
    "FittedProfile",
    "KernelProfile",
    "SimConfig",
    "SimResult",
    "StepModel",
    "StepRecord",
    "build_kernel_profile",
    "load_profile",
    "simulate",
]
