"""EBPO, ELBO-based Block-level Policy Optimization (LLaDA2.1; algorithms.md §9), for block-causal families.

Views (``mc_num = N`` per rollout, stored for old / reference / current): in view ``n`` every response block
``b`` (the model's block grid, the EOS-truncated completion's tokens of that block) gets its own noise level
``t_{n,b}`` and ``m_{n,b} = min(floor(t_{n,b} |b|) + 1, |b|)`` masked tokens, so every view touches every block
(``1 <= m <= |b|``), ``p_{n,b} = m_{n,b} / |b|``. The levels are stratified over the ``N x B`` cells of a
rollout: ``t = (offset + (n B + b) / (N B)) mod 1`` with one random offset, which also stratifies each block's
levels over ``n`` (they are ``1/N`` apart). One ``[noisy ; clean]`` forward per view gives every block's
conditional given the clean earlier blocks:
``ELBO_n = sum_b sum_{j in M_{n,b}} log p(y_j | z_{n,b}, y_<b) / p_{n,b}``, composite ``E = (1/N) sum_n ELBO_n``
(the raw, unnormalised sequence ELBO).

Loss (one ratio per rollout): ``rho_i = exp(E_i - E_old_i)``,
``L = -(1/B) sum_i min(rho_i A_i, clip(rho_i, 1 - eps_low, 1 + eps_high) A_i)`` in log space
(:func:`~dare.algorithms.functional.ebpo_sequence_losses`), ``B`` = rollouts of the global batch, plus
``beta * (1/B) sum_i KL(E_i, E_ref_i)`` when ``kl_coef > 0``.

Memory-exact gradient (two passes): the objective is nonlinear in the ``N`` view terms, so a per-view backward of
the loss would be wrong and one backward through all views keeps ``N`` graphs. :meth:`EBPO.backward` instead
(1) evaluates every view without gradients to get ``E``, (2) differentiates the loss with respect to ``E``
(a leaf): ``g_i = dL/dE_i`` (clipping and KL included), (3) runs each view again with gradients and backpropagates
``sum_i g_i ELBO_{n,i} / N``. The sum of (3) is exactly ``dL/dtheta`` (chain rule, ``dE/dELBO_n = 1/N``) with one
graph alive at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.algorithms.base import register_algorithm
from dare.algorithms.rl import PPOConfig
from dare.algorithms.sequence_elbo import SequenceELBO
from dare.diffusion.forward import STREAM_MASK, STREAM_STRATIFY
from dare.diffusion.noise import example_generator
from dare.errors import ConfigError


@dataclass
class EBPOConfig(PPOConfig):
    name: str = "ebpo"
    """Algorithm name."""
    advantage: str = "zscore"
    """Group advantage (verl GRPO: z-score)."""
    inner_steps: int = 1
    """mu (EBPO: 1, on-policy; old composite ELBOs are stored when mu > 1)."""
    mc_num: int = 16
    """N: Monte-Carlo views (diffusion timesteps) per rollout, each covering every block."""
    clip_low: float = 0.2
    """epsilon_low of the sequence ratio clip."""
    kl_coef: float = 0.0
    """beta of the KL between the policy's and the reference's composite ELBO (yjyddq/DARE: off)."""

    def __post_init__(self):
        super().__post_init__()
        if self.mc_num < 1:
            raise ConfigError(f"algorithm.mc_num must be >= 1; got {self.mc_num}")
        if self.dual_clip is not None:
            raise ConfigError("algorithm.dual_clip does not apply to EBPO's sequence-level ratio; leave it null")


def block_level_views(completion: torch.Tensor, blocks: torch.Tensor, rollout_index: torch.Tensor, *, n: int,
                      seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """EBPO's stratified per-(view, block) masks: ``(mask [R, n, S], p_mask [R, n, S])`` (see the module docstring).

    ``completion [R, S]`` marks the maskable response tokens, ``blocks [R, S]`` each column's block; the draws of a
    rollout come from its own generators (``rollout_index``), so they do not depend on the micro-batch."""
    completion, blocks = completion.cpu().bool(), blocks.cpu().long()
    rows, length = completion.shape
    mask = torch.zeros(rows, n, length, dtype=torch.bool)
    p_mask = torch.ones(rows, n, length, dtype=torch.float32)
    for row, index in enumerate(rollout_index.tolist()):
        positions = completion[row].nonzero().squeeze(-1)
        if positions.numel() == 0:
            continue
        _, block = torch.unique(blocks[row, positions], return_inverse=True)  # 0..nb-1 in order
        sizes = torch.bincount(block)
        nb = sizes.numel()
        offset = torch.rand((), generator=example_generator(seed, index, step, 0, STREAM_STRATIFY), dtype=torch.float64)
        cell = torch.arange(n, dtype=torch.float64)[:, None] * nb + torch.arange(nb, dtype=torch.float64)[None, :]
        levels = (offset + cell / (n * nb)) % 1.0  # [n, nb]
        counts = torch.minimum(torch.floor(levels * sizes).long() + 1, sizes)  # 1 <= m <= |b|
        first = sizes.cumsum(0) - sizes
        for view in range(n):
            u = torch.rand(positions.numel(), generator=example_generator(seed, index, step, view, STREAM_MASK),
                           dtype=torch.float64)
            order = torch.argsort(block.double() + u)  # by block, then by u: a uniform subset per block
            rank = torch.empty_like(order)
            rank[order] = torch.arange(order.numel())
            rank = rank - first[block]
            chosen = rank < counts[view, block]
            mask[row, view, positions[chosen]] = True
            p_mask[row, view, positions] = (counts[view, block].float() / sizes[block].float())
    return mask, p_mask


@register_algorithm
class EBPO(SequenceELBO):
    """Sequence-level PPO on the block-level composite ELBO with the two-pass exact gradient
    (:class:`~dare.algorithms.sequence_elbo.SequenceELBO` with EBPO's views and an unnormalised ratio)."""

    name = "ebpo"
    config_class = EBPOConfig
    attentions = ("block_causal",)
    elbo_metric = "policy/elbo"

    def views(self, batch: TensorDict, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Masked copies of every rollout and weights ``1 / (N p_{n,b})`` on their masked tokens (0 elsewhere), so
        ``sum w log p`` is the composite ``E = (1/N) sum_n ELBO_n``."""
        n = self.config.mc_num
        mask, p_mask = block_level_views(batch["completion_mask"], self.block_ids(batch), batch["rollout_index"],
                                         n=n, seed=self.seed, step=step)
        ids = batch["input_ids"].cpu()[:, None].expand_as(mask)
        noisy = torch.where(mask, torch.full_like(ids, self.token_ids.mask), ids)
        return noisy, mask.float() / (p_mask * n)

    def lengths(self, batch: TensorDict) -> torch.Tensor:
        """EBPO's ratio is on the raw composite ELBO: every normalising length is 1."""
        return torch.ones(batch.batch_size[0], device=batch["input_ids"].device)
