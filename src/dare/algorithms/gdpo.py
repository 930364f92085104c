"""GDPO, Group Diffusion Policy Optimization (Rojas et al. 2025, arXiv 2510.08554): sequence-level PPO on a
semi-deterministic Monte-Carlo (SDMC) ELBO.

The ELBO ``E = int_0^1 (1/t) E_{z_t}[sum_{j masked} log p(y_j | z_t)] dt`` is integrated over the masking ratio with a
fixed quadrature rule (Gauss-Legendre nodes mapped to ``[0, 1]``, or Simpson on ``{0.1, 0.5, 1}``); only the inner
expectation over which tokens are masked is Monte Carlo (``mc_num`` draws per node). View ``(i, d)`` masks exactly
``clamp(floor(t_i T), 1, T)`` of the ``T`` scope tokens uniformly at random and scores them with weight
``w_i / (t_i mc_num)`` (the reference divides by ``t_i``, not by the realised fraction). Two or three nodes replace the
random ``t`` that dominates the variance of the usual double Monte-Carlo estimate. The loss is the sequence-level
clipped PPO of :mod:`dare.algorithms.sequence_elbo` with ``rho_i = exp((E_i - E_old_i) / L_i)``.

References: NeMo-RL ``research/gdpo`` (``gdpo/elbo.py``, ``configs/gdpo_llada_8b.yaml``) and Block-R1
``rl/trainers/gdpo_trainer.py`` + ``likelihood_estimators.py`` (``NumericalIntegrationEstimator``).

Deviations:

* ``scope = completion`` (default, NeMo-RL: tokens up to the first EOS are masked, scored and normalise the ratio);
  ``scope = generation`` is Block-R1 (every generated position, the EOS padding included).
* Masks come from per-rollout generators (``example_generator`` of the rollout, step and view), so old, reference and
  current ELBOs share them in any micro-batching; Block-R1 re-seeds the global RNG per micro-batch.
* The reference keeps every view's graph for one backward; the two-pass gradient is exact with one graph alive.
* Block-R1's optional ``p_mask_prompt`` prompt corruption (NeMo default 0) is not offered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.algorithms.base import register_algorithm
from dare.algorithms.sequence_elbo import SequenceELBO, SequenceELBOConfig, mask_positions
from dare.diffusion.forward import STREAM_MASK
from dare.diffusion.noise import example_generator
from dare.errors import ConfigError, unknown_choice


def _gauss_legendre(n: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``n``-point Gauss-Legendre rule on ``[0, 1]`` (nodes ascending, weights summing to 1)."""
    import numpy

    nodes, weights = numpy.polynomial.legendre.leggauss(n)
    return tuple(float(0.5 * x + 0.5) for x in nodes), tuple(float(0.5 * w) for w in weights)


QUADRATURES: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    **{f"gauss-{n}": _gauss_legendre(n) for n in range(1, 6)},
    "simpson": ((0.1, 0.5, 1.0), (1 / 6, 4 / 6, 1 / 6)),  # the references' Simpson weights, first node moved off t = 0
}
"""Integration rules over the masking ratio: ``name -> (nodes t_i, weights w_i)`` on ``[0, 1]``."""


@dataclass
class GDPOConfig(SequenceELBOConfig):
    name: str = "gdpo"
    """Algorithm name."""
    advantage: str = "mean"
    """Group advantage (GDPO: r - mean_G r, no std division, as Dr. GRPO)."""
    inner_steps: int = 1
    """mu (NeMo-RL recipe: one update per rollout batch)."""
    clip_low: float = 0.5
    """epsilon of the sequence-ratio clip (GDPO: 0.5)."""
    kl_coef: float = 0.0
    """beta of the KL to the reference (GDPO: 0)."""
    quadrature: str = "gauss-3"
    """Integration rule over the masking ratio: gauss-1 .. gauss-5 or simpson (NeMo-RL recipe: gauss-3)."""
    mc_num: int = 1
    """Mask draws per quadrature node (forwards per ELBO = nodes x mc_num)."""
    scope: str = "completion"
    """Tokens the ELBO covers: completion (up to the first EOS; NeMo-RL) or generation (all positions; Block-R1)."""

    def __post_init__(self):
        super().__post_init__()
        if self.quadrature not in QUADRATURES:
            raise unknown_choice("value for algorithm.quadrature", self.quadrature, QUADRATURES)
        if self.mc_num < 1:
            raise ConfigError(f"algorithm.mc_num must be >= 1; got {self.mc_num}")


def quadrature_views(batch: TensorDict, scope: torch.Tensor, mask_id: int, *, rule: str, draws: int, seed: int,
                     step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(noisy_ids [R, V, S], elbo_weight [R, V, S])``, ``V = nodes x draws`` (see the module docstring)."""
    nodes, weights = QUADRATURES[rule]
    ids, scope = batch["input_ids"].cpu(), scope.cpu().bool()
    rows, width = ids.shape
    masked = torch.zeros(rows, len(nodes) * draws, width, dtype=torch.bool)
    weight = torch.zeros(rows, len(nodes) * draws, width, dtype=torch.float32)
    for row, index in enumerate(batch["rollout_index"].tolist()):
        positions = scope[row].nonzero().squeeze(-1)
        total = positions.numel()
        if total == 0:
            continue
        for i, (t, w) in enumerate(zip(nodes, weights)):
            count = min(max(math.floor(t * total), 1), total)
            for d in range(draws):
                view = i * draws + d
                chosen = mask_positions(positions, count, example_generator(seed, index, step, view, STREAM_MASK),
                                        width)
                masked[row, view] = chosen
                weight[row, view][chosen] = w / (t * draws)
    noisy = torch.where(masked, torch.full_like(ids, mask_id)[:, None], ids[:, None])
    return noisy, weight


@register_algorithm
class GDPO(SequenceELBO):
    """Sequence-level PPO on the SDMC quadrature ELBO (see the module docstring)."""

    name = "gdpo"
    config_class = GDPOConfig

    def views(self, batch: TensorDict, step: int):
        cfg = self.config
        return quadrature_views(batch, self.scope_mask(batch), self.token_ids.mask, rule=cfg.quadrature,
                                draws=cfg.mc_num, seed=self.seed, step=step)
