"""CJ-GRPO, consistency-trajectory GRPO (algorithms.md §6): exact per-step conditionals along the rollout.

The rollout records every step's state ``x_s`` and the set ``U_s`` of positions it committed (the ``U_s``
partition the decoded completion). Step ``s`` is one term: input ``[x ; x_s]``, targets the final tokens at
``U_s``, token-level clipped surrogate + k3 KL. Loss ``(1/T) sum_s [sum_{i, j in U_s} l_ij / sum_i |U_s,i|]``
with both sums over the global batch (``T`` = steps with at least one token). One forward and one backward
per step, so memory does not grow with the number of steps (the upstream code keeps all T graphs).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.algorithms.base import Needs, register_algorithm
from dare.algorithms.rl import PPOConfig, RLAlgorithm, TermwiseMixin, forward_logp


@dataclass
class CJGRPOConfig(PPOConfig):
    name: str = "cj_grpo"
    """Algorithm name."""
    advantage: str = "mean"
    """Group advantage (CJ-GRPO: mean-only; DARE: zscore)."""
    inner_steps: int = 12
    """mu."""
    clip_low: float = 0.5
    """Ratio clip epsilon (CJ-GRPO: 0.5; DARE: 0.2)."""
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


@register_algorithm
class CJGRPO(TermwiseMixin, RLAlgorithm):
    name = "cj_grpo"
    config_class = CJGRPOConfig
    needs = Needs(rollout=True, reward=True, trajectory=True)

    def corrupt(self, batch: TensorDict, step: int) -> TensorDict:
        batch["noisy_ids"], batch["select"] = replay_views(batch, self.config.train_post_eos)
        return batch

    def totals(self, batch: TensorDict):
        out = super().totals(batch)
        out["step_tokens"] = batch["select"].sum((0, 2)).to(torch.float64)
        return out

    def num_terms(self, batch: TensorDict) -> int:
        return batch["noisy_ids"].shape[1]

    def estimate_term(self, model, batch: TensorDict, k: int) -> TensorDict:
        logp = forward_logp(model, batch, batch["noisy_ids"][:, k], batch["select"][:, k], **self.forward_options)
        return TensorDict({"logp": logp}, batch_size=batch.batch_size)

    def loss_term(self, batch: TensorDict, estimates: TensorDict, k: int, totals):
        logp = estimates["logp"]
        step_tokens = totals["step_tokens"].float()
        active = (step_tokens > 0).sum().clamp(min=1)
        weights = batch["select"][:, k].float() / (step_tokens[k].clamp(min=1) * active)
        old = self.term(batch, "old_logp", k) if "old_logp" in batch.keys() else logp.detach()
        ref = self.term(batch, "ref_logp", k) if "ref_logp" in batch.keys() else None
        return self.ppo_token_loss(logp, old, batch["advantages"][:, None], weights, ref)
