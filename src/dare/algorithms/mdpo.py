"""MDPO, Masked Diffusion Policy Optimization (algorithms.md §5): step-level advantages from the rewards of
every denoising step's prediction, trained on the K most informative steps.

At rollout the prediction ``x0_s`` of every step (masked positions filled with the step's proposals) is
decoded and scored, ``r_s [N, T]`` (steps after a row stopped keep its final reward); ``A_s`` =
:func:`~dare.algorithms.functional.mdpo_step_advantages`; the ``K = train_steps`` steps with the largest
``sum_batch |A_s|`` (over all ranks) are kept. Step ``s`` is one term: input ``[x ; x_s]``, targets ``x0_s`` at
the positions ``M_s`` it proposed for, logits divided by the rollout temperature, confidence weights ``c``:
``L_s = sum_{j in M_s} c_j [lambda_s (-min(rho A_s, clip(rho) A_s)) + beta KL_j] / |M_s|``,
``lambda_s = L / (|M_s| + 1e-4)`` (``L`` = generation length, KL k2 by default; as in the reference the confidence
weights the KL too, lambda does not; ``c = 1`` with ``confidence_weight: false``); averaged over rollouts and
selected steps. Note: ``c`` is the sampler's selection score (the token probability for ``prob`` confidence,
LLaDA's default).

Deviation: ``M_s`` holds the candidates the sampler scored at step ``s``, i.e. the masked positions of the
**current block** only, where the reference trains every masked position of ``x_s``; the two agree when
``block_length == gen_length`` (one block, the MDPO paper's setting).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.algorithms.base import Needs, register_algorithm
from dare.algorithms.functional import clipped_surrogate, kl_estimate, mdpo_step_advantages, top_advantage_steps
from dare.algorithms.rl import PPOConfig, RLAlgorithm, RolloutContext, TermwiseMixin
from dare.errors import ConfigError


@dataclass
class MDPOConfig(PPOConfig):
    name: str = "mdpo"
    """Algorithm name."""
    advantage: str = "zscore"
    """Unused: MDPO's step advantages are z-scored per step across the group (+1e-4)."""
    clip_low: float = 0.2
    """Ratio clip epsilon."""
    kl_coef: float = 0.02
    """beta of the KL to the reference."""
    kl_estimator: str = "k2"
    """KL estimator (MDPO: k2 = half squared log ratio)."""
    train_steps: int = 8
    """K: denoising steps trained per rollout (largest sum |A_s| over the batch)."""
    divide_by_temperature: bool = True
    """Divide the training logits by the rollout temperature (as MDPO does)."""
    confidence_weight: bool = True
    """Weight each token's term (surrogate and KL) by the confidence it was proposed with."""

    def __post_init__(self):
        super().__post_init__()
        if self.train_steps < 1:
            raise ConfigError(f"algorithm.train_steps must be >= 1; got {self.train_steps}")


@register_algorithm
class MDPO(TermwiseMixin, RLAlgorithm):
    name = "mdpo"
    config_class = MDPOConfig
    needs = Needs(rollout=True, reward=True, trajectory=True)
    advantage_dims = 2  # one per rollout and trained step

    @classmethod
    def group_baseline(cls, config) -> str:
        """Always relative to the group: its per-step advantages are z-scores across the group."""
        return "its per-step advantages are z-scores across the group"

    def assign_advantages(self, batch: TensorDict, context: RolloutContext) -> TensorDict:
        predictions, valid = batch["traj_predictions"], batch["traj_step_mask"]
        steps = predictions.shape[1]
        final = batch["rewards"].float()
        rewards = torch.stack([torch.where(valid[:, s], context.score(predictions[:, s]), final)
                               for s in range(steps)], 1)
        adv = mdpo_step_advantages(rewards, context.group_size)
        global_score = context.all_reduce(adv.abs().sum(0))  # sum_batch |A_s| over all ranks
        chosen = top_advantage_steps(global_score[None], self.config.train_steps)
        batch["step_rewards"] = rewards
        batch["advantages"] = adv[:, chosen]
        batch["mdpo_steps"] = chosen[None].expand(adv.shape[0], -1).clone()
        return batch

    def corrupt(self, batch: TensorDict, step: int) -> TensorDict:
        chosen = batch["mdpo_steps"][0]
        ids, generated, mask_id = batch["input_ids"], batch["generated"], self.token_ids.mask
        states = batch["traj_states"][:, chosen]
        predictions = batch["traj_predictions"][:, chosen]
        proposed = batch["traj_candidates"][:, chosen] & (states == mask_id) & (predictions != mask_id)
        proposed &= batch["traj_step_mask"][:, chosen][..., None]
        k = len(chosen)
        region = generated[:, None].expand(-1, k, -1)
        noisy, targets = ids[:, None].repeat(1, k, 1), ids[:, None].repeat(1, k, 1)
        select = torch.zeros_like(noisy, dtype=torch.bool)
        confidence = torch.zeros(noisy.shape, dtype=torch.float32, device=ids.device)
        noisy[region] = states.reshape(-1)
        targets[region] = predictions.reshape(-1)
        select[region] = proposed.reshape(-1)
        confidence[region] = batch["traj_confidences"][:, chosen].reshape(-1).float()
        batch.update({"noisy_ids": noisy, "targets": targets, "select": select, "confidence": confidence})
        return batch

    def estimate_term(self, model, batch: TensorDict, k: int) -> TensorDict:
        temperature = batch["temperature"] if self.config.divide_by_temperature else None
        logp = self.logp(model, batch, batch["noisy_ids"][:, k], batch["select"][:, k], batch["targets"][:, k],
                         temperature=temperature)
        return TensorDict({"logp": logp}, batch_size=batch.batch_size)

    def loss_term(self, batch: TensorDict, estimates: TensorDict, k: int, totals):
        cfg = self.config
        logp, select = estimates["logp"], batch["select"][:, k]
        old = self.old_term(batch, "logp", k, logp)
        count = select.sum(-1, keepdim=True).float()
        length = batch["generated"].sum(-1, keepdim=True).float()
        scale = totals["sequences"].clamp(min=1).float() * self.num_terms(batch)
        token_mean = select.float() / count.clamp(min=1) / scale
        weight = token_mean * length / (count + 1e-4)
        kl_weight = token_mean
        if cfg.confidence_weight:  # the reference weights the whole per-token term, KL included
            weight = weight * batch["confidence"][:, k]
            kl_weight = kl_weight * batch["confidence"][:, k]
        per_token, clipped = clipped_surrogate(logp, old, batch["advantages"][:, k:k + 1].float(), cfg.clip_low,
                                               cfg.clip_high, cfg.dual_clip)
        loss = (per_token * weight).sum()
        metrics = {"policy/clip_frac": (clipped.float() * token_mean).sum().detach()}
        if cfg.kl_coef > 0:
            kl = kl_estimate(logp, self.term(batch, "ref_logp", k), cfg.kl_estimator)
            loss = loss + cfg.kl_coef * (kl * kl_weight).sum()
            metrics["policy/kl"] = (kl * token_mean).sum().detach()  # the unweighted token-mean KL
        return loss, metrics
