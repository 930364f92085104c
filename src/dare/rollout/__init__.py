"""Rollout engine: diffusion samplers with Fast-dLLM caches and parallel decoders.

```python
from dare.rollout import SamplerConfig, generate
out = generate(model, input_ids, attention_mask, SamplerConfig(sampler="fastdllm", gen_length=256))
out.completion, out.completion_mask, out.logprobs, out.step_map, out.nfe
batch = out.to_tensordict()
```
"""

from dare.rollout.caching import CACHES
from dare.rollout.config import SamplerConfig
from dare.rollout.kernels import (
    CONFIDENCES,
    DECODERS,
    SCHEDULES,
    Proposal,
    filter_logits,
    linear_quota,
    linear_schedule,
    propose,
    select,
    select_dynamic,
    select_factor,
    select_quota,
    select_threshold,
    timestep_quota,
)
from dare.rollout.output import RolloutOutput, Trajectory, completion_mask
from dare.rollout.rng import derive_seed, example_generators
from dare.rollout.samplers import SAMPLERS, Sampler, generate, get_sampler, left_pad, register_sampler

__all__ = [
    "CACHES", "CONFIDENCES", "DECODERS", "SAMPLERS", "SCHEDULES", "Proposal", "RolloutOutput", "Sampler",
    "SamplerConfig", "Trajectory", "completion_mask", "derive_seed", "example_generators", "filter_logits",
    "generate", "get_sampler", "left_pad", "linear_quota", "linear_schedule", "propose", "register_sampler",
    "select", "select_dynamic", "select_factor", "select_quota", "select_threshold", "timestep_quota",
]
