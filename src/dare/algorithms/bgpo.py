"""BGPO, Boundary-Guided Policy Optimization (algorithms.md §8): per-MC-term bounds of the ELBO ratio.

Views: ``mc_num`` stratified discrete corruptions of the EOS-truncated completion (VRPO's counts), stored for
old and current. With per-term ELBOs ``l_k = sum_{masked} log p / p_k / L`` (``L`` = generation length, or the
valid length with ``normalize=valid``, the default on block-causal families) and ``D_k = l_k - l_k_old``, each
term's ratio is ``1 + D_k`` for ``A > 0`` (tangent of exp) and ``exp(D_k)`` otherwise (Jensen); PPO clip with
dual clip per term, mean over terms; rollouts are combined by the token-mean of the reference (verl ``agg_loss``
token-mean over the response mask): ``sum_i |y_i| l_i / sum_i |y_i|`` (``l_i`` = the rollout's mean over its terms,
``|y_i|`` = its EOS-truncated completion length, the sum over the global batch), so longer rollouts weigh more. The
loss is a sum of per-term losses, so every term is its own forward + backward (constant memory in ``mc_num``);
on-policy value and gradient equal those of ``A exp(mean D)`` under the same weights.

Block-causal families (SDAR, LLaDA2; algorithms.md §8): the same corruption (global over the response, not
per block); each term's log-probs come from one ``[noisy ; clean]`` forward, so block ``b`` is scored from its
noisy copy and the clean blocks before it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensordict import TensorDict

from dare.algorithms.base import register_algorithm
from dare.algorithms.functional import bgpo_ratio, ratio_policy_loss
from dare.algorithms.rl import GroupConfig, RLAlgorithm, TermwiseMixin
from dare.diffusion import ForwardProcess, corrupt_mc
from dare.errors import ConfigError, unknown_choice

NORMALIZE = ("auto", "pad", "valid")


@dataclass
class BGPOConfig(GroupConfig):
    name: str = "bgpo"
    """Algorithm name."""
    advantage: str = "zscore"
    """Group advantage (verl GRPO: z-score)."""
    inner_steps: int = 1
    """mu (BGPO: 1, on-policy)."""
    mc_num: int = 16
    """Monte-Carlo ELBO terms per rollout (one forward + backward each)."""
    clip: float = 0.2
    """Ratio clip epsilon (per MC term)."""
    dual_clip: float | None = 3.0
    """Dual clip c for negative advantages (null = off)."""
    normalize: str = "auto"
    """ELBO term normaliser: pad (generation length, yjyddq/DARE's LLaDA port), valid (EOS-truncated completion
    length, yjyddq/DARE's SDAR / LLaDA2 ports) or auto (valid on block-causal families, pad otherwise)."""

    def __post_init__(self):
        super().__post_init__()
        if self.normalize not in NORMALIZE:
            raise unknown_choice("value for algorithm.normalize", self.normalize, NORMALIZE)
        if self.mc_num < 1:
            raise ConfigError(f"algorithm.mc_num must be >= 1; got {self.mc_num}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ConfigError(f"algorithm.dual_clip must be > 1 (or null); got {self.dual_clip}")


@register_algorithm
class BGPO(TermwiseMixin, RLAlgorithm):
    name = "bgpo"
    config_class = BGPOConfig
    logprob_keys = ("elbo",)

    def corrupt(self, batch: TensorDict, step: int) -> TensorDict:
        views = corrupt_mc(batch["input_ids"], batch["completion_mask"], batch["example_index"], self.token_ids.mask,
                           seed=self.seed, step=step, n=self.config.mc_num, process=ForwardProcess(schedule="discrete"),
                           stratified=True)
        batch.update(views.as_dict())
        return batch

    @property
    def normalizer(self) -> str:
        if self.config.normalize != "auto":
            return self.config.normalize
        return "valid" if self.blocks is not None else "pad"

    def estimate_term(self, model, batch: TensorDict, k: int) -> TensorDict:
        mask, p_mask = batch["mask"][:, k], batch["p_mask"][:, k]
        logp = self.logp(model, batch, batch["noisy_ids"][:, k], mask)
        region = batch["generated"] if self.normalizer == "pad" else batch["completion_mask"]
        elbo = (logp / p_mask.float()).sum(-1) / region.sum(-1).clamp(min=1).float()
        return TensorDict({"elbo": elbo}, batch_size=batch.batch_size)

    def loss_term(self, batch: TensorDict, estimates: TensorDict, k: int, totals):
        elbo = estimates["elbo"]
        old = self.old_term(batch, "elbo", k, elbo)
        adv = batch["advantages"].float()
        ratio = bgpo_ratio(elbo, old, adv)
        per_row = ratio_policy_loss(ratio, adv, self.config.clip, self.config.dual_clip)
        terms = self.num_terms(batch)
        scale = totals["sequences"].clamp(min=1).float() * terms
        # token-mean: each rollout weighs its completion length, over the global completion-token total
        lengths = batch["completion_mask"].sum(-1).float()
        loss = (lengths * per_row).sum() / (totals["tokens"].clamp(min=1).float() * terms)
        clipped = ((ratio - 1).abs() > self.config.clip).float().sum() / scale
        return loss, {"policy/clip_frac": clipped.detach(), "policy/elbo": elbo.detach().sum() / scale}
