"""ESPO, ELBO-based Sequence-level Policy Optimization (Ou et al. 2025, arXiv 2512.03759; algorithms.md §12).

The whole completion is one action. Its log-likelihood is the ELBO ``E_i`` estimated on stored views, the ratio is
``rho_i = exp((E_i - E_old_i) / L)`` (per-token normalised, ``L`` = the number of tokens the ELBO covers), clipped
PPO on it, plus ``beta k2(E_i, E_ref_i) / L`` (the k2 estimator on the raw ELBO, then divided by the length):
see :mod:`dare.algorithms.sequence_elbo` for the loss and the memory-exact two-pass gradient.

Views (``mc_num`` Monte-Carlo samples per rollout, fresh for every inner step, shared by old / reference / current):
the ``T`` tokens of the scope; sample ``m`` masks ``x_m`` of them uniformly at random with ``p_m = x_m / (T + 1)``;
``x_0 = k ~ U{0..T}`` and ``x_m = (k + round(m (T + 1) / n)) mod (T + 1)`` (stratified over ``{0..T}``; only the
stride is rounded, so every ``x_m`` is a shift of ``k`` and uniform on ``{0..T}``). Its term is
``sum_{j masked} log p(y_j | z_m) / p_m``. With ``reduce_var`` (the paper's variance reduction) a second view
masks exactly the complement and scores it with ``1 / (T / (T + 1) - p_m)``; the two estimates are averaged.
``E`` is the mean over the ``mc_num`` samples. Both halves are unbiased for ``sum_j log p(y_j | ...)`` on a
context-free model (every token is scored with total expected weight 1).

Deviations from the reference (``ML-GSAI/ESPO`` ``espo_trainer.py``; DARE ``llada_dp_actor_espo.py``):

* The reference stratifies the mask counts across the rows of a micro-batch (one ``k`` per forward batch); here
  every rollout draws its own ``k`` and the counts are stratified across its ``mc_num`` samples, so the views do not
  depend on micro-batching or the number of processes (with ``mc_num = 1`` the marginal is the same).
* Masks come from per-rollout generators (``example_generator``), not from re-seeding the global RNG.
* ``scope = generation`` (default) is the reference (all generated positions, the EOS padding included, ``L`` = the
  generation length); ``scope = completion`` is yjyddq/DARE's padding-aware port (tokens up to the first EOS,
  ``L`` = that count). Positions outside the scope stay clean in both views.
* The reference keeps every view's graph for one backward; the two-pass gradient is exact with one graph alive.
* The reference re-syncs the LoRA reference every 64 steps (``sync_ref_model``); the reference here stays the
  initial policy.
* ESPO's k1 option adds a gradient-correction term; only the plain k1/k2/k3 estimators exist here (k2 is the default).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.algorithms.base import register_algorithm
from dare.algorithms.sequence_elbo import SequenceELBO, SequenceELBOConfig, mask_positions
from dare.diffusion.forward import STREAM_MASK, STREAM_STRATIFY
from dare.diffusion.noise import example_generator
from dare.errors import ConfigError


@dataclass
class ESPOConfig(SequenceELBOConfig):
    name: str = "espo"
    """Algorithm name."""
    advantage: str = "loo"
    """Group advantage (ESPO: leave-one-out baseline, scale_rewards false)."""
    inner_steps: int = 2
    """mu (ESPO recipes/train.yaml: num_iterations 2; the GSM8K script uses 8)."""
    clip_low: float = 0.2
    """epsilon of the sequence-ratio clip."""
    kl_coef: float = 0.01
    """beta of the KL to the reference (train.yaml 0.01; GSM8K 1e-3)."""
    kl_estimator: str = "k2"
    """KL estimator on the raw sequence ELBO (ESPO: k2)."""
    mc_num: int = 1
    """Monte-Carlo samples of the ELBO per rollout (train.yaml 1; GSM8K 2)."""
    reduce_var: bool = True
    """Average each sample with its complementary-mask estimate (two forwards per sample)."""

    def __post_init__(self):
        super().__post_init__()
        if self.mc_num < 1:
            raise ConfigError(f"algorithm.mc_num must be >= 1; got {self.mc_num}")


def espo_counts(total: int, n: int, k: int) -> list[int]:
    """Mask counts of the ``n`` samples: ``x_m = (k + round(m (T + 1) / n)) mod (T + 1)`` with ``k`` in ``{0..T}``.

    Only the stride is rounded: each ``x_m`` is ``k`` shifted by a constant, so with ``k ~ U{0..T}`` every sample's
    count is uniform on ``{0..T}`` (rounding ``k + m (T + 1) / n`` as a whole, half to even, would give ``m >= 1``
    counts of one parity only when ``(T + 1) / n`` is a half-integer)."""
    return [(k + round(m * (total + 1) / n)) % (total + 1) for m in range(n)]


def espo_views(batch: TensorDict, scope: torch.Tensor, mask_id: int, *, n: int, reduce_var: bool, seed: int,
               step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(noisy_ids [R, V, S], elbo_weight [R, V, S])``, ``V = 2n`` (masked, complement per sample) with
    ``reduce_var`` else ``n`` (see the module docstring)."""
    ids, scope = batch["input_ids"].cpu(), scope.cpu().bool()
    rows, width = ids.shape
    per_sample = 2 if reduce_var else 1
    masked = torch.zeros(rows, n * per_sample, width, dtype=torch.bool)
    weight = torch.zeros(rows, n * per_sample, width, dtype=torch.float32)
    share = 1.0 / (n * per_sample)
    for row, index in enumerate(batch["rollout_index"].tolist()):
        positions = scope[row].nonzero().squeeze(-1)
        total = positions.numel()
        if total == 0:
            continue
        k = int(torch.randint(0, total + 1, (), generator=example_generator(seed, index, step, 0, STREAM_STRATIFY)))
        for m, count in enumerate(espo_counts(total, n, k)):
            chosen = mask_positions(positions, count, example_generator(seed, index, step, m, STREAM_MASK), width)
            first = m * per_sample
            masked[row, first] = chosen
            weight[row, first][chosen] = share * (total + 1) / count if count else 0.0
            if reduce_var:
                rest = scope[row] & ~chosen
                masked[row, first + 1] = rest
                weight[row, first + 1][rest] = share * (total + 1) / (total - count) if count < total else 0.0
    noisy = torch.where(masked, torch.full_like(ids, mask_id)[:, None], ids[:, None])
    return noisy, weight


@register_algorithm
class ESPO(SequenceELBO):
    """Sequence-level PPO on the ESPO ELBO (see the module docstring)."""

    name = "espo"
    config_class = ESPOConfig

    def views(self, batch: TensorDict, step: int):
        cfg = self.config
        return espo_views(batch, self.scope_mask(batch), self.token_ids.mask, n=cfg.mc_num, reduce_var=cfg.reduce_var,
                          seed=self.seed, step=step)
