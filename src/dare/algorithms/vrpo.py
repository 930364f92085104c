"""VRPO (LLaDA 1.5, algorithms.md §2) and DPO for masked diffusion: DPO with ELBO likelihoods.

Rows alternate chosen / rejected (``2i``, ``2i+1``: micro-batches hold whole pairs). Each row gets ``mc_num``
corruptions (stratified discrete mask counts, VRPO's "one mask per timestep"), stored and shared by the
policy and the reference (antithetic sampling: equal models give exactly equal ELBOs). With
``B(y) = mean_m sum_{masked} log p / p_m / elbo_divisor``:
``L = -mean_pairs log sigmoid(beta [(B_theta(y_w) - B_ref(y_w)) - (B_theta(y_l) - B_ref(y_l))])``.
``elbo_divisor`` = 1 is the paper's raw ELBO; yjyddq/DARE's port divides by the padded response length (e.g. 512).
``dpo`` is the same objective with one (unstratified) ELBO sample.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tensordict import TensorDict

from dare.algorithms.base import Algorithm, AlgorithmConfig, Needs, check_settings, register_algorithm
from dare.algorithms.rl import forward_logp
from dare.diffusion import ForwardProcess, corrupt_mc
from dare.diffusion.forward import SCHEDULES
from dare.errors import ConfigError, unknown_choice


@dataclass
class VRPOConfig(AlgorithmConfig):
    name: str = "vrpo"
    """Algorithm name."""
    beta: float = 0.2
    """DPO temperature beta."""
    mc_num: int = 4
    """ELBO samples per response (yjyddq/DARE: 4; paper budget: 8)."""
    stratified: bool = True
    """Spread the mask counts over strata (VRPO); false = independent draws."""
    schedule: str = "discrete"
    """Masking schedule of the ELBO samples: discrete (l ~ U{1..L}) or continuous (t ~ U(1e-3, 1))."""
    elbo_divisor: float = 1.0
    """Divide the ELBO by this constant before the DPO logit (1 = raw ELBO; yjyddq/DARE: the padded length)."""

    def __post_init__(self):
        check_settings(self, {"mc_num": (lambda v: v >= 1, ">= 1"), "beta": (lambda v: v > 0, "> 0"),
                              "elbo_divisor": (lambda v: v > 0, "> 0")})
        if self.schedule not in SCHEDULES:
            raise unknown_choice("value for algorithm.schedule", self.schedule, SCHEDULES)


@dataclass
class DPOConfig(VRPOConfig):
    name: str = "dpo"
    """Algorithm name."""
    mc_num: int = 1
    """ELBO samples per response."""
    stratified: bool = False
    """Spread the mask counts over strata."""


@register_algorithm
class VRPO(Algorithm):
    name = "vrpo"
    config_class = VRPOConfig
    needs = Needs(pairs=True, reference=True)
    logprob_keys = ("elbo",)

    def corrupt(self, batch: TensorDict, step: int) -> TensorDict:
        cfg = self.config
        views = corrupt_mc(batch["input_ids"], batch["maskable"], batch["example_index"], self.token_ids.mask,
                           seed=self.seed, step=step, n=cfg.mc_num, process=ForwardProcess(schedule=cfg.schedule),
                           stratified=cfg.stratified)
        batch.update(views.as_dict())
        return batch

    def totals(self, batch: TensorDict):
        return {"pairs": torch.tensor(batch.batch_size[0] / 2, dtype=torch.float64)}

    def estimate(self, model, batch: TensorDict) -> TensorDict:
        logp = forward_logp(model, batch, batch["noisy_ids"], batch["mask"], **self.forward_options)
        terms = (logp / batch["p_mask"].float()).sum(-1)  # [R, n]; zero where not masked
        elbo = terms.mean(-1) / self.config.elbo_divisor
        return TensorDict({"elbo": elbo}, batch_size=batch.batch_size)

    def loss(self, batch: TensorDict, estimates: TensorDict, totals):
        if batch.batch_size[0] % 2:
            raise ConfigError("preference micro-batches must hold whole (chosen, rejected) pairs")
        policy, ref = estimates["elbo"], batch["ref_elbo"].to(estimates["elbo"].device)
        margin = (policy[0::2] - ref[0::2]) - (policy[1::2] - ref[1::2])
        logits = self.config.beta * margin
        pairs = totals["pairs"].clamp(min=1).float()
        loss = -F.logsigmoid(logits).sum() / pairs
        return loss, {"loss": loss.detach(), "dpo/accuracy": (logits > 0).float().sum().detach() / pairs,
                      "dpo/margin": margin.detach().sum() / pairs}


@register_algorithm
class DPO(VRPO):
    name = "dpo"
    config_class = DPOConfig
