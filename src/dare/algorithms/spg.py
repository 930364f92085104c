"""SPG, Sandwiched Policy Gradient (algorithms.md §7): REINFORCE on a lower bound (ELBO) of the sequence
likelihood for positive advantages and an upper bound (EUBO, or a mix) for the others; no ratio, no KL.

Views (``block_random``, ``num_t`` per rollout, fresh each optimizer step): the completion is cut in blocks of
``block_length``; ``num_t`` block indices come from a random permutation taken modulo the number of blocks
the completion occupies; for block ``b``: earlier blocks clean, ``k ~ U{max(1, floor(m min_t)) ..
min(floor(m max_t), m)}`` of its ``m`` valid tokens masked, later blocks and everything after the first EOS
masked; every real prompt token and every token of earlier blocks is then masked with ``p_mask_prompt``.
Loss ``-sum_i |y_i| A_i l_i / sum_i |y_i|`` over the global batch with ``l_i`` from
:func:`~dare.algorithms.functional.spg_elbo` / :func:`~dare.algorithms.functional.spg_eubo`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.algorithms.base import check_settings, register_algorithm, settings_error
from dare.algorithms.functional import spg_elbo, spg_eubo
from dare.algorithms.rl import STREAM_PROMPT, GroupConfig, RLAlgorithm
from dare.diffusion.forward import exact_mask, iid_mask
from dare.diffusion.noise import example_generator
from dare.errors import ConfigError, unknown_choice

ESTIMATORS = ("elbo", "eubo", "mix")


@dataclass
class SPGConfig(GroupConfig):
    name: str = "spg"
    """Algorithm name."""
    advantage: str = "mean"
    """Group advantage (SPG: mean-only)."""
    inner_steps: int = 4
    """mu: updates per rollout batch, each with fresh views (no ratio: no old log-probs)."""
    num_t: int = 2
    """Monte-Carlo views per rollout (one chosen block each)."""
    block_length: int = 32
    """Block length of the block-wise views (must divide the generation length)."""
    min_t: float = 0.0
    """Lower end of the masked fraction inside the chosen block."""
    max_t: float = 1.0
    """Upper end of the masked fraction inside the chosen block."""
    p_mask_prompt: float = 0.15
    """Probability of masking each prompt / earlier-block token."""
    logp_estimation: str = "mix"
    """Likelihood of non-positive-advantage rollouts: elbo, eubo or mix (omega EUBO + (1 - omega) ELBO)."""
    mix_weight: float = 0.5
    """omega of the mixture."""
    eubo_beta: float = 1.5
    """beta of the EUBO (p^beta averaged over views)."""

    def __post_init__(self):
        super().__post_init__()
        if self.logp_estimation not in ESTIMATORS:
            raise unknown_choice("value for algorithm.logp_estimation", self.logp_estimation, ESTIMATORS)
        check_settings(self, {"num_t": (lambda v: v >= 1, ">= 1"), "block_length": (lambda v: v >= 1, ">= 1"),
                              "eubo_beta": (lambda v: v > 0, "> 0")})
        if not 0 <= self.min_t <= self.max_t <= 1:
            raise settings_error(self, "must satisfy 0 <= min_t <= max_t <= 1", "min_t", "max_t")


def block_random_views(batch: TensorDict, mask_id: int, cfg: SPGConfig, *, seed: int, step: int):
    """SPG's ``block_random`` corruption: ``(noisy_ids [R, n, S], masked [R, n, S])``."""
    ids = batch["input_ids"].cpu()
    rows, width = ids.shape
    n, block = cfg.num_t, cfg.block_length
    masked = torch.zeros(rows, n, width, dtype=torch.bool)
    generated, completion, prompt = (batch[k].cpu() for k in ("generated", "completion_mask", "prompt_mask"))
    for row, index in enumerate(batch["rollout_index"].tolist()):
        gen_pos = generated[row].nonzero().squeeze(-1)
        gen_len = len(gen_pos)
        num_blocks = gen_len // block  # SPG.check_rollout: block divides gen_len, n <= num_blocks
        length = int(completion[row].sum())
        used_blocks = max((length - 1) // block + 1, 1)
        order = torch.randperm(num_blocks, generator=example_generator(seed, index, step, 0, 0)) % used_blocks
        prompt_pos = prompt[row].nonzero().squeeze(-1)
        for j in range(n):
            gen = example_generator(seed, index, step, j + 1, 0)
            b = int(order[j])
            local = torch.arange(gen_len)
            view = local >= (b + 1) * block  # later blocks
            view |= local >= length  # after the first EOS
            m = max(min(block, length - block * b), 0)
            if m > 0:
                lo, hi = max(1, int(m * cfg.min_t)), min(int(m * cfg.max_t), m)
                hi = max(hi, lo)
                k = int(torch.randint(lo, hi + 1, (), generator=gen))
                view[b * block:b * block + m] = exact_mask(torch.ones(m, dtype=torch.bool), k, gen)
            elif length == 0:
                view[:] = True
            if cfg.p_mask_prompt > 0:  # prompt and earlier blocks
                candidates = torch.cat([prompt_pos, gen_pos[:b * block]])
                chosen = iid_mask(torch.ones(len(candidates), dtype=torch.bool), cfg.p_mask_prompt,
                                  example_generator(seed, index, step, j, STREAM_PROMPT))
                masked[row, j, candidates[chosen]] = True
            masked[row, j, gen_pos] |= view
    noisy = torch.where(masked, torch.full_like(ids, mask_id)[:, None], ids[:, None])
    return noisy.to(batch["input_ids"].device), masked.to(batch["input_ids"].device)


@register_algorithm
class SPG(RLAlgorithm):
    name = "spg"
    config_class = SPGConfig
    uses_ratio = False

    def check_rollout(self, model, sampler) -> None:
        """Also: ``algorithm.block_length`` divides the sampler's ``gen_length`` into at least ``num_t`` blocks
        (the views pick ``num_t`` of them); checked by ``--dry-run`` and before the first rollout."""
        super().check_rollout(model, sampler)
        block, length, n = self.config.block_length, sampler.gen_length, self.config.num_t
        if length % block:
            raise ConfigError(f"algorithm.block_length={block} must divide the generation length "
                              f"rollout.sampler.gen_length={length}")
        if n > length // block:
            raise ConfigError(f"algorithm.num_t={n} exceeds the number of blocks ({length // block} = "
                              f"rollout.sampler.gen_length={length} / algorithm.block_length={block})")

    def corrupt(self, batch: TensorDict, step: int) -> TensorDict:
        batch["noisy_ids"], batch["masked"] = block_random_views(batch, self.token_ids.mask, self.config,
                                                                 seed=self.seed, step=step)
        return batch

    def estimate(self, model, batch: TensorDict) -> TensorDict:
        select = batch["masked"] & batch["completion_mask"][:, None]
        logp = self.logp(model, batch, batch["noisy_ids"], select)
        return TensorDict({"logp": logp}, batch_size=batch.batch_size)

    def sequence_estimates(self, batch: TensorDict, logp: torch.Tensor) -> torch.Tensor:
        """``l_i``: the ELBO estimate where ``A_i > 0``, else the configured upper-bound estimate."""
        cfg = self.config
        masked, completion = batch["masked"], batch["completion_mask"]
        elbo = spg_elbo(logp, masked, completion)
        if cfg.logp_estimation == "elbo":
            negative = elbo
        else:
            eubo = spg_eubo(logp, masked, completion, cfg.eubo_beta)
            negative = eubo if cfg.logp_estimation == "eubo" else cfg.mix_weight * eubo + (1 - cfg.mix_weight) * elbo
        return torch.where(batch["advantages"] > 0, elbo, negative)

    def loss(self, batch: TensorDict, estimates: TensorDict, totals):
        seq = self.sequence_estimates(batch, estimates["logp"])
        lengths = batch["completion_mask"].sum(-1).float()
        loss = -(lengths * batch["advantages"].float() * seq).sum() / totals["tokens"].clamp(min=1).float()
        return loss, {"loss": loss.detach(), "policy/seq_logp": seq.detach().sum() / totals["sequences"].float()}
