"""Sequence parallelism (Ulysses) on torch.distributed: a (data x sequence) device mesh and the collectives
that move one forward between sequence shards and head shards.

Layout. ``world = data x sequence`` ranks form a 2-D :class:`~torch.distributed.device_mesh.DeviceMesh` with the
sequence dimension innermost (the ``P`` ranks of one sequence group are consecutive: on one node when ``P`` is at
most the GPUs per node). Every rank of a sequence group holds the same micro-batches (data sharding, loss
normalisers and metrics use the data dimension only, :func:`build_sequence_parallel`); inside the model each rank
keeps one contiguous slice of ``ceil(L / P)`` positions of every row through the token-wise layers (embedding,
norms, MLPs / MoE, final norm). FSDP2 shards the parameters over all ``data x sequence`` ranks (every rank needs
the same weights); gradients are summed over all of them.

Attention (exact, over the whole sequence). Around each attention call :meth:`SequenceParallel.to_heads` turns
``[B, H, L/P, d]`` sequence shards into ``[B, H/P, L, d]`` head shards with one ``all_to_all_single`` (queries,
keys and values), the family's attention runs unchanged on the full sequence with the full layout (padding,
packed documents, block-causal or ``[noisy ; clean]`` masks), and :meth:`SequenceParallel.to_sequence` turns the
output back. Key/value heads that the degree does not divide (grouped-query attention with few KV heads) are
repeated up to the query heads first. The collective is ``torch.distributed.all_to_all_single`` (NCCL / gloo)
in a small autograd function whose backward runs the same all-to-all on the gradients.

Losses. Each rank scores the positions whose hidden state it holds (after the family's logit shift, so Dream's
prediction of the first token of a shard comes from the last position of the previous shard) and
:meth:`SequenceParallel.sum_shards` adds the per-position log-probs of the group; every rank then computes the
same loss of the whole sequence. See :func:`dare.algorithms.logprobs.masked_logprobs`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dare.distributed import DistInfo
from dare.errors import ConfigError


@dataclass(frozen=True)
class SequenceParallel:
    """One rank's place in its sequence group and the collectives of a sequence-parallel forward.

    Attributes:
        group: the process group of the ``degree`` ranks that share one sequence.
        degree: ranks per sequence (``P``).
        rank: this rank's index in the group (it holds shard ``rank`` of every row).
    """

    group: object
    degree: int
    rank: int

    # ---- sequence shards ---------------------------------------------------------------------------
    def padded_length(self, length: int) -> int:
        """``length`` rounded up to a multiple of the degree (rows are padded so every shard has equal size)."""
        return -(-length // self.degree) * self.degree

    def shard(self, length: int) -> slice:
        """Positions of this rank's shard of a row of ``length`` tokens (a multiple of the degree)."""
        size = length // self.degree
        return slice(self.rank * size, (self.rank + 1) * size)

    # ---- Ulysses exchange --------------------------------------------------------------------------
    def check_heads(self, heads: int, what: str = "attention heads") -> None:
        """One-line error when ``heads`` cannot be split over the degree."""
        if heads % self.degree:
            raise ConfigError(f"distributed.sequence_parallel={self.degree} must divide the model's {heads} {what}")

    def _exchange(self, tensor: torch.Tensor, split_dim: int, concat_dim: int) -> torch.Tensor:
        """All-to-all: split ``split_dim`` into ``degree`` chunks (chunk ``p`` goes to rank ``p``), concatenate the
        received chunks (rank order) along ``concat_dim``."""
        chunks = tensor.chunk(self.degree, dim=split_dim)
        send = torch.stack(chunks, dim=0)  # [P, ...]: chunk p for rank p
        received = _AllToAll.apply(send, self.group)
        return torch.cat(received.unbind(0), dim=concat_dim)

    def to_heads(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Sequence shards ``[B, H, L/P, d]`` -> head shards ``[B, H/P, L, d]`` of queries, keys and values."""
        self.check_heads(q.shape[1])
        if k.shape[1] % self.degree:  # too few KV heads: repeat them (grouped-query attention) before splitting
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return tuple(self._exchange(t, split_dim=1, concat_dim=2) for t in (q, k, v))

    def to_sequence(self, out: torch.Tensor) -> torch.Tensor:
        """Head shards ``[B, H/P, L, d]`` -> sequence shards ``[B, H, L/P, d]`` (the inverse of :meth:`to_heads`)."""
        return self._exchange(out, split_dim=2, concat_dim=1)

    # ---- losses ------------------------------------------------------------------------------------
    def sum_shards(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum of ``tensor`` over the group (each rank filled the positions it owns, zeros elsewhere).

        The backward is the identity: every rank computes the same loss of the summed tensor, so the gradient
        reaching each rank's own entries is already the full one (an all-reduce would count it ``degree`` times).
        """
        return _SumShards.apply(tensor, self.group)


class _AllToAll(torch.autograd.Function):
    """``dist.all_to_all_single`` of equal chunks along dim 0 (chunk ``p`` to rank ``p``). The exchange is its own
    adjoint: the backward sends every gradient chunk back where its value came from, with the same collective."""

    @staticmethod
    def forward(ctx, send, group):
        ctx.group = group
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send.contiguous(), group=group)
        return received

    @staticmethod
    def backward(ctx, grad):
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad.contiguous(), group=ctx.group)
        return out, None


class _SumShards(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group):
        out = tensor.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def attention_heads(config) -> int | None:
    """Query heads of a model config (``num_attention_heads``; LLaDA: ``n_heads``), None when unknown."""
    for key in ("num_attention_heads", "n_heads"):
        value = getattr(config, key, None)
        if isinstance(value, int):
            return value
    return None


def check_sequence_degree(degree: int, world_size: int) -> None:
    """One-line error unless ``degree`` (``distributed.sequence_parallel``) divides the ``world_size`` processes."""
    if degree < 1:
        raise ConfigError(f"distributed.sequence_parallel must be >= 1; got {degree}")
    if world_size % degree:
        raise ConfigError(f"distributed.sequence_parallel={degree} must divide the number of processes "
                          f"({world_size}); launch with torchrun --nproc_per_node a multiple of it")


def build_sequence_parallel(info: DistInfo, degree: int) -> tuple[SequenceParallel, DistInfo]:
    """The ``(data, sequence)`` mesh of ``info``'s world: this rank's :class:`SequenceParallel` and the
    data-parallel view of ``info`` (rank / world size / process group of the data dimension: what data sources,
    loss normalisers and metric sums use). One-line errors when ``degree`` does not divide the world size."""
    check_sequence_degree(degree, info.world_size)
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh(info.device.type, (info.world_size // degree, degree),
                            mesh_dim_names=("data", "sequence"))
    sequence = SequenceParallel(group=mesh.get_group("sequence"), degree=degree,
                                rank=mesh.get_local_rank("sequence"))
    data = dataclasses.replace(info, rank=mesh.get_local_rank("data"), world_size=info.world_size // degree,
                               group=mesh.get_group("data"), sequence_rank=sequence.rank)
    return sequence, data
