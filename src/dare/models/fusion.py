"""Fused input projections for small decoding steps: q/k/v as one matmul, gate/up as one matmul.

A decoding step of a few query rows (batch x block) reads every weight once and is bound by that read. cuBLAS
reads one wide weight at a larger fraction of the bandwidth than several narrow ones that share their input
(H200, LLaDA-8B layers at 32 rows: all projections of a forward 5.23 ms separate, 4.18 ms with q/k/v and
gate/up concatenated; at 512 rows the two are equal; ``benchmarks/engine_profile.py --gemm-only``).

Checkpoints, LoRA, FSDP and the optimizer see the projections as the separate parameters they are. A
:class:`FusedProjections` holds concatenated *copies* at fixed addresses (so recorded CUDA graphs can read
them), refreshed from the parameters by :meth:`~FusedProjections.refresh` (one device copy), and makes the
modules use them only inside :meth:`~FusedProjections.active`. A module opts in by naming its groups in
``fused_groups`` and computing them with :func:`project`; a group whose members are not plain ``nn.Linear``
(e.g. LoRA-wrapped) is left separate.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

ATTRIBUTE = "_fused_projections"


@dataclass
class FusedWeight:
    """One group's concatenated ``weight [sum(sizes), in]``, optional ``bias`` and the members' output sizes."""

    weight: torch.Tensor
    bias: torch.Tensor | None
    sizes: tuple[int, ...]


def project(module: nn.Module, group: str, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The outputs of ``module.fused_groups[group]``'s projections of ``x``: one matmul while the group is fused
    (:meth:`FusedProjections.active`), else one call per member."""
    fused = getattr(module, ATTRIBUTE, None)
    if fused is not None and group in fused:
        entry = fused[group]
        return F.linear(x, entry.weight, entry.bias).split(entry.sizes, dim=-1)
    return tuple(getattr(module, name)(x) for name in module.fused_groups[group])


class FusedProjections:
    """Concatenated copies of every fusable projection group of ``model``, in ``dtype`` (default: the weights').

    ``dtype`` lets a model with fp32 master weights decoding under bf16 autocast keep bf16 copies: the same
    rounding autocast applies to each weight, done once per refresh instead of once per forward.
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype | None = None):
        self.groups: list[tuple[nn.Module, str, list[nn.Linear], FusedWeight]] = []
        for module in model.modules():
            for group, names in getattr(module, "fused_groups", {}).items():
                members = [getattr(module, name) for name in names]
                if not _fusable(members):
                    continue
                first = members[0].weight
                weight = torch.empty((sum(m.out_features for m in members), first.shape[1]),
                                     dtype=dtype or first.dtype, device=first.device)
                bias = None if members[0].bias is None else weight.new_empty(weight.shape[0])
                entry = FusedWeight(weight, bias, tuple(m.out_features for m in members))
                self.groups.append((module, group, members, entry))
        self.refresh()

    @property
    def nbytes(self) -> int:
        return sum(e.weight.numel() * e.weight.element_size() for *_, e in self.groups)

    def __bool__(self) -> bool:
        return bool(self.groups)

    @torch.no_grad()
    def refresh(self) -> None:
        """Copy the current parameters into the fused buffers (in place: their addresses never change)."""
        for _, _, members, entry in self.groups:
            start = 0
            for member, size in zip(members, entry.sizes):
                entry.weight[start:start + size].copy_(member.weight)
                if entry.bias is not None:
                    entry.bias[start:start + size].copy_(member.bias)
                start += size

    def matches(self, model: nn.Module) -> bool:
        """False once a member was re-wrapped (e.g. LoRA added) or re-shaped since these copies were made."""
        for module, group, members, _ in self.groups:
            names = module.fused_groups[group]
            if [getattr(module, n) for n in names] != members or not _fusable(members):
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


def _fusable(members: list[nn.Module]) -> bool:
    if not all(type(m) is nn.Linear for m in members):
        return False
    first = members[0]
    return all(m.in_features == first.in_features and m.weight.dtype == first.weight.dtype
               and m.weight.device == first.weight.device and (m.bias is None) == (first.bias is None)
               for m in members)
