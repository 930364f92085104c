"""Batch sources: where the trainer's batches come from (the pluggable front of the loop).

A source returns, for an optimizer step, **this rank's** micro-batches (a list of ``TensorDict``). It must be
a pure function of the step (or keep its own resumable state) so that resume and the split over ranks
and micro-batches never change what the global batch is. SFT reads a dataset (:class:`DatasetSource`);
RL sources (rollout -> reward -> advantages) implement the same protocol.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

import torch
from tensordict import TensorDict

from dare.data.sft import Example, collate_packed, collate_padded, pack
from dare.errors import ConfigError


class BatchSource(Protocol):
    steps_per_epoch: int

    def batch(self, step: int) -> list[TensorDict]:
        """This rank's micro-batches of the global batch of optimizer step ``step``."""

    def state_dict(self) -> dict:
        """Extra state to checkpoint (stateless sources return ``{}``)."""

    def load_state_dict(self, state: dict) -> None: ...


MISSING_KEY = re.compile(r'key "([^"]+)" not found in TensorDict')
"""TensorDict's message for a missing key."""


def missing_key(err: KeyError) -> str | None:
    """The key a TensorDict's ``KeyError`` names (None for other key errors)."""
    found = MISSING_KEY.search(str(err.args[0]) if err.args else "")
    return found.group(1) if found else None


@contextmanager
def batch_keys_read_by(algorithm: str, micro_batches: list[TensorDict]) -> Iterator[None]:
    """Turn a TensorDict ``KeyError`` for a key that the source's micro-batches lack into a one-line error naming it,
    ``algorithm`` (which reads it) and the keys they hold: a custom batch source (``Trainer(source=...)``) that
    leaves one out ended in a TensorDict traceback."""
    try:
        yield
    except KeyError as err:
        key = missing_key(err)
        if key is None or not micro_batches or key in micro_batches[0].keys():
            raise
        held = ", ".join(sorted(micro_batches[0].keys())) or "nothing"
        raise ConfigError(f"algorithm '{algorithm}' reads '{key}' from each micro-batch, but the batch source's "
                          f"micro-batches hold only {held} (the built-in sources show what each algorithm needs: "
                          "DatasetSource, PairSource, RolloutSource)") from None


class DatasetSource:
    """Global batches of ``batch_size`` examples in a per-epoch shuffled order, split over ranks.

    Step ``s`` uses positions ``[p * B, (p + 1) * B)`` of epoch ``s // steps_per_epoch``'s permutation
    (seeded by ``seed`` and the epoch); rank ``r`` of ``W`` takes the ``r``-th contiguous ``B / W`` slice and
    splits it into micro-batches: padded rows (``micro_batch_size`` each; all rows of a step padded to the
    global batch's longest example) or packed ``[1, T]`` rows. ``fixed_width`` gives every row exactly that many
    tokens (fixed shapes, e.g. for compiled flex attention): padded rows are right-padded to it, packed rows filled
    with a trailing filler document (:func:`~dare.data.sft.collate_packed`; it must be >= ``pack_length``).
    """

    def __init__(self, examples: list[Example], *, batch_size: int, micro_batch_size: int, rank: int = 0,
                 world_size: int = 1, seed: int = 0, shuffle: bool = True, packing: bool = False,
                 pack_length: int | None = None, eos_id: int, pad_id: int, eos_padding: bool = True,
                 fixed_width: int | None = None):
        if batch_size % world_size:
            raise ConfigError(f"trainer.batch_size={batch_size} must be divisible by the number of processes ({world_size})")
        self.examples = examples
        self.batch_size, self.micro_batch_size = batch_size, micro_batch_size
        self.rank, self.world_size = rank, world_size
        self.seed, self.shuffle = seed, shuffle
        self.packing, self.pack_length = packing, pack_length
        self.eos_id, self.pad_id, self.eos_padding = eos_id, pad_id, eos_padding
        self.fixed_width = fixed_width
        if fixed_width is not None:
            needed = pack_length if packing else max((len(ex) for ex in examples), default=0)
            if needed is not None and needed > fixed_width:
                raise ConfigError(f"fixed_width={fixed_width} is shorter than a row ({needed} tokens)")
        self.steps_per_epoch = len(examples) // batch_size
        if self.steps_per_epoch == 0:
            raise ConfigError(f"trainer.batch_size={batch_size} is larger than the dataset ({len(examples)} examples)")
        self._order_cache: tuple[int, list[int]] | None = None

    def _order(self, epoch: int) -> list[int]:
        if self._order_cache is None or self._order_cache[0] != epoch:
            n = len(self.examples)
            if self.shuffle:
                gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
                order = torch.randperm(n, generator=gen).tolist()
            else:
                order = list(range(n))
            self._order_cache = (epoch, order)
        return self._order_cache[1]

    def global_indices(self, step: int) -> list[int]:
        epoch, position = divmod(step, self.steps_per_epoch)
        return self._order(epoch)[position * self.batch_size:(position + 1) * self.batch_size]

    def epoch(self, step: int) -> float:
        return step / self.steps_per_epoch

    def batch(self, step: int) -> list[TensorDict]:
        indices = self.global_indices(step)
        share = self.batch_size // self.world_size
        mine = [self.examples[i] for i in indices[self.rank * share:(self.rank + 1) * share]]
        if self.packing:
            return [collate_packed(row, self.fixed_width, self.pad_id) for row in pack(mine, self.pack_length)]
        width = self.fixed_width or max(len(self.examples[i]) for i in indices)  # global: the split never changes it
        return [collate_padded(mine[i:i + self.micro_batch_size], width, self.eos_id, self.pad_id, self.eos_padding)
                for i in range(0, len(mine), self.micro_batch_size)]

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass
