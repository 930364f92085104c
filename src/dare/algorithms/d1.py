"""d1 / diffu-GRPO (algorithms.md §3.1): one-step mean-field log-probs, token-level clipped GRPO, k3 KL.

Estimator: the whole completion is masked and every real prompt token is masked independently with
``p_mask_prompt``; one forward gives ``log p(y_j | [x~ ; M...M])`` at every completion position (no 1/t).
Loss ``sum_{i,j} m_ij [-min(rho A_i, clip(rho) A_i) + beta k3_ij] / sum m`` over the global batch, with
mean-only advantages by default. Each of the ``mu`` inner steps draws its own prompt mask (stored).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.algorithms.base import register_algorithm
from dare.algorithms.rl import STREAM_PROMPT, PPOConfig, RLAlgorithm
from dare.diffusion.forward import iid_mask
from dare.diffusion.noise import example_generator
from dare.errors import ConfigError


@dataclass
class D1Config(PPOConfig):
    name: str = "d1"
    """Algorithm name."""
    advantage: str = "mean"
    """Group advantage (d1: mean-only; yjyddq/DARE's port: zscore)."""
    inner_steps: int = 12
    """mu (d1 num_iterations)."""
    clip_low: float = 0.5
    """Ratio clip epsilon (d1: 0.5; yjyddq/DARE: 0.2)."""
    kl_coef: float = 0.04
    """beta of the k3 KL to the reference (d1: 0.04; yjyddq/DARE: 0)."""
    p_mask_prompt: float = 0.15
    """Probability of masking each prompt token in the one-step estimator."""

    def __post_init__(self):
        super().__post_init__()
        if not 0 <= self.p_mask_prompt < 1:
            raise ConfigError(f"algorithm.p_mask_prompt must be in [0, 1); got {self.p_mask_prompt}")


def one_step_views(batch: TensorDict, mask_id: int, *, seed: int, step: int, p_mask_prompt: float) -> torch.Tensor:
    """d1's corruption: every generated position masked, each real prompt token masked with ``p_mask_prompt``
    (per-rollout generator; draws follow the prompt's own tokens, so left padding never shifts them)."""
    noisy = batch["input_ids"].clone()
    noisy[batch["generated"]] = mask_id
    if p_mask_prompt > 0:
        prompt = batch["prompt_mask"].cpu()
        for row, index in enumerate(batch["rollout_index"].tolist()):
            positions = prompt[row].nonzero().squeeze(-1)
            gen = example_generator(seed, index, step, 0, STREAM_PROMPT)
            chosen = iid_mask(torch.ones(len(positions), dtype=torch.bool), p_mask_prompt, gen)
            noisy[row, positions[chosen].to(noisy.device)] = mask_id
    return noisy


class OneStepEstimator:
    """The corruption and likelihood hooks of d1's one-step estimator (shared by d1 and wd1): per-token
    log-probs of the completion from one forward of :func:`one_step_views`."""

    def corrupt(self, batch: TensorDict, step: int) -> TensorDict:
        batch["noisy_ids"] = one_step_views(batch, self.token_ids.mask, seed=self.seed, step=step,
                                            p_mask_prompt=self.config.p_mask_prompt)
        return batch

    def estimate(self, model, batch: TensorDict) -> TensorDict:
        logp = self.logp(model, batch, batch["noisy_ids"], batch["completion_mask"])
        return TensorDict({"logp": logp}, batch_size=batch.batch_size)


@register_algorithm
class D1(OneStepEstimator, RLAlgorithm):
    """diffu-GRPO with the one-step estimator (see the module docstring)."""

    name = "d1"
    config_class = D1Config

    def loss(self, batch: TensorDict, estimates: TensorDict, totals):
        logp = estimates["logp"]
        weights = batch["completion_mask"].float() / totals["tokens"].clamp(min=1).float()
        loss, metrics = self.ppo_token_loss(logp, self.old_or_detached(batch, "logp", logp),
                                            batch["advantages"][:, None], weights, batch.get("ref_logp"))
        metrics["loss"] = loss.detach()
        return loss, metrics
