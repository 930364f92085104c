"""Preference-pair batches (DPO / VRPO): :class:`PairSource` reads pairs, keeps pairs whole in micro-batches
(rows ``2i`` chosen, ``2i+1`` rejected), builds the algorithm's stored views and the reference estimates on
them (``prepares_views = True``). Batches are a pure function of the step (like ``DatasetSource``)."""

from __future__ import annotations

import contextlib

import torch
from tensordict import TensorDict

from dare.trainer.prompts import PairItem
from dare.data.sft import Example, collate_padded
from dare.distributed import DistInfo
from dare.errors import ConfigError
from dare.trainer.workflow import Reference, prepare_micro_batches


class PairSource:
    """``batch_size`` pairs per optimizer step over all ranks, ``micro_batch_size`` pairs per micro-batch."""

    prepares_views = True
    precision = staticmethod(contextlib.nullcontext)
    """Context of old / reference forwards (the trainer sets its autocast)."""

    def __init__(self, pairs: list[PairItem], *, algorithm, policy, reference: Reference | None, batch_size: int,
                 micro_batch_size: int, eos_id: int, pad_id: int, info: DistInfo | None = None, seed: int = 0,
                 shuffle: bool = True):
        self.info = info or DistInfo()
        if batch_size % self.info.world_size:
            raise ConfigError(f"trainer.batch_size={batch_size} (pairs) must be divisible by the number of processes "
                              f"({self.info.world_size})")
        self.steps_per_epoch = len(pairs) // batch_size
        if self.steps_per_epoch == 0:
            raise ConfigError(f"trainer.batch_size={batch_size} is larger than the dataset ({len(pairs)} pairs)")
        self.pairs, self.algorithm, self.policy, self.reference = pairs, algorithm, policy, reference
        self.batch_size, self.micro_batch_size = batch_size, micro_batch_size
        self.eos_id, self.pad_id, self.seed, self.shuffle = eos_id, pad_id, seed, shuffle

    def global_indices(self, step: int) -> list[int]:
        epoch, position = divmod(step, self.steps_per_epoch)
        n = len(self.pairs)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        order = torch.randperm(n, generator=gen).tolist() if self.shuffle else list(range(n))
        return order[position * self.batch_size:(position + 1) * self.batch_size]

    @staticmethod
    def examples(pair: PairItem) -> list[Example]:
        """The chosen and rejected rows of a pair (example indices ``2i`` and ``2i + 1``)."""
        return [Example(pair.prompt + pair.chosen, len(pair.prompt), 2 * pair.index),
                Example(pair.prompt + pair.rejected, len(pair.prompt), 2 * pair.index + 1)]

    def batch(self, step: int) -> list[TensorDict]:
        indices = self.global_indices(step)
        width = max(len(e) for i in indices for e in self.examples(self.pairs[i]))
        share = self.batch_size // self.info.world_size
        mine = indices[self.info.rank * share:(self.info.rank + 1) * share]
        device = next(self.policy.parameters()).device
        micro = []
        for lo in range(0, len(mine), self.micro_batch_size):
            rows = [e for i in mine[lo:lo + self.micro_batch_size] for e in self.examples(self.pairs[i])]
            micro.append(collate_padded(rows, width, self.eos_id, self.pad_id, eos_padding=False))
        return prepare_micro_batches(self.algorithm, micro, [step] * len(micro), self.policy, self.reference, device,
                                     self.precision)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def build_pair_source(trainer) -> PairSource:
    from dare.trainer.prompts import build_pairs

    cfg = trainer.config
    pairs, dropped = build_pairs(cfg.data, trainer.tokenizer, trainer.token_ids.eos, cfg.trainer.seed)
    if dropped and trainer.info.is_main:
        import logging

        logging.getLogger("dare.trainer").warning(
            f"warning: dropped {dropped} of {dropped + len(pairs)} pairs longer than data.max_length={cfg.data.max_length}")
    return PairSource(pairs, algorithm=trainer.algorithm, policy=trainer.model, reference=trainer.reference,
                      batch_size=cfg.trainer.batch_size, micro_batch_size=cfg.trainer.micro_batch_size,
                      eos_id=trainer.token_ids.eos, pad_id=trainer.token_ids.pad, info=trainer.data_info,
                      seed=cfg.trainer.seed, shuffle=cfg.data.shuffle)


__all__ = ["PairSource", "build_pair_source"]
