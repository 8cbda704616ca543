"""Step-time profiles from measured kernels: a step takes the sum of the kernels vLLM runs for
its composition, each timed on the GPU (NVIDIA AIConfigurator's public vLLM tables, shipped as
package data in ``data/``), at a model's tensor-parallel shard."""

from prefill_tuner.engines.sim.kernels.models import ModelShape, bundled_models, load_model_shape
from prefill_tuner.engines.sim.kernels.tables import known_gpus

__all__ = ["ModelShape", "bundled_models", "known_gpus", "load_model_shape"]
