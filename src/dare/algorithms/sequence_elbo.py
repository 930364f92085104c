"""Sequence-level PPO on a weighted-sum ELBO estimate (the shared base of ESPO, GDPO and EBPO).

These methods treat a whole completion as one action whose log-likelihood is replaced by an ELBO estimate that is a
**weighted sum of token log-probs over stored views**: ``E_i = sum_v sum_j w_ivj log p(y_ij | z_iv)``, where view
``v`` is a corruption ``z_iv`` of rollout ``i`` (``noisy_ids [R, V, S]``) and ``w [R, V, S]`` (``elbo_weight``)
carries every factor of the estimator (``1/p``, quadrature weights, Monte-Carlo averages; 0 where the view scores
nothing). A subclass only builds the views (:meth:`SequenceELBO.views`); this base class does the rest:

* ratio per rollout ``rho_i = exp((E_i - E_old_i) / L_i)``, ``L_i`` the normalising length (ESPO's and GDPO's
  per-token normalisation; :meth:`SequenceELBO.lengths`, 1 for EBPO's raw ELBO), with the PPO clip applied in log space
  (:func:`~dare.algorithms.functional.ebpo_sequence_losses`);
* loss ``(1/B) sum_i [-min(rho_i A_i, clip(rho_i) A_i) + beta KL(E_i, E_ref_i) / L_i]`` over the ``B`` rollouts of
  the global batch (the KL estimator is applied to the raw ELBO, then divided by the length, as ESPO does);
* the memory-exact two-pass gradient of EBPO (algorithms.md §9): the objective is nonlinear in the views, so
  :meth:`SequenceELBO.backward` first evaluates ``E`` without gradients, differentiates the loss with respect to
  ``E`` (a leaf) to get ``g_i = dL/dE_i``, then runs one view at a time with gradients and backpropagates
  ``sum_i g_i sum_j w_ivj log p_ivj``. The sum is exactly ``dL/dtheta`` (``E`` is linear in every view's
  log-probs) while only one view's graph is alive.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.algorithms.functional import ebpo_sequence_losses, kl_estimate
from dare.algorithms.rl import PPOConfig, RLAlgorithm
from dare.diffusion.forward import exact_mask
from dare.errors import ConfigError, unknown_choice

SCOPES = ("generation", "completion")


@dataclass
class SequenceELBOConfig(PPOConfig):
    """Knobs shared by the sequence-level ELBO methods."""

    scope: str = "generation"
    """Tokens the ELBO covers and the ratio is normalised by: generation (every generated position, EOS padding
    included) or completion (up to the first EOS, inclusive)."""

    def __post_init__(self):
        super().__post_init__()
        if self.scope not in SCOPES:
            raise unknown_choice("value for algorithm.scope", self.scope, SCOPES)
        if self.dual_clip is not None:
            raise ConfigError(f"algorithm.dual_clip does not apply to {self.name}'s sequence-level ratio; "
                              "leave it null")


def mask_positions(positions: torch.Tensor, count: int, gen: torch.Generator, width: int) -> torch.Tensor:
    """``[width]`` bool: ``count`` of the columns ``positions`` masked uniformly at random. The draws run over the
    positions only, so a rollout's masks do not depend on the left padding of its micro-batch."""
    chosen = torch.zeros(width, dtype=torch.bool)
    chosen[positions[exact_mask(torch.ones(positions.numel(), dtype=torch.bool), count, gen)]] = True
    return chosen


class SequenceELBO(RLAlgorithm):
    """Sequence-level clipped PPO on ``E = sum w log p`` over stored views (see the module docstring).

    Subclasses implement :meth:`views`."""

    config_class = SequenceELBOConfig
    attentions = ("full",)
    logprob_keys = ("elbo",)
    elbo_metric = "policy/elbo_per_token"
    """Metric name of ``E / L`` (the normalised ELBO)."""

    def views(self, batch: TensorDict, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(noisy_ids [R, V, S], elbo_weight [R, V, S])`` of the batch for optimizer step ``step``."""
        raise NotImplementedError

    def scope_mask(self, batch: TensorDict) -> torch.Tensor:
        """``[R, S]`` tokens the ELBO covers (``config.scope``)."""
        return batch["generated"] if self.config.scope == "generation" else batch["completion_mask"]

    def corrupt(self, batch: TensorDict, step: int) -> TensorDict:
        noisy, weight = self.views(batch, step)
        device = batch["input_ids"].device
        batch["noisy_ids"], batch["elbo_weight"] = noisy.to(device), weight.to(device)
        return batch

    def view_elbo(self, model, batch: TensorDict, v: int) -> torch.Tensor:
        """``[R]``: view ``v``'s term ``sum_j w_vj log p(y_j | z_v)`` of the ELBO."""
        weight = batch["elbo_weight"][:, v]
        logp = self.logp(model, batch, batch["noisy_ids"][:, v], weight != 0)
        return (logp * weight.float()).sum(-1)

    def estimate(self, model, batch: TensorDict) -> TensorDict:
        self.ensure_bound(model)
        views = batch["noisy_ids"].shape[1]
        elbo = sum(self.view_elbo(model, batch, v) for v in range(views))
        return TensorDict({"elbo": elbo}, batch_size=batch.batch_size)

    def lengths(self, batch: TensorDict) -> torch.Tensor:
        """``[R]`` normalising length of every rollout (tokens in the scope, at least 1)."""
        return self.scope_mask(batch).sum(-1).clamp(min=1).float()

    def loss(self, batch: TensorDict, estimates: TensorDict, totals):
        cfg = self.config
        elbo = estimates["elbo"]
        old = self.old_or_detached(batch, "elbo", elbo)
        length = self.lengths(batch)
        per_row, clipped = ebpo_sequence_losses(elbo / length, old / length, batch["advantages"], cfg.clip_low,
                                                cfg.clip_high)
        scale = totals["sequences"].clamp(min=1).float()
        loss = per_row.sum() / scale
        metrics = {"policy/clip_frac": clipped.float().sum().detach() / scale,
                   self.elbo_metric: (elbo / length).detach().sum() / scale,
                   "policy/log_ratio": ((elbo - old) / length).detach().sum() / scale}
        if cfg.kl_coef > 0:
            kl = kl_estimate(elbo, batch["ref_elbo"], cfg.kl_estimator) / length
            loss = loss + cfg.kl_coef * kl.sum() / scale
            metrics["policy/kl"] = kl.detach().sum() / scale
        metrics["loss"] = loss.detach()
        return loss, metrics

    def backward(self, model, batch: TensorDict, totals) -> dict:
        """The two-pass memory-exact gradient (module docstring): peak memory is one view's graph."""
        self.ensure_bound(model)
        views = batch["noisy_ids"].shape[1]
        with torch.no_grad():
            value = sum(self.view_elbo(model, batch, v) for v in range(views))
        proxy = value.detach().requires_grad_(True)
        loss, metrics = self.loss(batch, TensorDict({"elbo": proxy}, batch_size=batch.batch_size), totals)
        (grad,) = torch.autograd.grad(loss, proxy)
        for v in range(views):
            (grad * self.view_elbo(model, batch, v)).sum().backward()
        return metrics


__all__ = ["SCOPES", "SequenceELBO", "SequenceELBOConfig", "mask_positions"]
