"""Step-time profiles from measured kernels: a step takes the sum of the kernels vLLM runs for
its composition, each timed on the GPU (NVIDIA AIConfigurator's public vLLM tables, shipped as
package data in ``data/``), at a model's tensor-parallel shard (``docs/kernel-profiles.md``).

    from prefill_tuner.engines.sim.kernels import build_kernel_profile, load_model_shape

    profile = build_kernel_profile(
        load_model_shape("meta-llama/Llama-3.1-8B-Instruct"), "h100_sxm", tp=1, dtype="bf16"
    )
"""

from prefill_tuner.engines.sim.kernels.build import build_kernel_profile
from prefill_tuner.engines.sim.kernels.models import ModelShape, bundled_models, load_model_shape
from prefill_tuner.engines.sim.kernels.profile import KernelProfile
from prefill_tuner.engines.sim.kernels.tables import known_gpus

__all__ = [
    "KernelProfile",
    "ModelShape",
    "build_kernel_profile",
    "bundled_models",
    "known_gpus",
    "load_model_shape",
]
