"""Masked-diffusion SFT (LLaDA / Dream / LLaDA-MoE): the NELBO of ``algorithms.md`` section 1.1."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.algorithms.base import Algorithm, AlgorithmConfig, register_algorithm
from dare.algorithms.logprobs import masked_logprobs, model_inputs
from dare.diffusion import ForwardProcess, corrupt, nelbo_totals, nelbo_weights, resolve_normalization


@dataclass
class SFTConfig(AlgorithmConfig):
    name: str = "sft"
    """Algorithm name."""
    schedule: str = "continuous"
    """continuous (mask i.i.d. with prob t ~ U(t_min, t_max)) or discrete (exactly l ~ U{1..L} answer tokens)."""
    t_min: float = 1e-3
    """Lower end of the masking ratio (the LLaDA eps; keeps 1/t <= 1000)."""
    t_max: float = 1.0
    """Upper end of the masking ratio."""
    normalize: str = "llada"
    """Loss normalisation: llada (per-answer length, then / #sequences), d1 (/ #answer tokens), batch
    (/ #sequences), masked (/ #masked tokens; DARE trainers, not the NELBO). Aliases: sequence, token."""
    inverse_t: bool = True
    """Weight each masked token by 1/p_mask (the NELBO); false = unweighted CE (DARE's LLaDA2 SFT)."""

    def __post_init__(self):
        resolve_normalization(self.normalize)
        _ = self.process  # ForwardProcess validates the schedule and the range

    @property
    def process(self) -> ForwardProcess:
        return ForwardProcess(schedule=self.schedule, t_low=self.t_min, t_high=self.t_max)


@register_algorithm
class SFT(Algorithm):
    """``L = sum_j w_j (-log p(y_j | z))``, ``w = 1[masked] / p_mask / normaliser`` (prompt never masked)."""

    name = "sft"
    config_class = SFTConfig

    def corrupt(self, batch: TensorDict, step: int) -> TensorDict:
        views = corrupt(batch["input_ids"], batch["maskable"], batch["example_index"], self.token_ids.mask,
                        seed=self.seed, step=step, process=self.config.process)
        batch.update(views.as_dict())
        return batch

    def totals(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        return nelbo_totals(batch["mask"], batch["maskable"], batch["example_index"])

    def estimate(self, model, batch: TensorDict) -> TensorDict:
        logp = masked_logprobs(model, batch["noisy_ids"], batch["input_ids"], batch["mask"],
                               attn_backend=self.attn_backend, chunk_size=self.logits_chunk_size, **model_inputs(batch))
        return TensorDict({"logp": logp}, batch_size=batch.batch_size)

    def loss(self, batch: TensorDict, estimates: TensorDict, totals: dict[str, torch.Tensor]):
        weights = nelbo_weights(batch["mask"], batch["p_mask"], batch["maskable"], batch["example_index"],
                                totals, self.config.normalize, self.config.inverse_t).to(estimates["logp"].device)
        loss = -(weights * estimates["logp"]).sum()
        logp = estimates["logp"].detach()
        nll = -torch.where(batch["mask"], logp, torch.zeros((), dtype=logp.dtype, device=logp.device)).sum()
        metrics = {"loss": loss.detach(), "nll_masked": nll}  # no boolean indexing: no host sync
        return loss, metrics
