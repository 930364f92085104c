"""Per-step records of a static rollout, written on the device into preallocated ``[B, S + 1, G]`` buffers.

Row ``b``'s step ``s`` goes to slot ``s``; rows that do not take a step write to the spare last slot, so a step
never needs the host to know which rows took it. :meth:`StaticTrajectory.build` returns the same
:class:`~dare.rollout.output.Trajectory` as the eager recorder.
"""

from __future__ import annotations

import torch

from dare.rollout.output import Trajectory

FIELDS = ("states", "predictions", "confidences", "logprobs", "candidates", "transfers")


class StaticTrajectory:
    def __init__(self, batch: int, gen_length: int, max_steps: int, mask_id: int, device):
        self.max_steps, self.mask_id = max_steps, mask_id
        shape = (batch, max_steps + 1, gen_length)
        dtypes = (torch.long, torch.long, torch.float32, torch.float32, torch.bool, torch.bool)
        self.buffers = {name: torch.zeros(shape, dtype=dtype, device=device) for name, dtype in zip(FIELDS, dtypes)}
        self.rows = torch.arange(batch, device=device)

    def reset(self) -> None:
        for name, buffer in self.buffers.items():
            buffer.fill_(self.mask_id if name in ("states", "predictions") else 0)

    def record(self, taking: torch.Tensor, steps: torch.Tensor, **values: torch.Tensor) -> None:
        """Store ``values`` (each ``[B, G]``, keyed by :data:`FIELDS`) as step ``steps[b]`` of the rows ``taking``."""
        slot = torch.where(taking, steps, torch.full_like(steps, self.max_steps)).clamp(max=self.max_steps)
        for name in FIELDS:
            self.buffers[name].index_put_((self.rows, slot), values[name].to(self.buffers[name].dtype))

    def build(self, rows: int, num_steps: torch.Tensor) -> Trajectory:
        length = min(max(int(num_steps.max()) if num_steps.numel() else 0, 1), self.max_steps)
        parts = {name: buffer[:rows, :length].clone() for name, buffer in self.buffers.items()}
        step_mask = torch.arange(length, device=num_steps.device)[None, :] < num_steps[:rows, None]
        return Trajectory(**parts, step_mask=step_mask)
