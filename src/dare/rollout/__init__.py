"""Rollout engine: diffusion samplers with Fast-dLLM caches and parallel decoders.

```python
from dare.rollout import SamplerConfig, generate
out = generate(model, input_ids, attention_mask, SamplerConfig(sampler="fastdllm", gen_length=256))
out.completion, out.completion_mask, out.logprobs, out.step_map, out.nfe
batch = out.to_tensordict()
out = generate(sdar_model, input_ids, attention_mask, sampler="sdar", gen_length=256)  # block diffusion, KV cache
```
"""

from dare.rollout.block import BLOCK_CACHES, BlockLayout, denoise_blocks
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
    select_edits,
    select_entropy_bounded,
    select_factor,
    select_leftmost,
    select_quota,
    select_threshold,
    timestep_quota,
)
from dare.rollout.output import RolloutOutput, Trajectory, completion_mask
from dare.rollout.rng import derive_seed, example_generators
from dare.rollout.samplers import (
    SAMPLERS,
    Sampler,
    default_sampler,
    generate,
    get_sampler,
    left_pad,
    register_sampler,
    resolve_config,
)

__all__ = [
    "BLOCK_CACHES", "CACHES", "CONFIDENCES", "DECODERS", "SAMPLERS", "SCHEDULES", "BlockLayout", "Proposal",
    "RolloutOutput", "Sampler", "SamplerConfig", "Trajectory", "completion_mask", "default_sampler",
    "denoise_blocks", "derive_seed", "example_generators", "filter_logits", "generate", "get_sampler", "left_pad",
    "linear_quota", "linear_schedule", "propose", "register_sampler", "resolve_config", "select", "select_dynamic",
    "select_edits", "select_entropy_bounded", "select_factor", "select_leftmost", "select_quota", "select_threshold",
    "timestep_quota",
]
