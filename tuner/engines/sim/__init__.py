"""A discrete-event simulator of vLLM V1's scheduler with a step-time cost model.

Its scheduling decisions match vLLM's step for step (``tests/test_sim_vs_vllm.py`` drives
vLLM's own ``Scheduler`` to check); its step durations come from a profile
(:mod:`prefill_tuner.engines.sim.cost_model`).
"""

from prefill_tuner.engines.sim.config import SimConfig
from prefill_tuner.engines.sim.cost_model import (
    ConstantProfile,
    FittedProfile,
    RooflineProfile,
    StepModel,
    load_profile,
)
from prefill_tuner.engines.sim.loop import SimResult, StepRecord, simulate

__all__ = [
    "ConstantProfile",
    "FittedProfile",
    "RooflineProfile",
    "SimConfig",
    "SimResult",
    "StepModel",
    "StepRecord",
    "load_profile",
    "simulate",
]
