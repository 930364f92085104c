"""wd1 (algorithms.md §3.2): weighted likelihood without ratio, on d1's one-step estimator.

With ``S_i = sum_j m_ij log p(y_ij)`` (token **sum**) and, inside each group, ``w+ = softmax(A)``,
``w- = softmax(-A)``: ``L = sum_i (w-_i - w+_i) S_i``, averaged over the groups of the global batch. The
weights depend only on the advantages, so they are computed once per rollout (``wd1_weight``) and the loss
is a plain per-row sum: micro-batches need not hold whole groups. Equal rewards give zero weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.algorithms.base import register_algorithm
from dare.algorithms.d1 import OneStepEstimator
from dare.algorithms.functional import group_advantages
from dare.algorithms.rl import GroupConfig, RLAlgorithm, RolloutContext
from dare.errors import ConfigError


@dataclass
class WD1Config(GroupConfig):
    name: str = "wd1"
    """Algorithm name."""
    advantage: str = "mean"
    """Group advantage fed to the softmax weights (wd1: mean-only)."""
    inner_steps: int = 12
    """mu: updates per rollout batch (no ratio, so no old log-probs are needed)."""
    p_mask_prompt: float = 0.15
    """Probability of masking each prompt token in the one-step estimator."""

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.p_mask_prompt < 1:
            raise ConfigError(f"algorithm.p_mask_prompt must be in [0, 1); got {self.p_mask_prompt}")


@register_algorithm
class WD1(OneStepEstimator, RLAlgorithm):
    name = "wd1"
    config_class = WD1Config
    uses_ratio = False

    @classmethod
    def group_baseline(cls, config) -> str:
        """Always relative to the group: its weights are softmaxes over the group's advantages."""
        return "its weights are softmaxes over the group's advantages"

    def assign_advantages(self, batch: TensorDict, context: RolloutContext) -> TensorDict:
        adv = group_advantages(batch["rewards"], context.group_size, self.config.advantage,
                               unbiased_std=not self.config.population_std)
        groups = adv.reshape(-1, context.group_size)
        weight = torch.softmax(-groups, dim=1) - torch.softmax(groups, dim=1)
        batch["advantages"] = adv
        batch["wd1_weight"] = weight.reshape(-1)
        return batch

    def totals(self, batch: TensorDict):
        out = super().totals(batch)
        out["groups"] = (1.0 / batch["group_size"].to(torch.float64)).sum()
        return out

    def loss(self, batch: TensorDict, estimates: TensorDict, totals):
        seq = estimates["logp"].sum(-1)  # zero outside the completion mask
        groups = totals["groups"].clamp(min=1).float()
        loss = (batch["wd1_weight"].float() * seq).sum() / groups
        return loss, {"loss": loss.detach(), "policy/seq_logp": seq.detach().sum() / totals["sequences"].float()}
