"""The shared base of the RL plug-ins (GRPO family): configs, the advantage hook, model-facing estimators and
the token-level PPO loss. Every RL algorithm is one module subclassing :class:`RLAlgorithm`.

Rollout micro-batches (built by :class:`dare.trainer.rl.RolloutSource`) are ``TensorDict`` s with ``R`` rows of
``S = P + G`` tokens (left-padded prompt, then the ``G`` generated positions):

* ``input_ids [R, S]`` (undecoded positions after an early stop hold EOS), ``attention_mask [R, S]``,
  ``prompt_mask [R, S]`` (real prompt tokens), ``generated [R, S]`` (the completion region),
  ``completion_mask [R, S]`` (up to the first EOS inclusive), ``example_index [R, S]`` (the rollout's global
  index in the step on every real token, -1 on padding), ``rollout_index [R]``, ``group_size [R]``;
* ``rewards [R]``, ``advantages [R]`` (set by :meth:`RLAlgorithm.assign_advantages`), ``temperature [R]``;
* with ``needs.trajectory``: ``traj_states``, ``traj_predictions``, ``traj_confidences``, ``traj_transfers``,
  ``traj_candidates`` ``[R, T, G]`` and ``traj_step_mask [R, T]`` (:class:`dare.rollout.Trajectory`);
* after ``corrupt``: the algorithm's views; after the workflow: ``old_<key>`` / ``ref_<key>`` for every key
  of :attr:`RLAlgorithm.logprob_keys`.

Loss contributions are normalised by global totals (:meth:`totals`), so they sum over micro-batches and ranks
to the global-batch objective. Metrics follow the same rule (each is a global mean once summed).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from tensordict import TensorDict

from dare.algorithms.base import Algorithm, AlgorithmConfig, Needs
from dare.algorithms.functional import ADVANTAGE_MODES, KL_ESTIMATORS, clipped_surrogate, group_advantages, kl_estimate
from dare.algorithms.logprobs import DEFAULT_LOGITS_CHUNK, BlockLayout, masked_logprobs, model_inputs
from dare.errors import ConfigError, unknown_choice

STREAM_PROMPT = 2  # example_generator stream of prompt masking (0 = response masks, 1 = stratification)


# --------------------------------------------------------------------------------------------- configs
@dataclass
class GroupConfig(AlgorithmConfig):
    """Knobs every GRPO-style algorithm has."""

    advantage: str = "mean"
    """Group advantage: mean (r - mean_G), zscore ((r - mean) / (std + 1e-4)), loo (leave-one-out), none."""
    population_std: bool = False
    """z-score with the population std (TraceRL) instead of the unbiased one (verl/TRL)."""
    inner_steps: int = 1
    """mu: optimizer steps per rollout batch (each with its own stored corruption; old log-probs from the
    rollout policy when mu > 1, else the detached current ones, i.e. ratio 1)."""

    def __post_init__(self):
        if self.advantage not in ADVANTAGE_MODES:
            raise unknown_choice("value for algorithm.advantage", self.advantage, ADVANTAGE_MODES)
        if self.inner_steps < 1:
            raise ConfigError(f"algorithm.inner_steps must be >= 1; got {self.inner_steps}")


@dataclass
class PPOConfig(GroupConfig):
    """Token-level clipped surrogate with an optional KL penalty to the reference (algorithms.md §0.3)."""

    clip_low: float = 0.2
    """epsilon_low of the ratio clip."""
    clip_high: float | None = None
    """epsilon_high of the ratio clip (default: clip_low)."""
    dual_clip: float | None = None
    """Dual clip c > 1: the loss of negative-advantage tokens is capped at -c A (null = off)."""
    kl_coef: float = 0.0
    """beta of the KL penalty to the reference policy (0 = no reference model is built)."""
    kl_estimator: str = "k3"
    """KL estimator: k1 (log ratio), k2 (half squared log ratio), k3 (exp(-x) + x - 1, always >= 0)."""

    def __post_init__(self):
        super().__post_init__()
        if self.kl_estimator not in KL_ESTIMATORS:
            raise unknown_choice("value for algorithm.kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        if not 0 <= self.clip_low < 1 or (self.clip_high is not None and self.clip_high < 0):
            raise ConfigError(f"clip range must satisfy 0 <= clip_low < 1, clip_high >= 0; got {self.clip_low}, {self.clip_high}")
        if self.dual_clip is not None and self.dual_clip <= 1:
            raise ConfigError(f"algorithm.dual_clip must be > 1 (or null); got {self.dual_clip}")
        if self.kl_coef < 0:
            raise ConfigError(f"algorithm.kl_coef must be >= 0; got {self.kl_coef}")


# --------------------------------------------------------------------------------------------- context
@dataclass
class RolloutContext:
    """What the advantage hook may use besides the batch.

    Attributes:
        group_size: G (rows ``g*G .. g*G+G-1`` of the batch are one prompt's group).
        score: ``score(token_ids [N, L]) -> rewards [N]``: decode completions (up to the first stop token) and
            score them with the run's reward against the rows' samples (MDPO's per-step rewards).
        all_reduce: sum a tensor over ranks (identity in one process); e.g. global step statistics.
    """

    group_size: int
    score: Callable[[torch.Tensor], torch.Tensor]
    all_reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t


# --------------------------------------------------------------------------------------------- estimators
def forward_logp(model, batch: TensorDict, noisy_ids: torch.Tensor, select: torch.Tensor,
                 targets: torch.Tensor | None = None, *, attn_backend: str | None = None,
                 temperature: torch.Tensor | float | None = None, chunk_size: int = DEFAULT_LOGITS_CHUNK,
                 blocks: BlockLayout | None = None) -> torch.Tensor:
    """``log p(target_j | noisy_ids)`` (fp32) at ``select`` positions, 0 elsewhere.

    ``noisy_ids`` is ``[R, S]`` or ``[R, n, S]`` (``n`` views per row, evaluated in one forward of ``R*n`` rows
    sharing the row's attention mask); ``select`` and ``targets`` (default ``input_ids``) broadcast to it.
    ``temperature`` divides the logits (per row ``[R]`` or a float), as MDPO does with the rollout temperature.
    The forward is the family's denoiser (:func:`dare.algorithms.logprobs.masked_logprobs`: block-causal families
    see ``[noisy ; clean]`` with the rollout as the clean copy) with the chunked LM head (``chunk_size``; 0 = full
    logits). Algorithms pass ``**self.forward_options``.
    """
    input_ids = batch["input_ids"]
    targets = input_ids if targets is None else targets
    rows, length = input_ids.shape
    n = 1 if noisy_ids.ndim == 2 else noisy_ids.shape[1]
    shape = noisy_ids.shape

    def flat(t: torch.Tensor) -> torch.Tensor:  # [R, S] or [R, n, S] -> [R*n, S]
        return (t if t.ndim == len(shape) else t[:, None]).expand(shape).reshape(rows * n, length)

    layout = model_inputs(batch)
    if "attention_mask" in layout:
        layout["attention_mask"] = layout["attention_mask"].repeat_interleave(n, 0)
    if temperature is not None:
        temperature = torch.as_tensor(temperature, dtype=torch.float32, device=input_ids.device)
        if temperature.ndim == 1:
            temperature = temperature.repeat_interleave(n, 0)
    out = masked_logprobs(model, noisy_ids.reshape(rows * n, length), flat(input_ids), flat(select),
                          targets=flat(targets), blocks=blocks, attn_backend=attn_backend, chunk_size=chunk_size,
                          temperature=temperature, **layout)
    return out.reshape(shape)


# --------------------------------------------------------------------------------------------- base classes
class RLAlgorithm(Algorithm):
    """Base of the online RL plug-ins: advantages, totals, the token-level PPO/GRPO loss.

    Subclasses implement ``corrupt`` (stored views), ``estimate`` (returning at least ``logprob_keys``) and
    ``loss``; ``needs`` is refined per instance (reference iff ``kl_coef > 0``, old log-probs iff ``mu > 1``).
    """

    config_class = PPOConfig
    needs: ClassVar[Needs] = Needs(rollout=True, reward=True)
    logprob_keys: ClassVar[tuple[str, ...]] = ("logp",)
    uses_ratio: ClassVar[bool] = True
    """Whether the loss compares with the rollout policy (then mu > 1 needs old estimates)."""

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        kl = getattr(config, "kl_coef", 0.0) > 0
        self.needs = dataclasses.replace(
            type(self).needs, reference=type(self).needs.reference or kl,
            old_logprobs=self.uses_ratio and self.inner_steps > 1)

    @property
    def inner_steps(self) -> int:
        return getattr(self.config, "inner_steps", 1)

    # ---- hooks of the rollout source -----------------------------------------------------------------
    def assign_advantages(self, batch: TensorDict, context: RolloutContext) -> TensorDict:
        """Set ``batch["advantages"]`` from ``batch["rewards"]`` (whole groups of one rank's rollouts)."""
        batch["advantages"] = group_advantages(batch["rewards"], context.group_size, self.config.advantage,
                                               unbiased_std=not self.config.population_std)
        return batch

    # ---- totals and losses ---------------------------------------------------------------------------
    def totals(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        completion = batch["completion_mask"]
        return {
            "tokens": completion.sum().to(torch.float64),
            "sequences": torch.tensor(float(completion.shape[0]), dtype=torch.float64),
        }

    def old_or_detached(self, batch: TensorDict, key: str, current: torch.Tensor) -> torch.Tensor:
        """The stored old estimate, or (mu = 1: the update is on-policy) the detached current one."""
        return batch[f"old_{key}"] if f"old_{key}" in batch.keys() else current.detach()

    def ppo_token_loss(self, logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                       weights: torch.Tensor, ref_logp: torch.Tensor | None = None):
        """``sum_j w_j [-min(rho A, clip(rho) A) + beta KL_j]`` and its metrics (``w`` holds the normaliser)."""
        cfg = self.config
        per_token, clipped = clipped_surrogate(logp, old_logp, advantages, cfg.clip_low, cfg.clip_high, cfg.dual_clip)
        loss_tokens = per_token
        metrics = {"policy/clip_frac": (clipped.float() * weights).sum().detach()}
        if cfg.kl_coef > 0:
            kl = kl_estimate(logp, ref_logp, cfg.kl_estimator)
            loss_tokens = loss_tokens + cfg.kl_coef * kl
            metrics["policy/kl"] = (kl * weights).sum().detach()
        loss = (loss_tokens * weights).sum()
        metrics["policy/logp"] = (logp.detach() * weights).sum()
        return loss, metrics


class TermwiseMixin:
    """For losses that are a **sum** of independent terms (MC samples, denoising steps): one forward and one
    backward per term, so memory is that of one graph (algorithms.md §0.2 pitfall 3, BGPO, CJ-GRPO, MDPO).

    Subclasses implement ``num_terms(batch)``, ``estimate_term(model, batch, k) -> TensorDict [R, ...]`` and
    ``loss_term(batch, estimates_k, k, totals) -> (loss, metrics)``; ``estimate`` stacks the terms along dim 1
    (used for old / reference estimates and by tests), ``loss`` sums them, and ``backward`` runs term by
    term; the gradients are identical (linearity).
    """

    def num_terms(self, batch: TensorDict) -> int:
        raise NotImplementedError

    def estimate_term(self, model, batch: TensorDict, k: int) -> TensorDict:
        raise NotImplementedError

    def loss_term(self, batch: TensorDict, estimates: TensorDict, k: int, totals):
        raise NotImplementedError

    def estimate(self, model, batch: TensorDict) -> TensorDict:
        terms = [self.estimate_term(model, batch, k) for k in range(self.num_terms(batch))]
        return TensorDict({key: torch.stack([t[key] for t in terms], 1) for key in terms[0].keys()},
                          batch_size=batch.batch_size)

    def loss(self, batch: TensorDict, estimates: TensorDict, totals):
        total, metrics = None, {}
        for k in range(self.num_terms(batch)):
            term = TensorDict({key: estimates[key][:, k] for key in estimates.keys()}, batch_size=batch.batch_size)
            loss, m = self.loss_term(batch, term, k, totals)
            total = loss if total is None else total + loss
            for key, value in m.items():
                metrics[key] = metrics.get(key, 0.0) + value
        metrics["loss"] = total.detach()
        return total, metrics

    def backward(self, model, batch: TensorDict, totals) -> dict:
        metrics: dict = {}
        for k in range(self.num_terms(batch)):
            loss, m = self.loss_term(batch, self.estimate_term(model, batch, k), k, totals)
            loss.backward()
            m = {**m, "loss": loss.detach()}
            for key, value in m.items():
                metrics[key] = metrics.get(key, 0.0) + value
        return metrics

    @staticmethod
    def term(batch: TensorDict, key: str, k: int) -> torch.Tensor:
        """Term ``k`` of a stored ``[R, K, ...]`` field (old / reference estimates)."""
        return batch[key][:, k]


__all__ = ["GroupConfig", "PPOConfig", "RLAlgorithm", "RolloutContext", "STREAM_PROMPT", "TermwiseMixin",
           "forward_logp"]
