"""Fused input projections for small decoding steps: q/k/v as one matmul, gate/up as one matmul.

A decoding step of a few query rows (batch x block) reads every weight once and is bound by that read. cuBLAS
reads one wide weight at a larger fraction of the bandwidth than several narrow ones that share their input
(H200, LLaDA-8B layers at 32 rows: all projections of a forward 5.23 ms separate, 4.18 ms with q/k/v and
gate/up concatenated; at 512 rows the two are equal; ``benchmarks/engine_profile.py --gemm-only``).

Checkpoints, LoRA, FSDP and the optimizer see the projections as the separate parameters they are. A
:class:`FusedProjections` holds concatenated *copies* at fixed addresses (so recorded CUDA graphs can read
them), refreshed from the parameters by :meth:`~FusedProjections.refresh` (one device copy), and makes the
modules use them only inside :meth:`~FusedProjections.active`. A module opts in by naming its groups in
``fused_groups`` and computing them with :func:`project` (:func:`project_one` for a group of one projection); a
group with a member that is neither a plain ``nn.Linear`` nor a plain peft LoRA wrapper is left separate.

Four kinds of copies (``mode``):

* ``fused`` (default): the groups of several plain ``nn.Linear``, concatenated in the model's dtype, and every
  group with a LoRA-wrapped member. For those the adapters stay unmerged, computed with peft's own operations and
  roundings: the ``lora_A`` rows of the active adapters follow the base rows in the concatenated weight (the
  adapters' down-projections come out of the base matmul), and each adapter's ``lora_B`` copy is applied to its
  slice of that output, scaled and added to its member's output (:class:`LowRank`; skipped while peft's
  ``disable_adapter`` is on). A LoRA step then reads its input once per group and runs one matmul per adapter
  fewer. This needs the adapters computed in the copies' dtype: under autocast, adapters in fp32 or the autocast
  dtype; without it, adapters in the base weights' dtype (peft computes fp32 adapters of a bf16 model in fp32,
  which the copies leave separate);
* ``merged``: those, and every group with a peft LoRA-wrapped member, whose copy holds the base weight with the
  active adapters merged in (one matmul per projection instead of the base one and the adapter's two);
* ``fp8``: every group, single projections (``o``, ``down``, ...) included, as FP8 with one scale per output
  channel (:mod:`dare.models.fp8`), LoRA adapters merged;
* ``adapters``: only the LoRA adapters, ``lora_A`` and ``lora_B`` copied in ``dtype``; every member computes its
  base projection with its own weight and adds its adapters as peft does. For steps too large for ``fused``
  copies to pay: under autocast peft casts each fp32 adapter weight to the autocast dtype at every call (14 cast
  kernels per LLaDA layer and forward with the default targets, ~90 ms of a d1 rollout on an H100); the copies
  are that cast, done once per refresh, so the step computes the same products.

A group of one plain projection is copied only as FP8, or in a ``dtype`` its weight is not in (fp32 master weights
decoding under bf16 autocast: the copy is autocast's cast of the weight, made once per refresh instead of once per
call); in the model's own dtype the copy would gain nothing.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from dare.models.fp8 import FP8, fp8_linear, fp8_shape_ok, quantize_rows

ATTRIBUTE = "_fused_projections"
COPY_MODES = ("fused", "merged", "fp8", "adapters")
"""Kinds of :class:`FusedProjections` (module docstring)."""


@dataclass
class LowRank:
    """One active LoRA adapter of a member of a ``fused`` or ``adapters`` group: its name, rank and scaling, and the
    copy of its ``lora_B`` weight ``[out, rank]``. Its ``lora_A`` rows are in the group's weight, after the base
    rows (``fused``), or in ``down [rank, in]`` (``adapters``)."""

    name: str
    rank: int
    scaling: float
    up: torch.Tensor
    down: torch.Tensor | None = None


@dataclass
class FusedWeight:
    """One group's concatenated ``weight [sum(sizes) + sum of the adapters' ranks, in]`` (None for ``adapters``
    copies: the members' own weights), optional ``bias`` (zero on the adapters' rows), the members' output sizes,
    the :class:`LowRank` adapters of each member (``()`` when the group has none) and, for FP8 copies, the float32
    ``scale [sum(sizes)]`` of each output channel and the matmul's ``out_dtype``."""

    weight: torch.Tensor | None
    bias: torch.Tensor | None
    sizes: tuple[int, ...]
    scale: torch.Tensor | None = None
    out_dtype: torch.dtype | None = None
    adapters: tuple[tuple[LowRank, ...], ...] = ()

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """Every device tensor of the copy (for its size)."""
        own = tuple(t for t in (self.weight, self.bias, self.scale) if t is not None)
        return own + tuple(t for member in self.adapters for adapter in member
                           for t in (adapter.up, adapter.down) if t is not None)


def project(module: nn.Module, group: str, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The outputs of ``module.fused_groups[group]``'s projections of ``x``: one matmul while the group is fused
    (:meth:`FusedProjections.active`), else one call per member."""
    fused = getattr(module, ATTRIBUTE, None)
    if fused is not None and group in fused:
        entry = fused[group]
        if entry.weight is None:
            return tuple(_adapted(x, member, adapters) for member, adapters in zip(_members(module, group),
                                                                                   entry.adapters))
        if entry.scale is not None:
            out = fp8_linear(x, entry.weight, entry.scale, entry.bias, out_dtype=entry.out_dtype)
        else:
            out = F.linear(x, entry.weight, entry.bias)
        if entry.adapters:
            return _add_adapters(out, entry, _members(module, group))
        return out.split(entry.sizes, dim=-1) if len(entry.sizes) > 1 else (out,)
    return tuple(getattr(module, name)(x) for name in module.fused_groups[group])


def _members(module: nn.Module, group: str) -> list[nn.Module]:
    """The member modules of ``module.fused_groups[group]``."""
    return [getattr(module, name) for name in module.fused_groups[group]]


def _add_adapters(out: torch.Tensor, entry: FusedWeight, members: list[nn.Module]) -> tuple[torch.Tensor, ...]:
    """Each member's output from a ``fused`` group's matmul that also computed its adapters' ``lora_A`` products:
    ``base + lora_B(lora_A(x)) * scaling`` per active adapter, in peft's order of operations; the base output alone
    while peft's ``disable_adapter`` is on (read at every call: recorded steps are kept per adapter state)."""
    ranks = tuple(adapter.rank for member in entry.adapters for adapter in member)
    parts = out.split(entry.sizes + ranks, dim=-1)
    downs = iter(parts[len(entry.sizes):])
    outputs = []
    for result, adapters, member in zip(parts, entry.adapters, members):
        for adapter in adapters:
            down = next(downs)
            if not member.disable_adapters:
                result = result + F.linear(down, adapter.up) * adapter.scaling
        outputs.append(result)
    return tuple(outputs)


def _adapted(x: torch.Tensor, member: nn.Module, adapters: tuple[LowRank, ...]) -> torch.Tensor:
    """A member of an ``adapters`` group: its base projection plus ``lora_B(lora_A(x)) * scaling`` per active
    adapter from the copies, in peft's order of operations (the base output alone while ``disable_adapter`` is on)."""
    result = _linear(member)(x)
    if not adapters or member.disable_adapters:
        return result
    for adapter in adapters:
        result = result + F.linear(F.linear(x, adapter.down), adapter.up) * adapter.scaling
    return result


def project_one(module: nn.Module, group: str, x: torch.Tensor) -> torch.Tensor:
    """The output of a group of one projection (``module.fused_groups[group] == (name,)``): the module's own call
    unless merged or FP8 copies are active (:meth:`FusedProjections.active`)."""
    return project(module, group, x)[0]


class FusedProjections:
    """Concatenated copies of every fusable projection group of ``model``, in ``dtype`` (default: the weights').

    ``dtype`` lets a model with fp32 master weights decoding under bf16 autocast keep bf16 copies: the same
    rounding autocast applies to each weight, done once per refresh instead of once per forward. ``mode``: which
    groups are copied, and how (module docstring); for ``fp8``, ``dtype`` is the biases' and the matmuls' output
    dtype.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype | None = None, mode: str = "fused"):
        if mode not in COPY_MODES:
            raise ValueError(f"mode must be one of {COPY_MODES}, got {mode!r}")
        self.mode = mode
        self.dtype = dtype
        fp8 = mode == "fp8"
        self.groups: list[tuple[nn.Module, str, list[nn.Linear], FusedWeight]] = []
        for module in model.modules():
            for group, names in getattr(module, "fused_groups", {}).items():
                members = [getattr(module, name) for name in names]
                if not _copied(members, mode, dtype):
                    continue
                first = _linear(members[0]).weight
                sizes = tuple(_linear(m).out_features for m in members)
                out_dtype = dtype or first.dtype
                if mode == "adapters":
                    entry = FusedWeight(None, None, sizes, adapters=_low_rank_copies(members, out_dtype, down=True))
                    self.groups.append((module, group, members, entry))
                    continue
                adapters = _low_rank_copies(members, out_dtype) if mode == "fused" else ()
                rows = sum(sizes) + sum(adapter.rank for member in adapters for adapter in member)
                weight = torch.empty((rows, first.shape[1]), dtype=FP8 if fp8 else out_dtype, device=first.device)
                bias = None if _linear(members[0]).bias is None else torch.zeros(rows, dtype=out_dtype,
                                                                                  device=first.device)
                scale = torch.empty(rows, dtype=torch.float32, device=first.device) if fp8 else None
                entry = FusedWeight(weight, bias, sizes, scale, out_dtype if fp8 else None, adapters)
                self.groups.append((module, group, members, entry))
        self.refresh()

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for *_, e in self.groups for t in e.tensors)

    def __bool__(self) -> bool:
        return bool(self.groups)

    @property
    def merges_lora(self) -> bool:
        """Whether some copy merges a LoRA-wrapped projection (``merged`` and ``fp8`` copies)."""
        return self.mode in ("merged", "fp8") and any(type(m) is not nn.Linear
                                                      for _, _, members, _ in self.groups for m in members)

    @property
    def keeps_lora(self) -> bool:
        """Whether some ``fused`` or ``adapters`` copy computes LoRA adapters unmerged (:class:`LowRank`)."""
        return any(entry.adapters for *_, entry in self.groups)

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the current parameters into the fused buffers (in place: their addresses never change). ``merged``
        and ``fp8`` copies of LoRA-wrapped projections get the base weight with the active adapters merged in;
        ``fused`` copies get the base weight, the adapters' ``lora_A`` rows and ``lora_B`` copies, ``adapters``
        copies the adapters' ``lora_A`` and ``lora_B``."""
        for _, _, members, entry in self.groups:
            start = 0
            for member, size in zip(members, entry.sizes if entry.weight is not None else ()):
                weight = _linear(member).weight if self.mode == "fused" else _effective_weight(member)
                if entry.scale is not None:
                    quantize_rows(weight, entry.weight[start:start + size], entry.scale[start:start + size])
                else:
                    entry.weight[start:start + size].copy_(weight)
                if entry.bias is not None:
                    entry.bias[start:start + size].copy_(_linear(member).bias)
                start += size
            for member, adapters in zip(members, entry.adapters):
                if _adapter_layout(member) != tuple((a.name, a.rank, a.scaling) for a in adapters):
                    raise RuntimeError("a LoRA layer's active adapters changed since its copies were made; "
                                       "make new copies (fused_projections does)")
                for adapter in adapters:
                    down = member.lora_A[adapter.name].weight
                    if adapter.down is not None:
                        adapter.down.copy_(down)
                    else:
                        entry.weight[start:start + adapter.rank].copy_(down)
                        start += adapter.rank
                    adapter.up.copy_(member.lora_B[adapter.name].weight)

    def matches(self, model: nn.Module) -> bool:
        """False once a member was re-wrapped (e.g. LoRA added) or re-shaped since these copies were made, or a
        LoRA member's active adapters changed (switched, added, re-scaled) under ``fused`` copies."""
        for module, group, members, entry in self.groups:
            names = module.fused_groups[group]
            if [getattr(module, n) for n in names] != members or not _fusable(members, self.mode, self.dtype):
                return False
            layouts = tuple(tuple((a.name, a.rank, a.scaling) for a in adapters) for adapters in entry.adapters)
            if self.mode in ("fused", "adapters") and layouts != _layouts(members):
                return False
        return True

    @contextlib.contextmanager
    def active(self):
        """Inside: every fused group's module computes it with one matmul over the copies."""
        touched = []
        for module, group, _, entry in self.groups:
            table = module.__dict__.setdefault(ATTRIBUTE, {})
            table[group] = entry
            touched.append(module)
        try:
            yield self
        finally:
            for module in touched:
                module.__dict__.pop(ATTRIBUTE, None)


def _copied(members: list[nn.Module], mode: str, dtype: torch.dtype | None = None) -> bool:
    """Whether ``mode`` copies a group of these members (module docstring)."""
    if not _fusable(members, mode, dtype):
        return False
    if mode == "fp8":
        return True
    if mode == "merged" and any(type(m) is not nn.Linear for m in members):
        return True
    if mode == "fused" and dtype is not None and _linear(members[0]).weight.dtype != dtype:
        return True  # the copy is the cast autocast would make at every call
    if mode == "adapters":  # only adapters that a call would cast: some weight not in ``dtype`` already
        return dtype is not None and any(w.dtype != dtype for m in members for w in _adapter_weights(m))
    return len(members) > 1 or any(_layouts(members))


def casts_weights(model: nn.Module, dtype: torch.dtype) -> bool:
    """Whether some projection that copies can hold has its weight in another dtype than ``dtype`` (the autocast
    dtype): fp32 master weights, which autocast would cast at every call."""
    for module in model.modules():
        for names in getattr(module, "fused_groups", {}).values():
            for name in names:
                member = getattr(module, name)
                linear = member if type(member) is nn.Linear else getattr(member, "base_layer", None)
                if isinstance(linear, nn.Linear) and linear.weight.dtype != dtype:
                    return True
    return False


def _fusable(members: list[nn.Module], mode: str = "fused", dtype: torch.dtype | None = None) -> bool:
    """Whether a group of these members can be copied by ``mode`` (copies in ``dtype``; the weights' when None)."""
    unmerged = mode in ("fused", "adapters")
    if not all(type(m) is nn.Linear or (_mergeable_lora(m) and (not unmerged or _unmerged_exact(m, dtype)))
               for m in members):
        return False
    linears = [_linear(m) for m in members]
    first = linears[0]
    if mode == "fp8" and not fp8_shape_ok(first.in_features, sum(m.out_features for m in linears)):
        return False
    return all(m.in_features == first.in_features and m.weight.dtype == first.weight.dtype
               and m.weight.device == first.weight.device and (m.bias is None) == (first.bias is None)
               for m in linears)


def _mergeable_lora(module: nn.Module) -> bool:
    """A peft LoRA linear whose adapters are a plain low-rank delta of an ``nn.Linear`` (no DoRA, no LoRA bias, no
    other peft LoRA variant such as aLoRA, not merged into its base by peft): ``merged`` and ``fp8`` copies merge it
    into the base weight; any other wrapper keeps its own forward."""
    return (type(getattr(module, "base_layer", None)) is nn.Linear and hasattr(module, "get_delta_weight")
            and not getattr(module, "fan_in_fan_out", False) and not getattr(module, "merged", False)
            and not getattr(module, "lora_variant", {})
            and not any(getattr(module, "use_dora", {}).values()) and not any(getattr(module, "lora_bias", {}).values()))


def _unmerged_exact(member: nn.Module, dtype: torch.dtype | None) -> bool:
    """Whether ``fused`` / ``adapters`` copies in ``dtype`` compute this LoRA layer's adapters as peft does: under
    autocast (a ``dtype`` given) every matmul runs in that dtype, for adapters in fp32 or that dtype (bf16 adapters
    under fp16 autocast see their input rounded to bf16 first; autocast leaves fp64 adapters in fp64); without
    autocast, only adapters in the base weight's dtype (peft computes fp32 adapters of a bf16 model in fp32)."""
    base = member.base_layer.weight
    # under autocast peft first casts the input to the adapters' dtype: lossless only from fp32 or that same dtype
    exact = (base.dtype,) if dtype is None else (torch.float32, dtype)
    return all(w.device == base.device and w.dtype in exact for w in _adapter_weights(member))


def _adapter_weights(member: nn.Module) -> list[torch.Tensor]:
    """The ``lora_A`` and ``lora_B`` weights of a LoRA layer's active adapters (none for a plain linear)."""
    return [layer[name].weight for name, _, _ in _adapter_layout(member) for layer in (member.lora_A, member.lora_B)]


def _adapter_layout(member: nn.Module) -> tuple[tuple[str, int, float], ...]:
    """A LoRA layer's active adapters as ``(name, rank, scaling)``, in peft's order (``()`` for a plain linear),
    whether or not peft's ``disable_adapter`` is on: disabled adapters keep their place in ``fused`` copies (their
    ``lora_B`` is skipped while off), so switching them off and on reuses the copies."""
    if type(member) is nn.Linear:
        return ()
    return tuple((name, member.lora_A[name].out_features, float(member.scaling[name]))
                 for name in member.active_adapters if name in member.lora_A)


def _layouts(members: list[nn.Module]) -> tuple[tuple[tuple[str, int, float], ...], ...]:
    """Each member's :func:`_adapter_layout`; ``()`` when no member has an active adapter."""
    layouts = tuple(_adapter_layout(m) for m in members)
    return layouts if any(layouts) else ()


def _low_rank_copies(members: list[nn.Module], dtype: torch.dtype, down: bool = False
                     ) -> tuple[tuple[LowRank, ...], ...]:
    """Empty :class:`LowRank` copies in ``dtype`` for the active adapters of each member (``()`` without any), with
    a ``lora_A`` copy each when ``down``."""
    def copy(member, name, rank, scaling):
        linear = _linear(member)
        make = functools.partial(torch.empty, dtype=dtype, device=linear.weight.device)
        return LowRank(name, rank, scaling, make((linear.out_features, rank)),
                       make((rank, linear.in_features)) if down else None)

    return tuple(tuple(copy(member, *adapter) for adapter in layout)
                 for member, layout in zip(members, _layouts(members)))


def _linear(member: nn.Module) -> nn.Linear:
    """The ``nn.Linear`` a group member computes with (a LoRA wrapper's base layer)."""
    return member if type(member) is nn.Linear else member.base_layer


def _effective_weight(member: nn.Module) -> torch.Tensor:
    """The weight a member applies now: a LoRA wrapper's base weight plus its active, unmerged adapters (peft's
    ``get_delta_weight``; LoRA dropout has no weight form and does not apply to the copies)."""
    if type(member) is nn.Linear:
        return member.weight
    weight = member.base_layer.weight
    if member.disable_adapters:  # (a peft-merged layer is never copied: _mergeable_lora)
        return weight
    for name in member.active_adapters:
        if name in member.lora_A:
            weight = weight + member.get_delta_weight(name)
    return weight
