"""Rollout weights the engine owns: an unsharded twin of an FSDP2-sharded model.

FSDP2 gathers parameters into buffers that it frees again and may re-allocate at other addresses, so recorded
CUDA graphs cannot read a sharded model's weights. The static engine therefore decodes a sharded model with a plain
copy of it - same class, config and parameter names - whose tensors it owns at fixed addresses. Before every
generation call the full parameters are copied into the copy (the refresh: one device copy of the weights; inside
:func:`dare.distributed.gathered_parameters` the parameters are already gathered, outside it each is all-gathered,
so every rank must decode, as in an RL rollout). The copy costs the model's size in device memory once per process.

The copy computes as the sharded model does: floating parameters in FSDP2's mixed-precision ``param_dtype`` when
one is set (bf16 on CUDA by default, whatever the master weights' dtype). A LoRA-wrapped (peft) model gets a copy
wrapped with the same adapter config, adapter weights included, with its adapter layers enabled or disabled as
the model's are at each call.
"""

from __future__ import annotations

import copy
import logging
import time
import weakref

import torch

from dare.models.compile import compile_like

log = logging.getLogger("dare.rollout")
_TWINS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def is_sharded(model) -> bool:
    """True when any module of ``model`` is FSDP-wrapped."""
    return any(type(m).__name__.startswith("FSDP") for m in model.modules())


def _plain_class(model) -> type:
    """The model's own class: FSDP2 replaces it with a subclass named ``FSDP<Class>``."""
    return next(c for c in type(model).__mro__ if not c.__name__.startswith("FSDP"))


def base_model(model):
    """The DARE model under a peft wrapper (the model itself otherwise): the engine keeps its recorded steps, stats
    and twins per base model."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _full(tensor: torch.Tensor) -> torch.Tensor:
    full_tensor = getattr(tensor, "full_tensor", None)  # a DTensor shard: all-gather it
    return (full_tensor() if full_tensor is not None else tensor).detach()


def compute_dtype(model) -> torch.dtype | None:
    """FSDP2's mixed-precision ``param_dtype`` of ``model`` (the dtype its forwards compute in), or None."""
    for module in model.modules():
        get_state = getattr(module, "_get_fsdp_state", None)
        if get_state is not None:
            policy = getattr(get_state(), "_mp_policy", None)  # private in torch 2.6-2.13; None if it moves
            return getattr(policy, "param_dtype", None)
    return None


def _tuner_layers(model) -> dict:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return {name: m for name, m in model.named_modules() if isinstance(m, BaseTunerLayer)}


def _build(model, params: dict[str, torch.Tensor]):
    """A plain model of ``model``'s class and config (peft-wrapped with its adapter config when ``model`` is) on the
    parameters' device; floating parameters in FSDP2's compute dtype, others in their own."""
    first = next(iter(params.values()))
    base = base_model(model)
    with torch.device(first.device):
        twin = _plain_class(base)(base.config)
    if base is not model:  # peft: the same adapter on the copy, under the same name
        from peft import get_peft_model

        if len(model.peft_config) != 1:
            raise ValueError(f"{len(model.peft_config)} adapters; the copy serves one")
        (name, config), = model.peft_config.items()
        twin = get_peft_model(twin, copy.deepcopy(config), adapter_name=name)
    dtype = compute_dtype(model)
    own = dict(twin.named_parameters())
    if own.keys() != params.keys():
        missing = sorted(own.keys() ^ params.keys())
        raise KeyError(f"parameter names differ from the model's ({', '.join(missing[:3])})")
    for name, param in own.items():  # .data keeps tied parameters tied
        source = params[name].dtype
        param.data = param.data.to(dtype if dtype is not None and source.is_floating_point else source)
    compile_like(twin, model)  # compiled blocks: the copy's too (the engine decodes them statically)
    return twin.eval().requires_grad_(False)


def refreshed_twin(model) -> tuple[torch.nn.Module, float]:
    """``model``'s unsharded twin holding its current weights (built on first use); returns it and the seconds the
    refresh took (the weight copy; a first call also builds the twin)."""
    began = time.perf_counter()
    params = {name: _full(p) for name, p in model.named_parameters()}
    twin = twin_of(model)
    if twin is None:
        twin = _build(model, params)
        _TWINS[base_model(model)] = twin
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
    if twin is not base_model(twin):  # adapters on or off as the model's are now (e.g. inside peft's disable_adapter)
        copies, switched = _tuner_layers(twin), False
        for name, layer in _tuner_layers(model).items():
            if copies[name].disable_adapters != layer.disable_adapters:
                copies[name].enable_adapters(not layer.disable_adapters)
                switched = True
        if switched:
            twin.requires_grad_(False)  # peft's enable_adapters marks the adapter weights trainable again
    if params and next(iter(params.values())).is_cuda:
        torch.cuda.synchronize()
    return twin, time.perf_counter() - began


def twin_of(model):
    """The twin the engine holds for ``model``, or None."""
    return _TWINS.get(base_model(model))


def release_twin(model) -> None:
    """Free the twin of ``model`` (the next sharded rollout builds it again)."""
    _TWINS.pop(base_model(model), None)
