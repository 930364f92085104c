"""Dynamic sampling (DAPO, DiRL): keep only groups whose rewards differ, roll out more prompts until the step is full.

A group whose ``G`` rewards are all equal has zero advantage under every group baseline: it costs a backward and
gives no policy gradient (it only dilutes the loss normalisation). The rewards judged are those the advantages are
computed from (the algorithm's ``trained_rewards``, e.g. after TraceRL's ``truncated_reward``). With ``rollout.dynamic_sampling: true`` the
:class:`~dare.trainer.rl.RolloutSource` generates the step's ``P`` prompts as usual (round 0), drops the flat groups,
and runs extra rounds of ``P`` further prompts until ``P`` informative groups are collected or
``rollout.dynamic_extra_rounds`` extra rounds are spent. The step's batch is then the first ``P`` informative groups
in (round, group) order; when too few exist after the last round the remaining slots take the earliest flat groups
(zero advantage), so the batch size never changes. ``rollout/dynamic/dropped`` (flat groups generated and left
out), ``rollout/dynamic/extra_rounds``, ``rollout/dynamic/filled`` (flat groups admitted for lack of others) and
``rollout/dynamic/round0_reward`` (the mean reward of the step's own prompts, unfiltered) go into the step metrics.

Everything stays a pure function of the step, independent of the number of processes: the prompts of extra round
``k`` of rollout ``r`` are a permutation seeded by ``(seed, r, k)`` of the prompts not yet used in this rollout,
every candidate row samples from its own stream (its global row id in the round, offset by ``k`` x the rollouts per
round), the decision uses the rewards of all ranks, and the admitted groups are redistributed so that rank ``i``
holds the ``i``-th share of the global order. Admitted rows are renumbered ``0 .. N-1`` in that order (the example
ids of the corruption noise).

Deviations from DAPO (verl ``recipe/dapo``: generation batches are drawn from the data loader until the train batch
is full, an error after ``max_num_gen_batches``): extra prompts come from the seeded per-round permutation above
instead of the next loader batches (so a step never shifts the prompts of later steps and resume stays exact),
and when the round budget is spent the batch is topped up with flat groups instead of failing. Informative groups
beyond the batch are discarded, as in DAPO.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

COLUMN_FIELDS = ("input_ids", "attention_mask", "prompt_mask", "generated", "completion_mask", "example_index")
"""Rollout fields laid out over the ``[prompt ; completion]`` columns (widened on the left)."""
TRAJECTORY_FILL = {"traj_states": "mask", "traj_predictions": "mask"}
"""Trajectory fields padded with the mask id along the step axis (the others with 0 / False)."""


def flat_groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[N / G]`` bool: groups of ``group_size`` consecutive rollouts whose rewards are all equal."""
    groups = rewards.reshape(-1, group_size)
    return groups.amax(1) == groups.amin(1)


def extra_prompts(num_prompts: int, used: set[int], count: int, *, seed: int, rollout: int, round_: int) -> list[int]:
    """Dataset indices of the ``count`` prompts of extra round ``round_`` of rollout ``rollout``: a seeded permutation
    of the prompts not used yet in this rollout (all prompts once those run out)."""
    order = torch.randperm(num_prompts, generator=torch.Generator().manual_seed(
        (seed * 1_000_003 + rollout) * 1_009 + round_)).tolist()
    fresh = [i for i in order if i not in used]
    return (fresh if len(fresh) >= count else order)[:count]


def admit(flat: list[torch.Tensor], need: int) -> tuple[list[tuple[int, int]], int]:
    """``(admitted (round, group) keys in global order, number of flat groups among them)``: the first ``need``
    informative groups over the rounds' ``flat [P]`` flags, topped up with the earliest flat groups."""
    keys = [(r, g) for r, flags in enumerate(flat) for g in range(flags.numel())]
    informative = [key for key in keys if not bool(flat[key[0]][key[1]])]
    chosen = informative[:need]
    filler = [key for key in keys if bool(flat[key[0]][key[1]])][:need - len(chosen)]
    order = {key: i for i, key in enumerate(keys)}
    return sorted(chosen + filler, key=order.__getitem__), len(filler)


def left_pad_columns(batch: TensorDict, width: int, pad_id: int) -> TensorDict:
    """``batch`` widened to ``width`` columns by padding on the left (prompt side): pad ids, no attention, no
    prompt / completion / generated flags, example index -1."""
    extra = width - batch["input_ids"].shape[1]
    if extra == 0:
        return batch
    rows = batch.batch_size[0]
    fill = {"input_ids": pad_id, "example_index": -1}
    out = {}
    for key, value in batch.items():
        if key in COLUMN_FIELDS:
            pad = torch.full((rows, extra, *value.shape[2:]), fill.get(key, 0), dtype=value.dtype)
            value = torch.cat([pad, value], 1)
        out[key] = value
    return TensorDict(out, batch_size=[rows])


def _pad_steps(batch: TensorDict, steps: int, mask_id: int) -> TensorDict:
    """Trajectory fields padded to ``steps`` steps (mask id for states / predictions, 0 / False otherwise)."""
    if "traj_step_mask" not in batch.keys() or batch["traj_step_mask"].shape[1] == steps:
        return batch
    extra = steps - batch["traj_step_mask"].shape[1]
    for key in [k for k in batch.keys() if k.startswith("traj_")]:
        value = batch[key]
        fill = mask_id if TRAJECTORY_FILL.get(key) == "mask" else 0
        pad = torch.full((value.shape[0], extra, *value.shape[2:]), fill, dtype=value.dtype)
        batch[key] = torch.cat([value, pad], 1)
    return batch


def concat_rows(parts: list[TensorDict], pad_id: int, mask_id: int) -> TensorDict:
    """Row-concatenate rollout batches of different prompt widths (and trajectory lengths)."""
    width = max(p["input_ids"].shape[1] for p in parts)
    steps = max((p["traj_step_mask"].shape[1] for p in parts if "traj_step_mask" in p.keys()), default=0)
    parts = [_pad_steps(left_pad_columns(p, width, pad_id), steps, mask_id) for p in parts]
    return torch.cat(parts, 0)


def renumber(batch: TensorDict, first: int) -> TensorDict:
    """Rows get the global ids ``first, first + 1, ...`` (``rollout_index`` and ``example_index``)."""
    ids = torch.arange(first, first + batch.batch_size[0], dtype=torch.long)
    batch["rollout_index"] = ids
    batch["example_index"] = torch.where(batch["attention_mask"].bool(), ids[:, None], -1)
    return batch


__all__ = ["admit", "concat_rows", "extra_prompts", "flat_groups", "left_pad_columns", "renumber"]
