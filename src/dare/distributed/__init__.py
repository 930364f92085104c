"""torch.distributed helpers: process group from torchrun, FSDP2 wrapping, collectives on metric dicts.

Run multi-process training with ``torchrun --nproc_per_node N -m dare.cli train CONFIG``; sequence parallelism
(``distributed.sequence_parallel``) lives in :mod:`dare.distributed.sequence`. Without torchrun
everything degrades to a single process (no process group, no sharding).

Randomness is rank-independent by construction: corruption noise comes from per-example generators
(:func:`dare.diffusion.example_generator`) and the data order from the step, never from the rank.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from dare.errors import ConfigError


@dataclass(frozen=True)
class DistInfo:
    """Where this process stands: rank, world size, device, whether a process group exists.

    With sequence parallelism the trainer also holds a *data-parallel view* of it
    (:func:`dare.distributed.sequence.build_sequence_parallel`): ``rank`` / ``world_size`` count data-parallel
    groups, ``group`` is the data dimension's process group (collectives of :func:`all_reduce_dict` run there) and
    ``sequence_rank`` the rank inside the sequence group.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    backend: str | None = None
    group: object = None
    """Process group of the collectives in this module (None: the whole world)."""
    sequence_rank: int = 0
    """Rank inside the sequence-parallel group (0 without sequence parallelism)."""

    @property
    def initialized(self) -> bool:
        return self.backend is not None

    @property
    def is_main(self) -> bool:
        return self.rank == 0 and self.sequence_rank == 0


def launched_by_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
"""Marks of gloo's error when a collective's peer process is gone (it raises a plain RuntimeError)."""


def lost_peer(err: BaseException) -> str | None:
    """The one-line message for ``err`` when it is a collective that failed under torchrun, which is how a rank
    learns that another one stopped (its own error, printed by that rank, says why); None for anything else."""
    if not launched_by_torchrun():
        return None
    failed = isinstance(err, dist.DistError) or (
        isinstance(err, RuntimeError) and any(mark in str(err) for mark in PEER_LOST))
    if not failed:
        return None
    first = (str(err).strip().splitlines() or [""])[0][:200]
    return (f"rank {os.environ.get('RANK', '?')}: a collective failed, most likely because another process of this "
            f"torchrun launch stopped first (its error is above) ({type(err).__name__}: {first})")


def training_device(device: str = "auto") -> str:
    """``cuda`` or ``cpu``: what ``distributed.device`` trains on (``auto``: CUDA when available); ``cuda`` without
    CUDA is a one-line error. :func:`init_distributed` and ``dare train --dry-run`` both ask it."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("distributed.device=cuda but no CUDA device is available")
    return device


def check_backend(backend: str, device: str) -> None:
    """One-line error for ``distributed.backend`` that cannot run on ``device`` (``cpu`` / ``cuda``): NCCL needs
    CUDA tensors (and a torch built with it)."""
    if backend == "nccl" and (device != "cuda" or not dist.is_nccl_available()):
        why = "this torch has no NCCL" if device == "cuda" else "it runs on CUDA devices only"
        raise ConfigError(f"distributed.backend=nccl on {device}: {why}; use distributed.backend=auto (gloo on the "
                          "CPU, NCCL on CUDA)")


def init_distributed(backend: str = "auto", device: str = "auto", timeout_s: int = 1800) -> DistInfo:
    """Initialise the process group when launched by torchrun (NCCL on CUDA, gloo on CPU)."""
    device = training_device(device)
    if not launched_by_torchrun():
        return DistInfo(device=torch.device("cuda:0" if device == "cuda" else "cpu"))
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch_device = torch.device(f"cuda:{local_rank}" if device == "cuda" else "cpu")
    if device == "cuda":
        torch.cuda.set_device(torch_device)
    if backend == "auto":
        backend = "nccl" if device == "cuda" else "gloo"
    check_backend(backend, device)
    if not dist.is_initialized():
        kwargs = {"device_id": torch_device} if device == "cuda" else {}
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)
    return DistInfo(rank=rank, world_size=world, local_rank=local_rank, device=torch_device, backend=backend)


def shutdown(info: DistInfo) -> None:
    if info.initialized and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.initialized:
        dist.barrier()


def all_reduce_dict(values: dict[str, torch.Tensor], info: DistInfo, op: str = "sum") -> dict[str, torch.Tensor]:
    """Reduce a dict of tensors across ranks in one collective (float64 for exact counts).

    Values are usually scalars; a tensor of any shape (the same on every rank) is reduced elementwise.
    """
    if not values:
        return {}
    keys = sorted(values)
    tensors = [torch.as_tensor(values[k]).detach().to(torch.float64).cpu() for k in keys]
    flat = torch.cat([t.reshape(-1) for t in tensors])
    if info.initialized:
        flat = flat.to(info.device) if info.backend == "nccl" else flat
        dist.all_reduce(flat, op=dist.ReduceOp.SUM if op == "sum" else dist.ReduceOp.MAX, group=info.group)
        flat = flat.cpu()
    out, offset = {}, 0
    for key, t in zip(keys, tensors):
        out[key] = flat[offset:offset + t.numel()].reshape(t.shape)
        offset += t.numel()
    return out


def all_reduce_max_int(value: int, info: DistInfo) -> int:
    return int(all_reduce_dict({"v": torch.tensor(float(value))}, info, op="max")["v"])


def all_gather_objects(value, info: DistInfo) -> list:
    """``value`` (any picklable object, e.g. CPU tensors) of every rank, in rank order (``[value]`` without a
    process group)."""
    if not info.initialized:
        return [value]
    out = [None] * info.world_size
    dist.all_gather_object(out, value)
    return out


def _param_groups(state) -> list:
    """The FSDP parameter groups of an FSDP2 state: a list since torch 2.12 (``_fsdp_param_groups``), a single
    optional group before (``_fsdp_param_group``)."""
    if hasattr(state, "_fsdp_param_groups"):
        return list(state._fsdp_param_groups)
    group = getattr(state, "_fsdp_param_group", None)
    return [] if group is None else [group]


def gathered_parameters(model):
    """Context manager: hold every FSDP2 module of ``model`` unsharded (one all-gather each, on entry) so that
    forwards inside issue no collectives - e.g. rollouts whose number of forwards differs between ranks.
    Parameters are resharded on exit. A no-op for unsharded models."""
    import contextlib

    from torch.distributed.fsdp import FSDPModule

    modules = [m for m in model.modules() if isinstance(m, FSDPModule)]
    if not modules:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def gathered():
        # FSDP2 initialises lazily on the first forward, which marks the root "not resharded after forward".
        # Do it now: saving and restoring the settings around a first forward (an RL run's first rollout)
        # would otherwise undo that, and the root's parameters (LM head) would be sharded after every forward.
        modules[0]._get_fsdp_state()._lazy_init()
        states = [m._get_fsdp_state() for m in modules]
        saved = [[g.post_forward_mesh_info for g in _param_groups(st)] for st in states]
        auto = [getattr(st, "_auto_reshard_after_forward", None) for st in states]
        modules[0].set_reshard_after_forward(False, recurse=True)
        for module in modules:
            module.unshard()
        try:
            yield model
        finally:
            for st, infos, flag in zip(states, saved, auto):
                if flag is not None:
                    st._auto_reshard_after_forward = flag
                for group, info in zip(_param_groups(st), infos):
                    group.post_forward_mesh_info = info
            for module in modules:
                module.reshard()

    return gathered()


def mixed_precision_policy(name: str, device: torch.device):
    """FSDP2 ``MixedPrecisionPolicy``: bf16 params / fp32 reduce on CUDA (``auto``), none on CPU."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if name == "auto":
        name = "bf16" if device.type == "cuda" else "fp32"
    if name == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def apply_fsdp(model, blocks, info: DistInfo, mixed_precision: str = "auto", reshard_after_forward: bool = True):
    """FSDP2: ``fully_shard`` every transformer block, then the root; gradients are **summed** across ranks.

    ``reshard_after_forward`` applies to the blocks; the root is never resharded after forward (see below).

    The trainer's losses are already normalised by global-batch counts, so the default division of the
    reduced gradient by the world size is switched off (``set_gradient_divide_factor(1)`` with plain SUM
    collectives, which gloo supports too).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, fully_shard

    mesh = init_device_mesh(info.device.type, (info.world_size,))
    policy = mixed_precision_policy(mixed_precision, info.device)
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    # The root (embedding, final norm, LM head) keeps FSDP2's default: gathered from forward until its
    # post-backward. Losses apply ``model.head`` to the returned hidden states after forward (chunked
    # log-probs, dare.algorithms.logprobs); resharding the root after forward would leave them a sharded head.
    fully_shard(model, mesh=mesh, mp_policy=policy)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)
    return model


def autocast_context(name: str, device: torch.device):
    """bf16 autocast for unsharded single-process CUDA runs (FSDP handles precision itself)."""
    import contextlib

    if device.type == "cuda" and name in ("auto", "bf16"):
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return contextlib.nullcontext()
