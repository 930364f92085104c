"""TraceRL (Gen-Verse dLLM-RL; algorithms.md §10): train on the rollout's own decoding trace, optionally with a
value model and GAE over the denoising steps.

Trace rows: the rollout's step map (the step each completion token was committed at) is shrunk
(:func:`~dare.algorithms.functional.shrink_step_map`: within every block of a block-causal model, or the whole
response with full attention, the sorted distinct step ids are grouped in runs of ``shrink`` and mapped to the
run's last id). Round ``r`` then selects, **in every block at once**, the tokens of that block's ``r``-th
distinct (shrunk) step; its input masks, in every block, the tokens of that step and later ones (and the
never-decoded tail). On a block-causal family one ``[noisy ; clean]`` forward scores a round for all blocks:
block ``b`` sees itself and the clean blocks before it (TraceRL's ``[x ; y_clean ; y_tail]`` rows); with full
attention the round is the response with ``{j : s_j >= k}`` masked (the LLaDA rows). A row is one (rollout,
round) with at least one trainable token; trainable = the completion up to the first EOS plus ``post_num``
decoded tokens after it. Every trainable token is in exactly one row.

Policy loss per row, ``rho_j = exp(clamp(log p - log p_old, +-10))``, KL to the **old** policy (k3):

* ``normalize=length`` (SDAR/TraDo, default on block-causal families):
  ``sum_j [-min(rho A, clip(rho) A) + beta KL_j] / L1`` (``L1`` = generation length);
* ``normalize=row`` (LLaDA, default with full attention): ``sum_j -min(...) / |T_row| + beta sum_j KL_j``;

averaged over the rows of the global batch. Old log-probs exist when ``inner_steps > 1`` (else ``rho = 1`` and
the KL is 0: TraceRL's KL only acts after the first update on a rollout batch).

Advantages: truncated rollouts get ``truncated_reward`` (TraceRL: incorrect): those that never emitted a stop token
and, with ``truncation_margin = m > 0``, those of ``>= gen_length - m`` completion tokens even when they stopped
(the reference's rule, ``m = 5``); rewards are z-scored in the group with the population std (0 for a flat
group); groups whose accuracy is outside ``accuracy_filter`` are dropped (no rows). The rollout source logs the
rewards after the truncation rule (``rollout/trained_reward``; ``rollout/flat_groups`` counts groups flat after it)
and warns, naming the rule, when it flattens groups or no group is left with a learning signal (e.g. no rollout
reached a stop token within the generation length: with the default ``truncated_reward: 0`` every reward is then
0). Without a value model every token of a rollout gets its score.
With ``value_model: true`` a scalar value head on a **separate copy of the backbone** (initialised from the
policy's starting weights, head at 0; the reference trains a separate value model too, so policy and value
gradients never mix and the value lr can differ) predicts ``V_j`` on the same rows; at rollout time the
(pre-update) values and the score placed on the tokens of the last trainable step give token advantages and
returns by GAE over the steps (:func:`~dare.algorithms.functional.tracerl_token_advantages`; gamma = lambda = 1
gives ``A = R - V``); the value model is trained jointly with
``1/2 max((V - R)^2, (V_old + clip(V - V_old, +-value_clip) - R)^2)``, ``sum / L1``, mean over rows, by its own
optimizer (``value_lr``). The value model needs the trainer (it builds, shards, steps and checkpoints it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from tensordict import TensorDict

from dare.algorithms.base import Auxiliary, check_settings, register_algorithm, written
from dare.algorithms.functional import (
    clipped_surrogate, group_advantages, kl_estimate, shrink_step_map, step_ranks, tracerl_token_advantages,
)
from dare.algorithms.logprobs import denoising_hidden, model_inputs
from dare.algorithms.rl import PPOConfig, RLAlgorithm, RolloutContext, TermwiseMixin, response_field
from dare.errors import ConfigError, unknown_choice
from dare.models.loading import evaluating

NORMALIZE = ("auto", "length", "row")
LOG_RATIO_CLAMP = 10.0  # TraceRL clamps the log ratio to +-10 before exp


@dataclass
class TraceRLConfig(PPOConfig):
    name: str = "tracerl"
    """Algorithm name."""
    advantage: str = "zscore"
    """Group normalisation of the (truncation-corrected) rewards (TraceRL: z-score)."""
    population_std: bool = True
    """z-score with the population std (TraceRL), 0 for a flat group."""
    inner_steps: int = 1
    """mu: optimizer steps per rollout batch over all rows (> 1 stores old log-probs: ratio and KL become active)."""
    clip_low: float = 0.2
    """Ratio clip epsilon."""
    kl_coef: float = 0.01
    """beta of the k3 KL to the old (pre-update) policy; no reference model is used."""
    shrink: int = 1
    """Consecutive distinct step ids (per block) merged into one training step."""
    post_num: int = 0
    """Decoded tokens after the first stop token that are still trained."""
    normalize: str = "auto"
    """Row loss: length (sum / generation length, SDAR/TraDo), row (token mean of the row, LLaDA) or auto (length
    on block-causal families, row otherwise)."""
    truncated_reward: float | None = 0.0
    """Reward of truncated rollouts (TraceRL marks them incorrect): those that never emitted a stop token (and see
    truncation_margin); null = keep theirs."""
    truncation_margin: int = 0
    """A rollout whose completion length (up to and including its stop token) is >= gen_length - margin counts as
    truncated, even if it stopped (the reference uses 5: ``response_length >= max_gen_length - 5``); 0 = only
    rollouts without a stop token."""
    accuracy_filter: list[float] | None = field(default_factory=lambda: [0.2, 0.8])
    """[low, high]: drop groups whose accuracy (fraction correct) is outside; null = keep every group."""
    value_model: bool = False
    """Train a value model (scalar head on a copy of the backbone) jointly and use GAE over steps."""
    value_lr: float = 5.0e-6
    """Learning rate of the value model."""
    value_clip: float = 0.2
    """Clip of the value update around the rollout-time values."""
    gamma: float = 1.0
    """GAE discount over steps."""
    lam: float = 1.0
    """GAE lambda."""

    def __post_init__(self):
        super().__post_init__()
        if self.normalize not in NORMALIZE:
            raise unknown_choice("value for algorithm.normalize", self.normalize, NORMALIZE)
        check_settings(self, {"truncation_margin": (lambda v: v >= 0, ">= 0"), "shrink": (lambda v: v >= 1, ">= 1"),
                              "post_num": (lambda v: v >= 0, ">= 0")})
        if self.accuracy_filter is not None and (len(self.accuracy_filter) != 2 or
                                                 not 0 <= self.accuracy_filter[0] <= self.accuracy_filter[1] <= 1):
            raise ConfigError(f"algorithm.accuracy_filter must be [low, high] with 0 <= low <= high <= 1 (or null); "
                              f"got {written(self.accuracy_filter)}")
        check_settings(self, {"value_lr": (lambda v: v > 0, "> 0"), "value_clip": (lambda v: v > 0, "> 0"),
                              "gamma": (lambda v: 0 <= v <= 1, "in [0, 1]"),
                              "lam": (lambda v: 0 <= v <= 1, "in [0, 1]")})


class ValueModel(torch.nn.Module):
    """``V_j = w . h_j``: a bias-free linear head on the final hidden state that predicts token ``j`` of the same
    denoising forward as the policy's (:func:`~dare.algorithms.logprobs.denoising_hidden`). The head starts at 0."""

    def __init__(self, backbone):
        super().__init__()
        self.backbone = backbone.requires_grad_(True)
        lm_head = backbone.get_output_embeddings().weight
        if lm_head is not backbone.get_input_embeddings().weight:
            lm_head.requires_grad_(False)  # the LM head is never used (and would get no optimizer state)
        self.head = torch.nn.Linear(lm_head.shape[-1], 1, bias=False, dtype=torch.float32, device=lm_head.device)
        torch.nn.init.zeros_(self.head.weight)

    def forward(self, noisy_ids, clean_ids, *, blocks=None, attn_backend=None, **layout) -> torch.Tensor:
        hidden = denoising_hidden(self.backbone, noisy_ids, clean_ids, blocks=blocks, attn_backend=attn_backend,
                                  **layout)
        return self.head(hidden.to(self.head.weight.dtype)).squeeze(-1).float()  # FSDP may cast the head


def trainable_positions(batch: TensorDict, steps: torch.Tensor, post_num: int) -> torch.Tensor:
    """``[R, S]``: decoded completion positions up to the first stop token plus ``post_num`` after it."""
    generated = batch["generated"]
    offset = generated.long().cumsum(-1) - 1  # completion index of each generated column
    limit = batch["completion_mask"].sum(-1, keepdim=True) + post_num
    return generated & (steps >= 0) & (offset < limit)


@register_algorithm
class TraceRL(TermwiseMixin, RLAlgorithm):
    name = "tracerl"
    config_class = TraceRLConfig
    replays_steps = True
    value: ValueModel | None = None

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        self.needs = dataclasses.replace(self.needs, reference=False)  # the KL is to the old policy

    # ---- value model -------------------------------------------------------------------------------------
    @classmethod
    def auxiliary_names(cls, config) -> tuple[str, ...]:
        return ("value",) if config.value_model else ()

    def auxiliary_models(self, load_backbone) -> dict[str, Auxiliary]:
        if not self.config.value_model:
            return {}
        self.value = ValueModel(load_backbone())
        return {"value": Auxiliary(self.value, self.config.value_lr, getattr(self.value.backbone, "blocks", None))}

    def value_term(self, batch: TensorDict, k: int) -> torch.Tensor:
        """Values ``[R, S]`` of round ``k``'s selected tokens (0 elsewhere)."""
        values = self.value(batch["noisy_ids"][:, k], batch["input_ids"], blocks=self.blocks,
                            attn_backend=self.attn_backend, **model_inputs(batch))
        return torch.where(batch["select"][:, k], values, 0.0)

    def rollout_values(self, batch: TensorDict) -> torch.Tensor:
        """``[R, S]``: every trainable token's value on its own row (the value model before this step's update)."""
        with evaluating(self.value):
            return sum(self.value_term(batch, k) for k in range(batch["noisy_ids"].shape[1]))

    # ---- advantages and rows -----------------------------------------------------------------------------
    @property
    def normalizer(self) -> str:
        if self.config.normalize != "auto":
            return self.config.normalize
        return "length" if self.blocks is not None else "row"

    def stopped(self, batch: TensorDict) -> torch.Tensor:
        """``[R]``: whether each rollout counts as finished (not truncated): its completion ends with a stop token
        (EOS/EOT) and, with ``truncation_margin = m > 0``, is shorter than ``gen_length - m`` tokens."""
        completion = batch["completion_mask"]
        last = (completion.long().cumsum(-1) * completion).argmax(-1)
        final = batch["input_ids"].gather(1, last[:, None]).squeeze(1)
        stopped = torch.isin(final, torch.tensor(self.token_ids.stop_ids, device=final.device))
        margin = self.config.truncation_margin
        if margin > 0:  # the reference's rule: response_length >= max_gen_length - margin is truncated
            stopped &= completion.sum(-1) < batch["generated"].sum(-1) - margin
        return stopped

    def trained_rewards(self, batch: TensorDict) -> torch.Tensor:
        """``[R]``: the rewards the advantages are computed from: ``truncated_reward`` for truncated rollouts
        (:meth:`stopped` false; unless null). The rollout source logs them (``rollout/trained_reward``,
        ``rollout/flat_groups``) and dynamic sampling judges flat groups on them."""
        rewards = batch["rewards"].float().clone()
        if self.config.truncated_reward is None:
            return rewards
        return torch.where(self.stopped(batch), rewards, torch.full_like(rewards, self.config.truncated_reward))

    def signal_notes(self, counts: dict[str, float], flattening: bool = False) -> list[str]:
        """Why groups of a rollout carry no learning signal besides their own equal rewards, for the rollout source's
        warnings (``counts``: its global counts ``rows``, ``stopped``, ``groups``, ``dropped``): the truncation rule
        and (unless ``flattening``: only what flattens groups) the accuracy filter."""
        cfg, notes = self.config, []
        rows, stopped = round(counts["rows"]), round(counts["stopped"])
        if cfg.truncated_reward is not None and stopped < rows:
            which = "emitted no stop token" if not cfg.truncation_margin else (
                f"emitted no stop token or reached gen_length - {cfg.truncation_margin} tokens "
                f"(algorithm.truncation_margin)")
            note = (f"algorithm.truncated_reward={cfg.truncated_reward:g} replaced the reward of the {rows - stopped} "
                    f"of {rows} rollouts that {which}")
            if stopped == 0:
                within = "rollout.sampler.gen_length" + (" - algorithm.truncation_margin" if cfg.truncation_margin
                                                         else "")
                note += (f" (none stopped within {within}: raise it, or set "
                         "algorithm.truncated_reward=null to keep their rewards)")
            notes.append(note)
        if cfg.accuracy_filter is not None and counts.get("dropped", 0) and not flattening:
            low, high = cfg.accuracy_filter
            notes.append(f"algorithm.accuracy_filter [{low}, {high}] dropped {round(counts['dropped'])} of "
                         f"{round(counts['groups'])} groups (accuracy outside it)")
        return notes

    def scores(self, batch: TensorDict, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(score [R], keep [R])``: group-normalised rewards after the truncation rule, and the accuracy filter."""
        cfg = self.config
        rewards = self.trained_rewards(batch)
        correct = batch["correct"].bool().clone() if "correct" in batch.keys() else batch["rewards"] > 0
        if cfg.truncated_reward is not None:
            correct &= self.stopped(batch)
        score = group_advantages(rewards, group_size, cfg.advantage, unbiased_std=not cfg.population_std)
        keep = torch.ones_like(correct)
        if cfg.accuracy_filter is not None:
            low, high = cfg.accuracy_filter
            accuracy = correct.float().reshape(-1, group_size).mean(1, keepdim=True)
            keep = ((accuracy >= low) & (accuracy <= high)).expand(-1, group_size).reshape(-1)
        return score, keep

    def trace_views(self, batch: TensorDict, keep: torch.Tensor, rounds: int | None = None):
        """``(noisy_ids [R, K, S], select [R, K, S], shrunk steps [R, S])`` of the trace rows (module docstring)."""
        steps = response_field(batch, batch["step_map"])
        decoded = steps >= 0
        groups = self.block_ids(batch)
        shrunk = shrink_step_map(steps, decoded, self.config.shrink, groups=groups)
        rank = step_ranks(shrunk, decoded, groups)
        trainable = trainable_positions(batch, steps, self.config.post_num) & keep[:, None]
        if rounds is None:
            rounds = int(rank[trainable].max()) + 1 if bool(trainable.any()) else 1
        k = torch.arange(rounds, device=steps.device)[None, :, None]
        hidden = batch["generated"][:, None] & (~decoded[:, None] | (rank[:, None] >= k))
        ids = batch["input_ids"][:, None]
        noisy = torch.where(hidden, torch.full_like(ids, self.token_ids.mask), ids)
        select = trainable[:, None] & (rank[:, None] == k)
        return noisy, select, torch.where(trainable, shrunk, -1)

    def assign_advantages(self, batch: TensorDict, context: RolloutContext) -> TensorDict:
        if not self._bound:
            raise RuntimeError("tracerl: bind_model(model) must run before the rollout (the rows follow its blocks)")
        score, keep = self.scores(batch, context.group_size)
        batch["advantages"] = torch.where(keep, score, 0.0)
        batch["keep"] = keep
        _, select, _ = self.trace_views(batch, keep)
        rounds = context.all_max(select.shape[1])  # every rank runs the same number of rounds (FSDP)
        batch["noisy_ids"], batch["select"], steps = self.trace_views(batch, keep, rounds)
        if self.config.value_model:
            if self.value is None:
                raise ConfigError("algorithm.value_model needs the value model built by the trainer "
                                  "(auxiliary_models)")
            values = context.evaluate(self.rollout_values, batch)
            advantages, returns = torch.zeros_like(values), torch.zeros_like(values)
            for row in range(values.shape[0]):
                tokens = steps[row] >= 0
                if not bool(tokens.any()):
                    continue
                reward = torch.where(steps[row] == steps[row][tokens].max(), batch["advantages"][row], 0.0)
                advantages[row], returns[row] = tracerl_token_advantages(reward, values[row], steps[row],
                                                                         self.config.gamma, self.config.lam)
            batch["token_advantages"], batch["returns"], batch["old_values"] = advantages, returns, values
        return batch

    # ---- hooks ---------------------------------------------------------------------------------------------
    def totals(self, batch: TensorDict):
        out = super().totals(batch)
        out["rows"] = batch["select"].any(-1).sum().to(torch.float64)
        out["trace_tokens"] = batch["select"].sum().to(torch.float64)
        return out

    def row_weights(self, batch: TensorDict, k: int, totals) -> tuple[torch.Tensor, torch.Tensor]:
        """``(surrogate weights, KL weights) [R, S]`` of round ``k`` (normalisation of the module docstring)."""
        select = batch["select"][:, k].float()
        rows = totals["rows"].clamp(min=1).float()
        if self.normalizer == "length":
            weight = select / batch["generated"].sum(-1, keepdim=True).float() / rows
            return weight, weight
        return select / select.sum(-1, keepdim=True).clamp(min=1) / rows, select / rows

    def loss_term(self, batch: TensorDict, estimates: TensorDict, k: int, totals):
        cfg = self.config
        logp = estimates["logp"]
        old = self.old_term(batch, "logp", k, logp)
        adv = batch["token_advantages"] if "token_advantages" in batch.keys() else batch["advantages"][:, None]
        per_token, clipped = clipped_surrogate(logp, old, adv.float(), cfg.clip_low, cfg.clip_high, cfg.dual_clip,
                                               log_ratio_clamp=LOG_RATIO_CLAMP)
        weight, kl_weight = self.row_weights(batch, k, totals)
        loss = (per_token * weight).sum()
        tokens = totals["trace_tokens"].clamp(min=1).float()
        select = batch["select"][:, k]
        metrics = {"policy/clip_frac": (clipped & select).float().sum().detach() / tokens,
                   "policy/logp": (logp.detach() * select).sum() / tokens}
        if cfg.kl_coef > 0:
            kl = kl_estimate(logp, old, cfg.kl_estimator)
            loss = loss + cfg.kl_coef * (kl * kl_weight).sum()
            metrics["policy/kl"] = (kl.detach() * select).sum() / tokens
        return loss, metrics

    def value_loss_term(self, batch: TensorDict, k: int, totals):
        """The clipped value loss of round ``k`` (``sum / L1``, mean over the rows of the global batch)."""
        values = self.value_term(batch, k)
        old, returns = batch["old_values"], batch["returns"]
        clipped = old + (values - old).clamp(-self.config.value_clip, self.config.value_clip)
        per_token = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
        select = batch["select"][:, k].float()
        rows = totals["rows"].clamp(min=1).float()
        loss = (per_token * select / batch["generated"].sum(-1, keepdim=True).float()).sum() / rows
        tokens = totals["trace_tokens"].clamp(min=1).float()
        return loss, {"value/loss": loss.detach(), "value/mean": (values.detach() * select).sum() / tokens}

    def backward(self, model, batch: TensorDict, totals) -> dict:
        metrics = super().backward(model, batch, totals)
        if self.value is not None:
            for k in range(self.num_terms(batch)):
                loss, m = self.value_loss_term(batch, k, totals)
                loss.backward()
                for key, value in m.items():
                    metrics[key] = metrics.get(key, 0.0) + value
        return metrics
