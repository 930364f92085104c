"""Rollout weights the engine owns: an unsharded twin of an FSDP2-sharded model.

FSDP2 gathers parameters into buffers that it frees again and may re-allocate at other addresses, so recorded
CUDA graphs cannot read a sharded model's weights. The static engine therefore decodes a sharded model with a plain
copy of it - same class, config and parameter names - whose tensors it owns at fixed addresses. Before every
generation call the full parameters are copied into the copy (the refresh: one device copy of the weights; inside
:func:`dare.distributed.gathered_parameters` the parameters are already gathered, outside it each is all-gathered,
so every rank must decode, as in an RL rollout). The copy costs the model's size in device memory once per process.
LoRA-wrapped (peft) sharded models are not served: they decode eagerly.
"""

from __future__ import annotations

import logging
import time
import weakref

import torch

log = logging.getLogger("dare.rollout")
_TWINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def is_sharded(model) -> bool:
    """True when any module of ``model`` is FSDP-wrapped."""
    return any(type(m).__name__.startswith("FSDP") for m in model.modules())


def _plain_class(model) -> type:
    """The model's own class: FSDP2 replaces it with a subclass named ``FSDP<Class>``."""
    return next(c for c in type(model).__mro__ if not c.__name__.startswith("FSDP"))


def _full(tensor: torch.Tensor) -> torch.Tensor:
    full_tensor = getattr(tensor, "full_tensor", None)  # a DTensor shard: all-gather it
    return (full_tensor() if full_tensor is not None else tensor).detach()


def _build(model, params: dict[str, torch.Tensor]):
    """A plain model of ``model``'s class and config on the parameters' device, parameters in their dtypes."""
    first = next(iter(params.values()))
    with torch.device(first.device):
        twin = _plain_class(model)(model.config)
    for name, param in twin.named_parameters():  # .data keeps tied parameters tied
        param.data = param.data.to(params[name].dtype)
    return twin.eval().requires_grad_(False)


def refreshed_twin(model) -> tuple[torch.nn.Module, float]:
    """``model``'s unsharded twin holding its current weights (built on first use); returns it and the seconds the
    refresh took (the weight copy; a first call also builds the twin)."""
    began = time.perf_counter()
    params = {name: _full(p) for name, p in model.named_parameters()}
    twin = _TWINS.get(model)
    if twin is None:
        twin = _build(model, params)
        _TWINS[model] = twin
        size = sum(p.numel() * p.element_size() for p in twin.parameters()) / 2**30
        log.info("rollout engine: decoding the FSDP-sharded model with an unsharded copy of its weights (%.2f GiB)",
                 size)
    buffers = dict(model.named_buffers())
    with torch.no_grad():
        for name, param in twin.named_parameters():
            param.copy_(params[name])
        for name, buffer in twin.named_buffers():
            if name in buffers:
                buffer.copy_(_full(buffers[name]))
    if params and next(iter(params.values())).is_cuda:
        torch.cuda.synchronize()
    return twin, time.perf_counter() - began


def twin_of(model):
    """The twin the engine holds for ``model``, or None."""
    return _TWINS.get(model)


def release_twin(model) -> None:
    """Free the twin of ``model`` (the next sharded rollout builds it again)."""
    _TWINS.pop(model, None)
