"""Gradient clipping over parameters that live on different device meshes.

With expert parallelism the expert banks are DTensors on the 2-D ``(expert_replicas, expert)`` mesh while the
other parameters are FSDP2 DTensors on the world mesh; ``torch.nn.utils.clip_grad_norm_`` cannot stack norms
of different meshes. Here each mesh's norm is reduced to a full tensor first, then the norms are combined.
"""

from __future__ import annotations

import torch


def clip_grad_norm_(parameters, max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` (L2) for parameters on any number of meshes; returns the total norm
    (a DTensor when every gradient is on one mesh, as torch returns it)."""
    from torch.distributed.tensor import DTensor

    params = [p for p in parameters if p.grad is not None]
    by_mesh: dict = {}
    for p in params:
        by_mesh.setdefault(p.grad.device_mesh if isinstance(p.grad, DTensor) else None, []).append(p)
    if len(by_mesh) <= 1:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    norms = []
    for group in by_mesh.values():
        norm = torch.nn.utils.get_total_norm([p.grad for p in group])
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    total = torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]))
    for group in by_mesh.values():
        torch.nn.utils.clip_grads_with_norm_(group, max_norm, total)
    return total
