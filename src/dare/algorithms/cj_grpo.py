"""CJ-GRPO, consistency-trajectory GRPO (algorithms.md §6): exact per-step conditionals along the rollout.

Masked diffusion (full attention): the rollout records every step's state ``x_s`` and the set ``U_s`` of
positions it committed (the ``U_s`` partition the decoded completion). Step ``s`` is one term: input
``[x ; x_s]``, targets the final tokens at ``U_s``, token-level clipped surrogate + k3 KL. Loss
``(1/T) sum_s [sum_{i, j in U_s} l_ij / sum_i |U_s,i|]`` with both sums over the global batch (``T`` = steps
with at least one token).

Block diffusion (SDAR, LLaDA2; yjyddq/DARE's block variant): the transitions are per (sample, block, local step),
read from the rollout's ``block_step_map`` (no trajectory is stored): the state of block ``b`` before its local
step ``k`` holds the tokens the block committed at local steps ``< k``. All blocks' ``k``-th local steps are
one ``[noisy ; clean]`` forward (block-parallel replay: block ``b`` of the noisy copy sees itself and the clean
earlier blocks, exactly the sampler's context), so a rollout costs ``block_steps`` forwards however long it
is. The terminal block is replayed with the tokens sampled after a mid-block stop (they stay in the states;
only tokens up to the first EOS are trained unless ``train_post_eos``). Tokens are averaged within each
transition, transitions within the sample, samples over the global batch
(:func:`~dare.algorithms.functional.transition_weights`).

Either way each term is its own forward and backward, so memory does not grow with the number of steps (the
upstream code keeps all T graphs).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.algorithms.base import Needs, register_algorithm
from dare.algorithms.functional import transition_weights
from dare.algorithms.rl import PPOConfig, RLAlgorithm, RolloutContext, TermwiseMixin, response_field


@dataclass
class CJGRPOConfig(PPOConfig):
    name: str = "cj_grpo"
    """Algorithm name."""
    advantage: str = "mean"
    """Group advantage (CJ-GRPO: mean-only; yjyddq/DARE: zscore)."""
    inner_steps: int = 12
    """mu."""
    clip_low: float = 0.5
    """Ratio clip epsilon (CJ-GRPO: 0.5; yjyddq/DARE: 0.2)."""
    kl_coef: float = 0.04
    """beta of the k3 KL to the reference."""
    train_post_eos: bool = False
    """Also train tokens decoded after the first EOS (the upstream code does; default: EOS-truncated)."""


def replay_views(batch: TensorDict, train_post_eos: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(noisy_ids [R, T, S], select [R, T, S])``: the recorded states and their committed sets ``U_s``."""
    ids, generated = batch["input_ids"], batch["generated"]
    states, transfers = batch["traj_states"], batch["traj_transfers"]
    rows, steps, _ = states.shape
    noisy = ids[:, None].repeat(1, steps, 1)
    select = torch.zeros_like(noisy, dtype=torch.bool)
    region = generated[:, None].expand_as(noisy)
    noisy[region] = states.reshape(-1)
    select[region] = transfers.reshape(-1)
    if not train_post_eos:
        select &= batch["completion_mask"][:, None]
    return noisy, select


def block_replay_views(batch: TensorDict, steps: int, mask_id: int, train_post_eos: bool):
    """Block-parallel replay views from ``block_step_map``: ``(noisy_ids [R, K, S], select [R, K, S])``.

    View ``k`` masks, in every block at once, the completion positions committed at local step ``>= k`` (and
    the never-decoded tail); ``select`` marks the positions committed at local step ``k``."""
    local = response_field(batch, batch["block_step_map"])  # -1 outside the completion / never decoded
    k = torch.arange(steps, device=local.device)[None, :, None]
    hidden = batch["generated"][:, None] & ((local[:, None] < 0) | (local[:, None] >= k))
    noisy = torch.where(hidden, torch.full_like(local, mask_id)[:, None], batch["input_ids"][:, None])
    trainable = (local >= 0) if train_post_eos else batch["completion_mask"] & (local >= 0)
    select = (local[:, None] == k) & trainable[:, None]
    return noisy, select


@register_algorithm
class CJGRPO(TermwiseMixin, RLAlgorithm):
    name = "cj_grpo"
    config_class = CJGRPOConfig
    needs = Needs(rollout=True, reward=True, trajectory=True)
    replays_steps = True

    def bind_model(self, model) -> None:
        super().bind_model(model)
        # block families replay from block_step_map; masked diffusion needs the recorded states
        self.needs = dataclasses.replace(self.needs, trajectory=self.blocks is None)

    def assign_advantages(self, batch: TensorDict, context: RolloutContext) -> TensorDict:
        batch = super().assign_advantages(batch, context)
        if self.blocks is not None:  # every rank replays the same number of local steps (FSDP collectives)
            local = batch["block_step_map"]
            steps = context.all_max(int(local.max()) + 1 if local.numel() else 1)
            batch["replay_terms"] = torch.full((batch.batch_size[0],), max(steps, 1), dtype=torch.long)
        return batch

    def corrupt(self, batch: TensorDict, step: int) -> TensorDict:
        if self.blocks is None:
            batch["noisy_ids"], batch["select"] = replay_views(batch, self.config.train_post_eos)
            return batch
        steps = int(batch["replay_terms"][0])
        noisy, select = block_replay_views(batch, steps, self.token_ids.mask, self.config.train_post_eos)
        batch["noisy_ids"], batch["select"] = noisy, select
        batch["cj_weight"] = transition_weights(select, self.block_ids(batch))
        return batch

    def totals(self, batch: TensorDict):
        out = super().totals(batch)
        if self.blocks is None:
            out["step_tokens"] = batch["select"].sum((0, 2)).to(torch.float64)
        return out

    def loss_term(self, batch: TensorDict, estimates: TensorDict, k: int, totals):
        logp = estimates["logp"]
        if self.blocks is None:
            step_tokens = totals["step_tokens"].float()
            active = (step_tokens > 0).sum().clamp(min=1)
            weights = batch["select"][:, k].float() / (step_tokens[k].clamp(min=1) * active)
        else:
            weights = batch["cj_weight"][:, k] / totals["sequences"].clamp(min=1).float()
        old = self.old_term(batch, "logp", k, logp)
        ref = self.term(batch, "ref_logp", k) if "ref_logp" in batch.keys() else None
        return self.ppo_token_loss(logp, old, batch["advantages"][:, None], weights, ref)
