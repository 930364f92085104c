"""Which static steps decode with fused projections (:mod:`dare.models.fusion`), and the copies they read.

Fusing q/k/v and gate/up pays where a step's matmuls are bound by reading the weights, i.e. at few query rows:
a step is fused when ``batch bucket x block length <= FUSE_MAX_ROWS``; a LoRA policy's when ``batch bucket x``
the query rows of its forwards is at most :data:`LORA_FUSE_MAX_ROWS` (:func:`wants_fusion`). The copies cost the
fused weights' size once per model and dtype (LLaDA-8B: 9.7 GB in bf16; reported as ``EngineStats.fused_bytes``).
A LoRA policy's projections are copied with their adapters kept unmerged (:class:`~dare.models.fusion.LowRank`:
the ``lora_A`` products come out of the base matmul), single projections (``o``, ``down``) included, so its
copies hold every adapted projection's weight (LLaDA-8B, every projection adapted: ~14 GB in bf16, computed).
Past the limits, under autocast, weights kept in another dtype than autocast's (fp32 master weights) still decode
from fused copies in the autocast dtype, whatever the step's size: the copies are the casts autocast would make at
every call, made once per engine call (each batch chunk of a generation call). A LoRA policy whose base weights
are in the autocast dtype gets copies of its adapters only (``adapters``). ``DARE_FUSE_PROJECTIONS=0`` turns every
default copy off; ``DARE_FUSE_MAX_ROWS=N`` moves the row limit (for measuring other shapes and models).

``SamplerConfig.weights`` ``merged`` / ``fp8`` make every step, whatever its row count, decode with ``merged`` /
``fp8`` copies (:class:`~dare.models.fusion.FusedProjections`): LoRA adapters merged into copies in the model's
(or autocast) dtype, or FP8 copies of the dense projections.
"""

from __future__ import annotations

import os
import weakref

import torch

from dare.config import env_switch
from dare.errors import ConfigError
from dare.models.fusion import FusedProjections

FUSE_MAX_ROWS = 256
"""Largest ``batch bucket x block length`` decoded with fused projections (H200: LLaDA-8B projections 20 %
faster at 32 rows, equal at 512; an SDAR-8B B=64 block-4 rollout, 256 rows, 13.78 -> 13.40 ms per forward)."""

LORA_FUSE_MAX_ROWS = 512
"""The largest ``batch bucket x`` :func:`forward_rows` of a LoRA policy decoded from fused copies, which also save
the adapters' own matmuls (H100, LLaDA-8B + LoRA r128 under bf16 autocast, dual cache: 10.36 -> 7.89 ms per
forward at 32 rows, 23.62 -> 21.36 at 512; the d1 RL step's 1024-row steps 77.0 ms per forward either way,
thirty-sixth session)."""

_FUSED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def wants_fusion(batch: int, config, lora: bool = False, prompt_width: int = 0) -> bool:
    """Whether steps of ``batch`` (bucketed) rows under ``config`` decode with fused projections. A plain model's
    steps count ``batch x block length`` rows (the rule the target cells were measured with); a LoRA policy's
    (``lora``) count every query row of a forward (:func:`forward_rows`), since its copies paid only at few rows
    (none at 1024) and hold every adapted weight."""
    rows = forward_rows(config, prompt_width) if lora else config.block_length or config.gen_length
    return batch * rows <= fusion_max_rows(lora)


def forward_rows(config, prompt_width: int) -> int:
    """Query rows of one sequence's decoding forward: the block with the dual or block cache, the generation with
    the prefix cache (at its first block), the prompt and the generation without a cache."""
    if config.cache in ("dual", "block"):
        return config.block_length or config.gen_length
    if config.cache == "prefix":
        return config.gen_length
    return prompt_width + config.gen_length


def fusion_max_rows(lora: bool = False) -> int:
    """The largest fused step in rows: ``DARE_FUSE_MAX_ROWS``, else :data:`FUSE_MAX_ROWS` or, for a model with LoRA
    layers, :data:`LORA_FUSE_MAX_ROWS`; 0 when ``DARE_FUSE_PROJECTIONS=0`` (both switches are read, so a bad value
    is an error either way)."""
    max_rows = _max_rows(lora)
    return max_rows if env_switch("DARE_FUSE_PROJECTIONS", default=True) else 0


def _max_rows(lora: bool) -> int:
    value = os.environ.get("DARE_FUSE_MAX_ROWS")
    if value is None:
        return LORA_FUSE_MAX_ROWS if lora else FUSE_MAX_ROWS
    if not value.isdigit():
        raise ConfigError(f"DARE_FUSE_MAX_ROWS must be a whole number of rows, got {value!r}")
    return int(value)


def fused_projections(model, dtype: torch.dtype | None, mode: str = "fused") -> tuple[FusedProjections | None, bool]:
    """``model``'s copies of kind ``mode`` in ``dtype`` (weights' dtype if None; for ``fp8``, the dtype its matmuls
    write), refreshed from the current parameters (None when nothing is copied), and whether older copies were
    replaced: graphs recorded with those read freed memory and must be dropped."""
    per_kind = _FUSED.setdefault(model, {})
    previous = per_kind.get((dtype, mode))
    if previous is not None and previous.matches(model):
        previous.refresh()
        return (previous or None), False
    fused = FusedProjections(model, dtype, mode=mode)
    per_kind[(dtype, mode)] = fused
    return (fused or None), previous is not None


def fused_bytes(model) -> int:
    return sum(f.nbytes for f in _FUSED.get(model, {}).values())


def release_fused(model) -> None:
    _FUSED.pop(model, None)
