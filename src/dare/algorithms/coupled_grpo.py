"""Coupled-GRPO (DiffuCoder, algorithms.md §4): a fully masked view plus a complementary pair.

Views per rollout (fresh for every optimizer step, stored for old / reference): ``z0`` masks the whole
completion region, ``z1`` masks ``C = {u < t}`` and ``z2`` its complement, ``t ~ U(t_low, t_high)`` (one
``t`` per rollout, see :func:`dare.diffusion.corrupt_complementary`); the prompt is never masked. Per token
``l_j = 1/2 [log p(y_j|z0) + (j in C ? log p(y_j|z1)/t : log p(y_j|z2)/(1-t))]`` feeds the token-level
clipped surrogate and the k3 KL; loss ``sum m l / sum m`` over the global batch; leave-one-out advantages.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.algorithms.base import register_algorithm, settings_error
from dare.algorithms.functional import coupled_logp
from dare.algorithms.rl import PPOConfig, RLAlgorithm
from dare.diffusion import corrupt_complementary


@dataclass
class CoupledGRPOConfig(PPOConfig):
    name: str = "coupled_grpo"
    """Algorithm name."""
    advantage: str = "loo"
    """Group advantage (DiffuCoder: leave-one-out, no std scaling)."""
    inner_steps: int = 2
    """mu (DiffuCoder num_iterations)."""
    clip_low: float = 0.5
    """Ratio clip epsilon (low and high)."""
    kl_coef: float = 0.01
    """beta of the k3 KL to the reference."""
    t_low: float = 0.2
    """Lower end of the pair's masking ratio t."""
    t_high: float = 0.8
    """Upper end of the pair's masking ratio t."""

    def __post_init__(self):
        super().__post_init__()
        if not 0 < self.t_low <= self.t_high < 1:
            raise settings_error(self, "must satisfy 0 < t_low <= t_high < 1", "t_low", "t_high")


@register_algorithm
class CoupledGRPO(RLAlgorithm):
    name = "coupled_grpo"
    config_class = CoupledGRPOConfig

    def corrupt(self, batch: TensorDict, step: int) -> TensorDict:
        ids, generated, mask_id = batch["input_ids"], batch["generated"], self.token_ids.mask
        first, second = corrupt_complementary(ids, generated, batch["example_index"], mask_id, seed=self.seed,
                                              step=step, t_low=self.config.t_low, t_high=self.config.t_high)
        full = torch.where(generated, torch.full_like(ids, mask_id), ids)
        batch["noisy_ids"] = torch.stack([full, first.noisy_ids, second.noisy_ids], 1)
        batch["in_first"] = first.mask
        # one t per rollout: p_mask of the first view on any generated position
        batch["t"] = torch.where(generated, first.p_mask, torch.zeros_like(first.p_mask)).amax(-1)
        return batch

    def estimate(self, model, batch: TensorDict) -> TensorDict:
        completion, in_first = batch["completion_mask"], batch["in_first"]
        select = torch.stack([completion, completion & in_first, completion & ~in_first], 1)
        logp = self.logp(model, batch, batch["noisy_ids"], select)
        combined = coupled_logp(logp[:, 0], logp[:, 1], logp[:, 2], in_first, batch["t"][:, None])
        return TensorDict({"logp": torch.where(completion, combined, 0.0)}, batch_size=batch.batch_size)

    def loss(self, batch: TensorDict, estimates: TensorDict, totals):
        logp = estimates["logp"]
        weights = batch["completion_mask"].float() / totals["tokens"].clamp(min=1).float()
        loss, metrics = self.ppo_token_loss(logp, self.old_or_detached(batch, "logp", logp),
                                            batch["advantages"][:, None], weights, batch.get("ref_logp"))
        metrics["loss"] = loss.detach()
        return loss, metrics
