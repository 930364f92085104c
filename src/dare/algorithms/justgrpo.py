"""JustGRPO (Ni et al. 2026, arXiv 2601.15165, "The Flexibility Trap"): plain GRPO with exact autoregressive
likelihoods of a masked diffusion model.

Rollouts decode left to right, one token per step (``rollout.sampler.block_length = 1``: every block is a single
position, so any decoder commits exactly that position), which makes the sampler an autoregressive policy:
``pi(y | x) = prod_j p_T(y_j | x, y_<j, M ... M)`` with ``p_T`` the sampler's distribution at position ``j`` given the
prompt, the tokens before ``j`` and masks from ``j`` on, i.e. ``softmax(logits / T)`` without the mask token (the
samplers never propose it). Training scores exactly these conditionals: position ``j`` is read from the view
``[x ; y_<j ; M ... M]`` at the rollout temperature, so ``sum_j log p`` over the completion equals the sum of the
sampler's returned per-step log-probs (``rollout_logprobs``). Parallel decoding stays an evaluation option.

Loss: token-level clipped GRPO (algorithms.md §0.3) with the rollout's advantages,
``sum_{i,j} m_ij [-min(rho A_i, clip(rho) A_i) / N + beta KL_ij / N_KL]`` with ``N = G * #{i: A_i != 0}`` and
``N_KL = G * #rollouts`` (``normalize = generation``, grpo.py: ``gain / gen_length / valid_samples``; ``G`` = the
generated positions) or ``N = N_KL = sum m`` (``normalize = tokens``, yjyddq/DARE's token-mean). The KL term is on
every completion token, advantage 0 or not, so it is averaged over all rollouts: its weight does not grow as fewer
rollouts are informative. ``N`` and ``N_KL`` are global: counted over the whole step's batch (all micro-batches
and ranks), so the gradient does not depend on micro-batching.

Every scored position needs its own view ``[x ; y_<j ; M ... M]`` (bidirectional attention: the prompt's states
depend on which completion tokens are visible, so views share no computation). The views are
built per (rollout, position) pair and only where a term exists: positions up to the row's first EOS (later
columns were never sampled), and in the training pass only rollouts that carry a gradient (``skip_zero_advantage``:
with ``kl_coef = 0`` a rollout with advantage 0, i.e. a group with equal rewards, contributes exactly 0). The
generated columns are taken ``positions_per_forward`` at a time; each chunk's pairs are one forward (rows = views)
and one backward (the loss is a sum over tokens), so memory is one chunk's graph. Every rank runs the same
``ceil(G / positions_per_forward)`` forwards (FSDP collectives stay aligned; a chunk without a pair runs one
empty view).

Deviations from the reference (``LeapLabTHU/JustGRPO`` ``grpo.py``; DARE ``llada_dp_actor_justgrpo.py``):

* The reference recomputes its normaliser per gradient-accumulation round (``gen_length`` x that round's valid
  samples, averaged over ranks) and sums the rounds; here one global ``N`` covers the whole step, so the gradient is
  about ``1 / grad_accumulation`` of the reference's (matters with gradient clipping) and independent of
  micro-batching.
* The reference scores all ``gen_length`` positions (it decodes past EOS); here the completion up to and including
  the first EOS is scored (the rollout engine stops a row there, so later positions were never sampled).
* The mask token is removed from the training softmax, as from the sampler's; the reference keeps it (its Gumbel
  sampler can in principle propose it). With a trained model the difference is negligible.
* ``mu > 1`` and ``kl_coef > 0`` are supported (the reference is on-policy without KL; the KL term's normaliser
  ``N_KL`` is DARE's choice). The old policy's log-probs are the sampler's returned ``rollout_logprobs`` (the same
  conditionals, computed while decoding), so ``mu > 1`` costs no extra forwards; reference log-probs are one
  left-to-right pass of the reference model.
* Full-attention families only: a block-causal model decodes its own block grid, not single positions.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.algorithms.base import register_algorithm
from dare.algorithms.rl import PPOConfig, RLAlgorithm, response_field
from dare.errors import ConfigError, unknown_choice

NORMALIZE = ("generation", "tokens")


@dataclass
class JustGRPOConfig(PPOConfig):
    name: str = "justgrpo"
    """Algorithm name."""
    advantage: str = "zscore"
    """Group advantage (JustGRPO: (r - mean) / (std + 1e-4), unbiased std)."""
    inner_steps: int = 1
    """mu (JustGRPO: 1, on-policy)."""
    clip_low: float = 0.2
    """Ratio clip epsilon (JustGRPO: 0.2; inactive on-policy)."""
    kl_coef: float = 0.0
    """beta of the KL to the reference (JustGRPO: none)."""
    normalize: str = "generation"
    """Loss normaliser: generation (generation length x rollouts with a non-zero advantage; JustGRPO) or tokens
    (completion tokens of the batch; yjyddq/DARE's token-mean)."""
    positions_per_forward: int = 1
    """Generated columns whose left-to-right views share one forward (JustGRPO: 1; yjyddq/DARE's
    justgrpo_position_chunk_size); a memory knob that does not change the result."""
    skip_zero_advantage: bool = True
    """Training pass: leave out the views of rollouts with advantage 0 when kl_coef = 0 (their loss terms and
    gradient are exactly 0, so the update is unchanged; the policy/logp metric then sums the scored rollouts only).
    false scores every rollout, as the reference does."""

    def __post_init__(self):
        super().__post_init__()
        if self.normalize not in NORMALIZE:
            raise unknown_choice("value for algorithm.normalize", self.normalize, NORMALIZE)
        if self.positions_per_forward < 1:
            raise ConfigError(f"algorithm.positions_per_forward must be >= 1; got {self.positions_per_forward}")


def view_pairs(batch: TensorDict, positions: torch.Tensor,
               rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(row [N], column [N])`` of the views with a term among columns ``positions``: completion positions (up to
    the row's first EOS) of the rows where ``rows [R]`` (bool; None = all), in row-major order."""
    completion = batch["completion_mask"]
    wanted = torch.zeros_like(completion)
    wanted[:, positions.to(completion.device)] = True
    wanted &= completion
    if rows is not None:
        wanted &= rows.to(completion.device)[:, None]
    return wanted.nonzero(as_tuple=True)


def pair_views(input_ids: torch.Tensor, generated: torch.Tensor, columns: torch.Tensor,
               mask_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One view per row of ``input_ids [N, S]`` (the pair's rollout): ``(noisy_ids [N, S], select [N, S])`` with the
    generated columns ``>= columns[n]`` masked and ``columns[n]`` selected."""
    column = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]
    target = columns.to(input_ids.device)[:, None]
    return input_ids.masked_fill(generated & (column >= target), mask_id), column == target


@register_algorithm
class JustGRPO(RLAlgorithm):
    """GRPO on the exact left-to-right likelihood (see the module docstring)."""

    name = "justgrpo"
    config_class = JustGRPOConfig
    attentions = ("full",)

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        # the old policy's log-probs are the sampler's own (rollout_logprobs): no extra forwards when mu > 1
        self.needs = dataclasses.replace(self.needs, old_logprobs=False)

    def check_rollout(self, model, sampler) -> None:
        super().check_rollout(model, sampler)
        if sampler.block_length != 1:
            raise ConfigError(f"justgrpo decodes left to right, one token per step: set rollout.sampler.block_length=1 "
                              f"(got {sampler.block_length})")
        if (sampler.top_p or 1.0) < 1.0 or (sampler.top_k or 0) > 0:
            raise ConfigError("justgrpo scores the sampler's full softmax: unset rollout.sampler.top_p / top_k")
        if sampler.weights != "model":
            raise ConfigError(f"justgrpo takes the old policy's log-probs from the sampler: rollout.sampler.weights "
                              f"must be 'model' (got '{sampler.weights}': other weights than the policy's)")
        if sampler.cache not in (None, "none"):
            raise ConfigError(f"justgrpo's likelihood is the uncached sampler's: set rollout.sampler.cache=none "
                              f"(got {sampler.cache})")

    # ---- views: built on the fly (no randomness; a pure function of the rollout) ----------------------
    def chunks(self, batch: TensorDict) -> list[torch.Tensor]:
        """The generated columns in chunks of ``positions_per_forward`` (the same count on every rank)."""
        columns = batch["generated"][0].nonzero().squeeze(-1)
        size = self.config.positions_per_forward
        return [columns[k * size:(k + 1) * size] for k in range(math.ceil(columns.numel() / size))]

    def trained_rows(self, batch: TensorDict) -> torch.Tensor | None:
        """``[R]`` rollouts whose loss terms can be non-zero (advantage != 0 without a KL term), or None (all)."""
        if not self.config.skip_zero_advantage or self.config.kl_coef > 0:
            return None
        return batch["advantages"] != 0

    def chunk_logp(self, model, batch: TensorDict, positions: torch.Tensor,
                   rows: torch.Tensor | None = None) -> torch.Tensor:
        """``[R, S]``: ``log p_T(y_j | x, y_<j, M...M)`` at the chunk's completion positions of ``rows`` (bool
        ``[R]``, None = all), 0 elsewhere. One forward over the pairs' views (one empty view when there is none, so
        the forward and its collectives still run)."""
        row, column = view_pairs(batch, positions, rows)
        empty = row.numel() == 0
        if empty:
            row, column = row.new_zeros(1), column.new_zeros(1)
        views = batch[row]
        noisy, select = pair_views(views["input_ids"], views["generated"], column, self.token_ids.mask)
        if empty:
            select = torch.zeros_like(select)
        logp = self.logp(model, views, noisy, select, temperature=views["temperature"],
                         banned=(self.token_ids.mask,))
        out = torch.zeros(batch["input_ids"].shape, dtype=logp.dtype, device=logp.device)
        if empty:
            return out + 0.0 * logp.sum()  # keeps the graph (every parameter gets its zero gradient)
        return out.index_put((row.to(out.device), column.to(out.device)), logp[select])

    def estimate(self, model, batch: TensorDict) -> TensorDict:
        self.ensure_bound(model)
        logp = sum(self.chunk_logp(model, batch, positions) for positions in self.chunks(batch))
        return TensorDict({"logp": logp}, batch_size=batch.batch_size)

    # ---- loss -------------------------------------------------------------------------------------------
    def totals(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        out = super().totals(batch)
        out["informative"] = (batch["advantages"] != 0).sum().to(torch.float64)
        return out

    def normalizer(self, batch: TensorDict, totals) -> torch.Tensor:
        """``N`` of the policy-gradient term: ``G * #{i: A_i != 0}`` (``generation``) or the completion tokens."""
        if self.config.normalize == "tokens":
            return totals["tokens"].clamp(min=1).float()
        length = int(batch["generated"][0].sum())
        return (totals["informative"].float() * length).clamp(min=1)

    def kl_normalizer(self, batch: TensorDict, totals) -> torch.Tensor:
        """``N_KL`` of the KL term, which every completion token carries: ``G * #rollouts`` (``generation``) or the
        completion tokens."""
        if self.config.normalize == "tokens":
            return totals["tokens"].clamp(min=1).float()
        length = int(batch["generated"][0].sum())
        return (totals["sequences"].float() * length).clamp(min=1)

    def old_logp(self, batch: TensorDict, logp: torch.Tensor) -> torch.Tensor:
        """``[R, S]`` log-probs of the rollout policy: the sampler's returned per-step log-probs (exactly the
        conditionals scored here, see the module docstring) when ``mu > 1``, else the detached current ones."""
        if self.inner_steps == 1:
            return logp.detach()
        return response_field(batch, batch["rollout_logprobs"].to(logp.device), 0).to(logp.dtype)

    def token_loss(self, batch: TensorDict, logp: torch.Tensor, totals, scored: torch.Tensor):
        """The clipped token loss over the ``scored [R, S]`` positions (all completion tokens, or one chunk's): the
        policy-gradient term over ``N``, the KL term over ``N_KL`` (see the module docstring)."""
        tokens = (batch["completion_mask"] & scored).float()
        old = self.old_logp(batch, logp)
        ref = batch.get("ref_logp") if self.config.kl_coef > 0 else None
        weights = tokens / self.normalizer(batch, totals)
        return self.ppo_token_loss(logp, old, batch["advantages"][:, None].float(), weights, ref,
                                   kl_weights=tokens / self.kl_normalizer(batch, totals))

    def loss(self, batch: TensorDict, estimates: TensorDict, totals):
        loss, metrics = self.token_loss(batch, estimates["logp"], totals, batch["completion_mask"])
        metrics["loss"] = loss.detach()
        return loss, metrics

    def backward(self, model, batch: TensorDict, totals) -> dict:
        """One forward + backward per chunk of positions (the loss is a sum over tokens), over the views of the
        rollouts that carry a gradient (:meth:`trained_rows`)."""
        self.ensure_bound(model)
        metrics: dict = {}
        column = torch.arange(batch["input_ids"].shape[1], device=batch["input_ids"].device)
        rows = self.trained_rows(batch)
        for positions in self.chunks(batch):
            scored = torch.isin(column, positions.to(column.device))[None, :].expand_as(batch["completion_mask"])
            logp = self.chunk_logp(model, batch, positions, rows)
            loss, m = self.token_loss(batch, logp, totals, scored)
            loss.backward()
            for key, value in {**m, "loss": loss.detach()}.items():
                metrics[key] = metrics.get(key, 0.0) + value
        return metrics
