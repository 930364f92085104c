"""Expert parallelism: each MoE layer's experts spread over the ``expert`` dimension of a device mesh.

``expert_parallel_mesh(info, N)`` builds a 2-D mesh ``(expert_replicas, expert)`` of shape
``(world // N, N)``; ranks ``N*i .. N*i+N-1`` form one expert group. :func:`shard_experts` keeps on each rank
the ``E / N`` experts it owns (rank ``r`` of the group: experts ``r*E/N .. (r+1)*E/N - 1``) as DTensor shards
and points every :class:`~dare.models.moe.ExpertBank` at the group; :func:`shard_expert_replicas` adds FSDP2
over the replicas (the trainer does both for ``distributed.expert_parallel: N``). In the forward, each bank
sends each routed row to the rank owning its expert (``all_to_all_single``: row counts first, then the rows),
runs its local experts as one grouped matmul, and sends the outputs back; autograd runs the same collectives
in reverse (:func:`dare.models.moe.dispatch_and_combine`). Routers, attention and shared experts stay
replicated. Everything is ``torch.distributed`` collectives, so it runs on gloo (CPU tests) and NCCL alike.

Gradients: an expert's gradient on its owner sums the contributions of the tokens of every rank in its group,
which is what data parallelism's all-reduce would give for a replicated expert. Replicated parameters keep
per-rank gradients (reduced by the usual data-parallel sum).
"""

from __future__ import annotations

import torch.nn as nn

from dare.errors import ConfigError


def check_expert_degree(degree: int, world_size: int) -> None:
    """One-line error unless ``degree`` (``distributed.expert_parallel``) divides the ``world_size`` processes."""
    if degree < 1 or world_size % degree:
        raise ConfigError(f"distributed.expert_parallel={degree} must divide the world size {world_size}")


def check_expert_banks(model: nn.Module, size: int) -> list:
    """The :class:`~dare.models.moe.ExpertBank` modules of ``model`` (meta-device skeletons too), with a one-line
    error when there are none (no MoE model) or ``size`` ranks cannot split a bank's experts evenly."""
    from dare.models.moe import ExpertBank

    banks = [m for m in model.modules() if isinstance(m, ExpertBank)]
    if not banks:
        raise ConfigError("distributed.expert_parallel > 1 needs a mixture-of-experts model (no MoE layer found)")
    for bank in banks:
        if bank.num_experts % size:
            raise ConfigError(
                f"distributed.expert_parallel={size} must divide the number of experts {bank.num_experts}")
    return banks


def expert_parallel_mesh(info, degree: int):
    """The ``(expert_replicas, expert)`` mesh for ``degree``-way expert parallelism over ``info.world_size`` ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    check_expert_degree(degree, info.world_size)
    return init_device_mesh(info.device.type, (info.world_size // degree, degree),
                            mesh_dim_names=("expert_replicas", "expert"))


def shard_experts(model: nn.Module, mesh) -> int:
    """Keep only this rank's experts in every :class:`ExpertBank` of ``model``; returns the number of banks.

    ``mesh`` is the 1-D ``expert`` mesh (``expert_parallel_mesh(...)["expert"]``). The stacked parameters become
    DTensors sharded on the expert dimension (``Shard(0)``): full state dicts (export) gather every expert, the
    distributed checkpoint stores each slice once, and FSDP2 can shard them further over ``expert_replicas``.
    Banks must hold all their experts (call once, after loading).
    """
    from torch.distributed.tensor import DTensor, Shard

    size, rank = mesh.size(), mesh.get_local_rank()
    banks = check_expert_banks(model, size)
    for bank in banks:
        if bank.num_local_experts != bank.num_experts:
            raise ConfigError("experts are already sharded (shard_experts called twice)")
    for bank in banks:
        per_rank = bank.num_experts // size
        start = rank * per_rank
        for name in ("gate_up_proj", "down_proj"):
            full = getattr(bank, name)
            local = full.detach()[start:start + per_rank].clone()
            shard = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
            setattr(bank, name, nn.Parameter(shard, requires_grad=full.requires_grad))  # frozen under LoRA
        bank.first_expert, bank.expert_group = start, mesh.get_group()
    return len(banks)


def shard_expert_replicas(model: nn.Module, mesh, mp_policy=None) -> int:
    """FSDP2 (``fully_shard``) on every expert bank over the ``expert_replicas`` mesh: call before sharding the
    blocks over the world, so expert gradients are reduced only among the ranks holding the same experts."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from dare.models.moe import ExpertBank

    banks = [m for m in model.modules() if isinstance(m, ExpertBank)]
    for bank in banks:
        fully_shard(bank, mesh=mesh, mp_policy=mp_policy or MixedPrecisionPolicy())
    return len(banks)
