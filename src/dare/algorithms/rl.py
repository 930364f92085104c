"""The shared base of the RL plug-ins (GRPO family): configs, the advantage hook, model-facing estimators and
the token-level PPO loss. Every RL algorithm is one module subclassing :class:`RLAlgorithm`.

Rollout micro-batches (built by :class:`dare.trainer.rl.RolloutSource`) are ``TensorDict`` s with ``R`` rows of
``S = P + G`` tokens (left-padded prompt, then the ``G`` generated positions):

* ``input_ids [R, S]`` (undecoded positions after an early stop hold EOS), ``attention_mask [R, S]``,
  ``prompt_mask [R, S]`` (real prompt tokens), ``generated [R, S]`` (the completion region),
  ``completion_mask [R, S]`` (up to the first EOS inclusive), ``example_index [R, S]`` (the rollout's global
  index in the step on every real token, -1 on padding), ``rollout_index [R]``, ``group_size [R]``;
* ``rewards [R]``, ``correct [R]`` (the reward's accuracy flag), ``advantages [R]`` (set by
  :meth:`RLAlgorithm.assign_advantages`), ``temperature [R]``, ``rollout_logprobs [R, G]``;
* ``step_map [R, G]`` (the step each completion position was committed at, -1 = never decoded) and, from block
  samplers, ``block_step_map [R, G]`` (the step counted from the start of the token's block);
* with ``needs.trajectory``: ``traj_states``, ``traj_predictions``, ``traj_confidences``, ``traj_transfers``,
  ``traj_candidates`` ``[R, T, G]`` and ``traj_step_mask [R, T]`` (:class:`dare.rollout.Trajectory`);
* after ``corrupt``: the algorithm's views; after the workflow: ``old_<key>`` / ``ref_<key>`` for every key
  of :attr:`RLAlgorithm.logprob_keys`.

Loss contributions are normalised by global totals (:meth:`totals`), so they sum over micro-batches and ranks
to the global-batch objective. Metrics follow the same rule (each is a global mean once summed).

Model families: estimators score their views with :meth:`RLAlgorithm.logp` (:func:`forward_logp`), i.e. the
family's training denoiser: full attention reads the view; block-causal families (SDAR, LLaDA2) run the
``[noisy ; clean]`` layout on the model's block grid (:attr:`RLAlgorithm.blocks`, resolved by ``bind_model`` and
checked against the sampler's block length), so block ``b`` of a view is predicted from itself and the clean
earlier blocks, the context the block sampler had.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch
from tensordict import TensorDict

from dare.algorithms.base import Algorithm, AlgorithmConfig, Needs, check_settings
from dare.algorithms.functional import ADVANTAGE_MODES, KL_ESTIMATORS, clipped_surrogate, group_advantages, kl_estimate
from dare.algorithms.logprobs import DEFAULT_LOGITS_CHUNK, BlockLayout, masked_logprobs, model_inputs
from dare.errors import ConfigError, unknown_choice

STREAM_PROMPT = 2  # example_generator stream of prompt masking (0 = response masks, 1 = stratification)
ADVANTAGE_BASELINES = {"mean": "reward minus the group's mean", "zscore": "the reward's z-score within the group",
                       "loo": "reward minus the mean of the group's other rewards"}
"""What each group-relative ``algorithm.advantage`` compares a reward with (:meth:`RLAlgorithm.group_baseline`)."""


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
    block_size: int | None = None
    """Block-causal families (SDAR, LLaDA2): block length of the [noisy ; clean] training forward; null = the
    model's. Must equal rollout.sampler.block_length (blocks anchored at position 0, as the block samplers)."""

    def __post_init__(self):
        if self.advantage not in ADVANTAGE_MODES:
            raise unknown_choice("value for algorithm.advantage", self.advantage, ADVANTAGE_MODES)
        check_settings(self, {"inner_steps": (lambda v: v >= 1, ">= 1"),
                              "block_size": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)
                                                                     and v >= 1), "a positive integer (or null)")})


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
        check_settings(self, {"clip_low": (lambda v: 0 <= v < 1, "in [0, 1)"),
                              "clip_high": (lambda v: v is None or v >= 0, ">= 0 (or null: clip_low)"),
                              "dual_clip": (lambda v: v is None or v > 1, "> 1 (or null)"),
                              "kl_coef": (lambda v: v >= 0, ">= 0")})


# --------------------------------------------------------------------------------------------- context
@dataclass
class RolloutContext:
    """What the advantage hook may use besides the batch.

    Attributes:
        group_size: G (rows ``g*G .. g*G+G-1`` of the batch are one prompt's group).
        score: ``score(token_ids [N, L]) -> rewards [N]``: decode completions (up to the first stop token) and
            score them with the run's reward against the rows' samples (MDPO's per-step rewards).
        all_reduce: sum a tensor over ranks (identity in one process); e.g. global step statistics.
        all_max: the maximum of an int over ranks (e.g. a number of replay terms every rank must run).
        evaluate: ``evaluate(fn, batch) -> Tensor``: ``fn(micro_batch)`` on the training device over micro-batches
            of ``batch`` without gradients (under the trainer's precision), outputs concatenated along dim 0
            on the CPU; e.g. a value model's predictions at rollout time.
        samples: the rows' reward samples (ground truth, e.g. a reference reasoning).
        encode: ``encode(text) -> list[int]`` token ids (no special tokens) with the run's tokenizer.
        regenerate: ``regenerate(index, canvas, attempt=1) -> TensorDict``: rows ``index`` of the batch decoded
            again by the current policy from ``canvas [n, G]`` (``dare.rollout.generate``'s canvas: given tokens
            are kept, masks decoded), with a random stream of their own (``attempt``), assembled in the batch layout
            (``given`` marks the canvas tokens) with ``rewards`` and ``correct``; e.g. IGPO's inpainted re-rolls.
        rollout: the rollout number (seeds per-rollout choices such as hint sampling).
    """

    group_size: int
    score: Callable[[torch.Tensor], torch.Tensor]
    all_reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
    all_max: Callable[[int], int] = lambda n: n
    evaluate: Callable[[Callable[[TensorDict], torch.Tensor], TensorDict], torch.Tensor] = \
        lambda fn, batch: torch.no_grad()(fn)(batch)
    samples: list | None = None
    encode: Callable[[str], list[int]] | None = None
    regenerate: Callable[..., TensorDict] | None = None
    rollout: int = 0


# --------------------------------------------------------------------------------------------- estimators
def forward_logp(model, batch: TensorDict, noisy_ids: torch.Tensor, select: torch.Tensor,
                 targets: torch.Tensor | None = None, *, attn_backend: str | None = None,
                 temperature: torch.Tensor | float | None = None, chunk_size: int = DEFAULT_LOGITS_CHUNK,
                 blocks: BlockLayout | None = None, sequence=None, banned: tuple[int, ...] = ()) -> torch.Tensor:
    """``log p(target_j | noisy_ids)`` (fp32) at ``select`` positions, 0 elsewhere.

    ``noisy_ids`` is ``[R, S]`` or ``[R, n, S]`` (``n`` views per row, evaluated in one forward of ``R*n`` rows
    sharing the row's attention mask); ``select`` and ``targets`` (default ``input_ids``) broadcast to it.
    ``temperature`` divides the logits (per row ``[R]`` or a float), as MDPO does with the rollout temperature;
    ``banned`` token ids are removed from the distribution (the samplers' proposals never include the mask token).

    The denoiser is the family's (:func:`~dare.algorithms.logprobs.masked_logprobs`): full-attention families
    read ``noisy_ids`` alone; block-causal families run the ``[noisy ; clean]`` layout with ``blocks``, where
    block ``b`` of the view is predicted from itself and the clean blocks before it. The clean copy is the
    clean response (``generated`` / ``maskable``) after the view's prompt, so prompt masking (d1, SPG) hits the
    context every block sees. The LM head runs on the selected positions only, ``chunk_size`` rows at a time
    (0 = full logits, the plain path); ``sequence`` shards the forward over a sequence-parallel group (the
    result is the same). Algorithms call it through :meth:`RLAlgorithm.logp` (or pass
    ``**self.forward_options``).
    """
    input_ids = batch["input_ids"]
    targets = input_ids if targets is None else targets
    rows, length = input_ids.shape
    n = 1 if noisy_ids.ndim == 2 else noisy_ids.shape[1]
    shape = noisy_ids.shape

    def flat(t: torch.Tensor) -> torch.Tensor:  # [R, S] or [R, n, S] -> [R*n, S]
        return (t if t.ndim == len(shape) else t[:, None]).expand(shape).reshape(rows * n, length)

    noisy, clean = noisy_ids.reshape(rows * n, length), flat(input_ids)
    response = next((batch[k] for k in ("generated", "maskable") if k in batch.keys()), None)
    if response is not None:  # the view's prompt (masked or not), then the clean response
        clean = torch.where(flat(response), clean, noisy)
    layout = model_inputs(batch)
    if "attention_mask" in layout:
        layout["attention_mask"] = layout["attention_mask"].repeat_interleave(n, 0)
    if temperature is not None:
        temperature = torch.as_tensor(temperature, dtype=torch.float32, device=input_ids.device)
        if temperature.ndim == 1:
            temperature = temperature.repeat_interleave(n, 0)
    out = masked_logprobs(model, noisy, clean, flat(select),
                          targets=flat(targets), blocks=blocks, attn_backend=attn_backend, chunk_size=chunk_size,
                          temperature=temperature, sequence=sequence, banned=banned, **layout)
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
    attentions: ClassVar[tuple[str, ...]] = ("full", "block_causal")
    """Model attention topologies (``FamilySpec.attention``) the estimator is defined for."""
    replays_steps: ClassVar[bool] = False
    """Whether views are rebuilt from the rollout's step maps (each position committed once: no token editing)."""
    advantage_dims: ClassVar[int | None] = 1
    """Dimensions of the ``batch["advantages"]`` that :meth:`assign_advantages` sets and the loss reads: 1 = one
    per rollout (``[R]``), 2 = e.g. one per rollout and trained step (MDPO); None: not checked. The trainer refuses
    other shapes, a non-float or non-finite tensor, in one line (an ``[R, 1]`` tensor broadcast against per-token
    log-probs would train on a gradient of about zero)."""
    _bound: bool = False

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        kl = getattr(config, "kl_coef", 0.0) > 0
        self.needs = dataclasses.replace(
            type(self).needs, reference=type(self).needs.reference or kl,
            old_logprobs=self.uses_ratio and self.inner_steps > 1)

    @property
    def inner_steps(self) -> int:
        return getattr(self.config, "inner_steps", 1)

    @classmethod
    def group_baseline(cls, config) -> str | None:
        """Why the advantages compare each rollout with the others of its prompt's group (then a group of one rollout
        trains nothing), or None when they do not: every ``algorithm.advantage`` but ``none`` (the raw reward)."""
        advantage = getattr(config, "advantage", "none")
        if advantage == "none":
            return None
        return (f"its advantages are relative to the group (algorithm.advantage={advantage}: "
                f"{ADVANTAGE_BASELINES[advantage]})")

    @classmethod
    def check_group_size(cls, config, group_size: int) -> None:
        """A group of one rollout trains nothing when the advantages are relative to the group
        (:meth:`group_baseline`): a one-line error instead of a run whose every advantage is 0."""
        baseline = cls.group_baseline(config)
        if group_size < 2 and baseline is not None:
            raise ConfigError(f"rollout.group_size={group_size} trains nothing with algorithm {cls.name}: "
                              f"{baseline}, so one rollout per prompt gives no learning signal; use "
                              "rollout.group_size >= 2")

    # ---- model binding -------------------------------------------------------------------------------
    def bind_model(self, model) -> None:
        """Resolve the block layout of a block-causal family (``block_size`` or the model's); reject a family
        whose attention the estimator is not defined for, and ``block_size`` on full-attention families."""
        from dare.models.loading import unwrap
        from dare.models.spec import family_of

        spec = family_of(model)
        self.check_family(self.config, spec)
        size = getattr(self.config, "block_size", None)
        if spec.attention == "block_causal":
            self.blocks = BlockLayout(size or unwrap(model).block_size or spec.block_size)
        else:
            self.blocks = None
        self._bound = True

    @classmethod
    def check_family(cls, config, spec) -> None:
        """Reject a family whose attention the estimator is not defined for (:attr:`attentions`), and
        ``algorithm.block_size`` on a full-attention family."""
        from dare.models.spec import FAMILIES

        if spec.attention not in cls.attentions:
            fits = ", ".join(sorted(n for n, f in FAMILIES.items() if f.attention in cls.attentions))
            kinds = " or ".join(a.replace("_", "-") for a in cls.attentions)
            raise ConfigError(f"algorithm '{cls.name}' needs a {kinds} model family ({fits}); {spec.name} is "
                              f"{spec.attention.replace('_', '-')}")
        if spec.attention != "block_causal" and getattr(config, "block_size", None) is not None:
            raise ConfigError(f"algorithm.block_size applies to block-causal families; {spec.name} uses full attention")

    def ensure_bound(self, model) -> None:
        if not self._bound:
            self.bind_model(model)

    def check_rollout(self, model, sampler) -> None:
        """Called by the rollout source with the policy and the resolved ``SamplerConfig``: bind the model and
        check that training sees the blocks the sampler decoded (one-line ``ConfigError``)."""
        self.ensure_bound(model)
        if self.blocks is not None and sampler.block_length != self.blocks.size:
            raise ConfigError(f"rollout.sampler.block_length={sampler.block_length} differs from the training block "
                              f"length {self.blocks.size} (algorithm.block_size or the model's); they must match")
        if self.replays_steps and sampler.editing_threshold:
            raise ConfigError(f"{self.name} replays each position's single commit; LLaDA2.1 token editing rewrites "
                              "positions: set rollout.sampler.editing_threshold=0 (or sampler llada21_speed)")

    def block_ids(self, batch: TensorDict) -> torch.Tensor:
        """``[R, S]`` block of every column on the model's grid (``position // block_size``, positions counting
        real tokens, as the block samplers); all 0 for full-attention families (one block)."""
        mask = batch["attention_mask"].long()
        if self.blocks is None:
            return torch.zeros_like(mask)
        return (mask.cumsum(-1) - 1).clamp(min=0) // self.blocks.size

    def logp(self, model, batch: TensorDict, noisy_ids: torch.Tensor, select: torch.Tensor,
             targets: torch.Tensor | None = None, temperature=None, banned: tuple[int, ...] = ()) -> torch.Tensor:
        """:func:`forward_logp` with this algorithm's attention backend, logits chunk size and block layout."""
        self.ensure_bound(model)
        return forward_logp(model, batch, noisy_ids, select, targets, temperature=temperature, banned=banned,
                            **self.forward_options)

    # ---- hooks of the rollout source -----------------------------------------------------------------
    def generate(self, model, prompts: torch.Tensor, attention_mask: torch.Tensor, sampler, *, example_ids,
                 group_size: int, progress: bool = False, canvas: torch.Tensor | None = None):
        """The rollouts of a chunk of rows (``example_ids``: the rows' global indices; rows ``g*G .. g*G+G-1`` of
        the step are one prompt's group; ``canvas``: a starting completion, see :func:`dare.rollout.generate`):
        one :func:`dare.rollout.generate` call. Tree rollouts (d-TreeRPO) override it, through the same public
        API."""
        from dare.rollout import generate

        return generate(model, prompts, attention_mask, sampler, example_ids=example_ids, progress=progress,
                        canvas=canvas)

    def refine_rollouts(self, batch: TensorDict, context: RolloutContext) -> tuple[TensorDict, dict]:
        """Called after scoring, before :meth:`assign_advantages`: may replace rows (e.g. IGPO's inpainted
        re-rolls of groups where every rollout failed). Returns the batch and step metrics (global values, already
        reduced over ranks). Default: unchanged, no metrics."""
        return batch, {}

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
                       weights: torch.Tensor, ref_logp: torch.Tensor | None = None,
                       kl_weights: torch.Tensor | None = None):
        """``sum_j w_j [-min(rho A, clip(rho) A)] + beta sum_j v_j KL_j`` and its metrics (``w`` holds the
        normaliser; ``v`` = ``kl_weights``, default ``w``: a KL term normalised by its own count)."""
        cfg = self.config
        per_token, clipped = clipped_surrogate(logp, old_logp, advantages, cfg.clip_low, cfg.clip_high, cfg.dual_clip)
        loss = (per_token * weights).sum()
        metrics = {"policy/clip_frac": (clipped.float() * weights).sum().detach()}
        if cfg.kl_coef > 0:
            kl = (kl_estimate(logp, ref_logp, cfg.kl_estimator) * (weights if kl_weights is None else kl_weights)).sum()
            loss = loss + cfg.kl_coef * kl
            metrics["policy/kl"] = kl.detach()
        metrics["policy/logp"] = (logp.detach() * weights).sum()
        return loss, metrics


class TermwiseMixin:
    """For losses that are a **sum** of independent terms (MC samples, denoising steps): one forward and one
    backward per term, so memory is that of one graph (algorithms.md §0.2 pitfall 3, BGPO, CJ-GRPO, MDPO).

    Subclasses implement ``loss_term(batch, estimates_k, k, totals) -> (loss, metrics)`` and, when their views are
    not the default ones, ``num_terms(batch)`` and ``estimate_term(model, batch, k) -> TensorDict [R, ...]``; by
    default term ``k`` is the view ``noisy_ids[:, k]`` scored at ``select[:, k]`` (``{"logp": [R, L]}``).
    ``estimate`` stacks the terms along dim 1 (used for old / reference estimates and by tests), ``loss`` sums
    them, and ``backward`` runs term by term; the gradients are identical (linearity).
    """

    def num_terms(self, batch: TensorDict) -> int:
        return batch["noisy_ids"].shape[1]

    def estimate_term(self, model, batch: TensorDict, k: int) -> TensorDict:
        logp = self.logp(model, batch, batch["noisy_ids"][:, k], batch["select"][:, k])
        return TensorDict({"logp": logp}, batch_size=batch.batch_size)

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

    @classmethod
    def old_term(cls, batch: TensorDict, key: str, k: int, current: torch.Tensor) -> torch.Tensor:
        """Term ``k`` of the stored old estimate ``old_<key>``, or (an on-policy update: none stored) ``current``
        detached: the per-term form of :meth:`RLAlgorithm.old_or_detached`."""
        name = f"old_{key}"
        return cls.term(batch, name, k) if name in batch.keys() else current.detach()


def response_field(batch: TensorDict, values: torch.Tensor, fill: int = -1) -> torch.Tensor:
    """A per-completion-position field ``[R, G]`` (e.g. ``step_map``) spread over the batch columns ``[R, S]``."""
    out = torch.full(batch["input_ids"].shape, fill, dtype=values.dtype, device=values.device)
    out[batch["generated"].to(values.device)] = values.reshape(-1)
    return out


__all__ = ["GroupConfig", "PPOConfig", "RLAlgorithm", "RolloutContext", "STREAM_PROMPT", "TermwiseMixin",
           "forward_logp", "response_field"]
