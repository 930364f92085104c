"""What every static decoder keeps between steps (:class:`StaticState`)."""

from __future__ import annotations

import torch

from dare.models.spec import family_of
from dare.rollout.engine.graphs import HostFlag, StepRunner
from dare.rollout.engine.noise import row_keys


class StaticState:
    """The model and its family's token ids, per-row step counters and random keys, the device scalars a step
    reads or writes (block start, forward count, the host flag) and the graph runner of one
    (batch bucket, prompt width, config) shape. Subclasses add their canvas and step functions."""

    def __init__(self, model, config, *, batch: int, device, use_graphs: bool, backend: str):
        self.model, self.config, self.device, self.backend = model, config, device, backend
        self.tok = family_of(model).token_ids(model.config)
        self.batch, self.gen, self.lb = batch, config.gen_length, config.block_length
        long = dict(dtype=torch.long, device=device)
        self.num_steps = torch.zeros(batch, **long)
        self.alive = torch.zeros(batch, dtype=torch.bool, device=device)
        self.keys = torch.zeros((batch, 2), **long)
        self.nfe = torch.zeros((), **long)
        self.more = torch.zeros((), **long)
        self.start = torch.zeros((), **long)
        self.stop_ids = torch.tensor(self.tok.stop_ids, **long)
        self.block_range = torch.arange(self.lb, **long)
        self.runner = StepRunner(model, device, use_graphs)
        self.flag = HostFlag(device)

    def reset_rows(self, rows: int, seeds: list[int]) -> torch.Tensor:
        """Zero the counters and key the random streams of a new batch; returns ``[batch]`` bool, the real rows
        (the rest are inactive fillers of the bucket)."""
        self.num_steps.zero_()
        self.nfe.zero_()
        self.keys.copy_(row_keys(seeds + [0] * (self.batch - rows), self.device))
        return torch.arange(self.batch, device=self.device) < rows
