"""Resumable checkpoints: model + optimizer (torch.distributed.checkpoint, sharded under FSDP2),
scheduler, step and per-rank RNG states; written atomically (``step_N.tmp`` renamed when complete).

Layout: ``output_dir/checkpoints/step_00000012/{.metadata, *.distcp, trainer_state.pt, rng_rank0.pt, ...}``.
The data position needs no state: batches are a pure function of the step (see ``DatasetSource``).
"""

from __future__ import annotations

import contextlib
import random
import shutil
import warnings
from pathlib import Path

import torch

from dare.distributed import DistInfo, barrier
from dare.errors import ConfigError

STATE_FILE = "trainer_state.pt"
# DCP warns when it runs without a process group (single-process runs); that is intended.
SINGLE_PROCESS_WARNING = ".*torch.distributed is disabled.*"


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _state_dicts(model, optimizer, trainable_only: bool):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    # a LoRA run saves only its trainable parameters, so loading them back must not ask for the frozen base ones
    options = StateDictOptions(ignore_frozen_params=trainable_only, strict=not trainable_only)
    model_sd, optim_sd = get_state_dict(model, optimizer, options=options)
    return {"model": model_sd, "optim": optim_sd}, options


def checkpoint_dir(output_dir: str | Path, step: int) -> Path:
    return Path(output_dir) / "checkpoints" / f"step_{step:08d}"


def _auxiliary_state(state: dict, auxiliary: dict | None) -> dict:
    """Add ``<name>_model`` / ``<name>_optim`` entries of the algorithm's auxiliary models (e.g. a value model)."""
    for name, (module, optimizer) in (auxiliary or {}).items():
        aux, _ = _state_dicts(module, optimizer, False)
        state[f"{name}_model"], state[f"{name}_optim"] = aux["model"], aux["optim"]
    return state


@contextlib.contextmanager
def interrupts_unwrapped():
    """Re-raise a Ctrl-C inside ``torch.distributed.checkpoint`` as the ``KeyboardInterrupt`` it was: dcp wraps a
    rank's exception (KeyboardInterrupt included) in a ``CheckpointException`` whose message is its traceback, which
    the CLI's one-line ``interrupted`` would not catch."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as err:
        failures = getattr(err, "failures", None) or {}
        if any(isinstance(pair[0] if isinstance(pair, tuple) else pair, KeyboardInterrupt)
               for pair in failures.values()):
            raise KeyboardInterrupt from None
        raise


def save_checkpoint(output_dir, step: int, model, optimizer, scheduler, info: DistInfo, *,
                    trainable_only: bool = False, keep_last: int = 2, extra: dict | None = None,
                    rank_state: dict | None = None, auxiliary: dict | None = None) -> Path:
    """Write a complete checkpoint for ``step`` (collective: every rank calls it).

    ``extra`` is stored once (rank 0) in the trainer state; ``rank_state`` per rank (e.g. an RL source's cached
    rollouts, which differ between ranks); ``auxiliary`` maps names to ``(module, optimizer)`` of models trained
    alongside the policy (stored in the same sharded checkpoint)."""
    import torch.distributed.checkpoint as dcp

    final = checkpoint_dir(output_dir, step)
    tmp = final.with_name(final.name + ".tmp")
    if info.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    barrier(info)
    state, _ = _state_dicts(model, optimizer, trainable_only)
    state = _auxiliary_state(state, auxiliary)
    with warnings.catch_warnings(), interrupts_unwrapped():
        warnings.filterwarnings("ignore", message=SINGLE_PROCESS_WARNING)
        dcp.save(state, checkpoint_id=str(tmp))
    torch.save(rng_state(), tmp / f"rng_rank{info.rank}.pt")
    if rank_state:
        torch.save(rank_state, tmp / f"state_rank{info.rank}.pt")
    if info.is_main:
        torch.save({"step": step, "scheduler": scheduler.state_dict(), "world_size": info.world_size,
                    **(extra or {})}, tmp / STATE_FILE)
    barrier(info)
    if info.is_main:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in list_checkpoints(output_dir)[:-keep_last] if keep_last > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
    barrier(info)
    return final


def list_checkpoints(output_dir) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    done = [p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp") and (p / STATE_FILE).is_file()]
    return sorted(done, key=lambda p: p.name)


def remove_partial_checkpoints(output_dir) -> list[Path]:
    """Delete ``step_N.tmp`` directories left by a run killed while writing a checkpoint."""
    root = Path(output_dir) / "checkpoints"
    partial = [p for p in root.glob("step_*.tmp") if p.is_dir()] if root.is_dir() else []
    for path in partial:
        shutil.rmtree(path, ignore_errors=True)
    return partial


def read_trainer_state(path) -> dict:
    """The trainer state of a complete checkpoint (``step``, ``scheduler``, ``world_size``, ``config``, ...)."""
    path = Path(path)
    if not (path / STATE_FILE).is_file():
        raise ConfigError(f"{path} is not a complete DARE checkpoint (no {STATE_FILE})")
    return torch.load(path / STATE_FILE, weights_only=False)


def saved_sequence_parallel(trainer_state: dict) -> int:
    """The ``distributed.sequence_parallel`` degree of the run that wrote a checkpoint (its trainer state's
    ``config``; 1 when it records none)."""
    distributed = (trainer_state.get("config") or {}).get("distributed") or {}
    return int(distributed.get("sequence_parallel", 1) or 1)


def load_checkpoint(path, model, optimizer, scheduler, info: DistInfo, *, trainable_only: bool = False,
                    auxiliary: dict | None = None, sequence_parallel: int = 1) -> dict:
    """Restore model, optimizer, scheduler, the ``auxiliary`` ``(module, optimizer)`` pairs and this rank's RNG;
    returns the trainer state (``step``, ...). The weights and optimizer state load under any layout
    (torch.distributed.checkpoint reshards them: another number of processes, ``sequence_parallel`` degree or
    expert-parallel degree); this rank's RNG and ``rank_state`` only when the ranks hold the data they held when
    saved: the same world size and ``sequence_parallel`` (the degree of the resuming run)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_state_dict

    path = Path(path)
    trainer_state = read_trainer_state(path)
    state, options = _state_dicts(model, optimizer, trainable_only)
    state = _auxiliary_state(state, auxiliary)
    with warnings.catch_warnings(), interrupts_unwrapped():
        warnings.filterwarnings("ignore", message=SINGLE_PROCESS_WARNING)
        dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"], options=options)
    for name, (module, aux_optimizer) in (auxiliary or {}).items():
        set_state_dict(module, aux_optimizer, model_state_dict=state[f"{name}_model"],
                       optim_state_dict=state[f"{name}_optim"])
    scheduler.load_state_dict(trainer_state["scheduler"])
    rng_file = path / f"rng_rank{info.rank}.pt"
    same_world = (trainer_state.get("world_size") == info.world_size
                  and saved_sequence_parallel(trainer_state) == sequence_parallel)
    if rng_file.is_file() and same_world:
        set_rng_state(torch.load(rng_file, weights_only=False))
    rank_file = path / f"state_rank{info.rank}.pt"
    if rank_file.is_file() and same_world:
        trainer_state["rank_state"] = torch.load(rank_file, weights_only=False)
    return trainer_state
