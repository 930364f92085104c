"""DiPO, Discrete Diffusion Policy Optimization (OpenMOSS DiRL, arXiv 2512.22234), for block-causal families.

Step-level GRPO on the rollout's own decoding trace. A rollout ``tau_i`` is a sequence of generation steps; step
``t`` commits the token set ``tau_i(t)`` given the state ``tau_i(1:t-1)`` (the prompt, the clean earlier blocks
and the tokens the block already committed). Block-causal attention makes each of these conditionals exact, so
the trajectory log-probability is the sum of the committed tokens' step conditionals and the objective (the
paper's Eq. 7, the "online" form with ``pi_old`` = the detached current policy)

    J = 1 / (sum_i |tau_i|) * sum_i sum_t sum_{o in tau_i(t)} C_eps(rho(o), A_i)  -  beta KL

is an unbiased GRPO over generation steps: every committed token counts once, at the step that produced it, and
the normaliser is the total number of generation steps of the global batch (``|tau_i|`` = the number of distinct
steps that committed a trained token of rollout ``i``). ``C_eps(rho, A) = min(rho A, clip(rho, 1 - eps_low,
1 + eps_high) A)`` on ``rho = exp(clamp(log p - log p_old, +-10))`` (DiRL clamps the log-ratio to 10); the
optional KL is k3 to the frozen reference, weighted like the surrogate.

Views (block-parallel replay, as TraceRL with shrink 1): round ``r`` selects, in every block at once, the tokens
of that block's ``r``-th distinct step and masks, in every block, the tokens of that step and later ones (and the
never-decoded tail); one ``[noisy ; clean]`` forward scores a round for every block, block ``b`` seeing itself
and the clean blocks before it - the sampler's exact context. Every trained token (the completion up to its first
stop token) is in exactly one round. Advantages: rewards z-scored in the group with the population std (0 for a
flat group), DiRL's ``z_score_normalize``.

Deviations from the reference code (``train/grpo.py`` + ``models/sdar/modeling_sdar.py``):

* normalisation: the reference code averages the clipped surrogate over the tokens of each training micro-batch
  (and pads every rollout to ``block_size`` rows); we implement the paper's Eq. 7 (token sums per step over the
  total step count), which does not depend on how rows are batched;
* the reference's ``clip(rho, 1 - eps, 1 + eps + 0.08)`` is ``clip_low = 0.2, clip_high = 0.28`` here;
* DAPO-style dynamic sampling (dropping groups with zero reward variance and rolling out more prompts) is a
  workflow option of every algorithm, not part of this plug-in;
* full-attention families are rejected (the per-step conditionals are only exact with block-causal attention).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.algorithms.base import register_algorithm
from dare.algorithms.functional import clipped_surrogate, kl_estimate, step_ranks
from dare.algorithms.rl import PPOConfig, RLAlgorithm, RolloutContext, TermwiseMixin, response_field

LOG_RATIO_CLAMP = 10.0  # DiRL clamps the log ratio to +-10 before exp


@dataclass
class DiPOConfig(PPOConfig):
    name: str = "dipo"
    """Algorithm name."""
    advantage: str = "zscore"
    """Group advantage (DiRL: z-score with the population std, 0 for a flat group)."""
    population_std: bool = True
    """z-score with the population std (DiRL's z_score_normalize)."""
    inner_steps: int = 1
    """mu: optimizer steps per rollout batch (DiRL num_iterations 1; > 1 stores old step log-probs)."""
    clip_low: float = 0.2
    """epsilon_low of the ratio clip (DiRL eps 0.2)."""
    clip_high: float | None = 0.28
    """epsilon_high of the ratio clip (DiRL clips at 1 + eps + 0.08)."""
    kl_coef: float = 0.0
    """beta of the k3 KL to the frozen reference (DiRL scripts: KL=0; configs/rl.yaml: 0.1)."""


def step_counts(steps: torch.Tensor, trained: torch.Tensor) -> torch.Tensor:
    """``[R]``: the number of distinct step ids among each row's trained positions (``|tau_i|``)."""
    rows = torch.arange(steps.shape[0], device=steps.device)[:, None].expand_as(steps)
    span = int(steps.max()) + 2 if steps.numel() else 1
    keys = torch.unique(rows[trained] * span + steps[trained])
    return torch.bincount(keys // span, minlength=steps.shape[0]).to(torch.float64)


@register_algorithm
class DiPO(TermwiseMixin, RLAlgorithm):
    """Step-level GRPO over the block-parallel replay of the rollout's steps (see the module docstring)."""

    name = "dipo"
    config_class = DiPOConfig
    attentions = ("block_causal",)
    replays_steps = True

    def assign_advantages(self, batch: TensorDict, context: RolloutContext) -> TensorDict:
        batch = super().assign_advantages(batch, context)
        self.ensure_bound_for_views()
        _, trained = self.step_rounds(batch)
        local = int(batch["dipo_rank"].max()) + 1 if bool(trained.any()) else 1
        rounds = context.all_max(local)  # every rank replays the same number of rounds (FSDP collectives)
        batch["replay_terms"] = torch.full((batch.batch_size[0],), max(rounds, 1), dtype=torch.long)
        return batch

    def ensure_bound_for_views(self) -> None:
        if not self._bound:
            raise RuntimeError("dipo: bind_model(model) must run before the rollout (the rounds follow its blocks)")

    def step_rounds(self, batch: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        """``(steps [R, S], trained [R, S])``: each completion column's step id and whether it is trained; stores
        each trained position's round (its step's rank inside its block) as ``batch["dipo_rank"]``."""
        steps = response_field(batch, batch["step_map"])
        decoded = steps >= 0
        trained = batch["completion_mask"] & decoded
        rank = step_ranks(steps, decoded, self.block_ids(batch))
        batch["dipo_rank"] = torch.where(trained, rank, -1)
        return steps, trained

    def corrupt(self, batch: TensorDict, step: int) -> TensorDict:
        steps, trained = self.step_rounds(batch)
        rounds = int(batch["replay_terms"][0])
        k = torch.arange(rounds, device=steps.device)[None, :, None]
        rank = step_ranks(steps, steps >= 0, self.block_ids(batch))
        hidden = batch["generated"][:, None] & ((steps[:, None] < 0) | (rank[:, None] >= k))
        ids = batch["input_ids"][:, None]
        batch["noisy_ids"] = torch.where(hidden, torch.full_like(ids, self.token_ids.mask), ids)
        batch["select"] = trained[:, None] & (batch["dipo_rank"][:, None] == k)
        batch["dipo_steps"] = step_counts(steps, trained)
        return batch

    def totals(self, batch: TensorDict):
        out = super().totals(batch)
        out["steps"] = batch["dipo_steps"].sum()
        out["trained_tokens"] = batch["select"].sum().to(torch.float64)
        return out

    def loss_term(self, batch: TensorDict, estimates: TensorDict, k: int, totals):
        cfg = self.config
        logp = estimates["logp"]
        old = self.old_term(batch, "logp", k, logp)
        per_token, clipped = clipped_surrogate(logp, old, batch["advantages"][:, None].float(), cfg.clip_low,
                                               cfg.clip_high, cfg.dual_clip, log_ratio_clamp=LOG_RATIO_CLAMP)
        select = batch["select"][:, k]
        weight = select.float() / totals["steps"].clamp(min=1).float()
        loss = (per_token * weight).sum()
        tokens = totals["trained_tokens"].clamp(min=1).float()
        metrics = {"policy/clip_frac": (clipped & select).float().sum().detach() / tokens,
                   "policy/logp": (logp.detach() * select).sum() / tokens}
        if cfg.kl_coef > 0:
            kl = kl_estimate(logp, self.term(batch, "ref_logp", k), cfg.kl_estimator)
            loss = loss + cfg.kl_coef * (kl * weight).sum()
            metrics["policy/kl"] = (kl.detach() * select).sum() / tokens
        return loss, metrics
