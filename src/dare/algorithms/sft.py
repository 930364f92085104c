"""Diffusion SFT for every family: the masked-diffusion NELBO (``algorithms.md`` 1.1) on full-attention MDLMs
(LLaDA, Dream, LLaDA-MoE) and the block-diffusion NELBO (1.2) on block-causal families (SDAR, SDAR-MoE, LLaDA2).

Both share the corruption (prompt never masked, noise seeded per example), the global-batch normalisers and the
loss ``L = sum_j w_j (-log p(y_j | .))``; only the denoiser differs, chosen from the family's attention topology
(:func:`dare.algorithms.logprobs.denoising_logits`): block-causal families run ONE forward over ``[z ; x]`` and
score the noisy half only, so block ``b`` is predicted from the noisy block and the clean blocks before it.

Reference settings (block-causal families; ``algorithms.md`` 1.2):

* SDAR: ``t`` per sample in ``[1e-3, 1]``, ``1/t``, ``/ #answer tokens`` -> ``normalize=d1`` (the defaults otherwise).
* BD3LM: ``t`` per block -> ``per_block_t=true normalize=d1``.
* LLaDA2 (DARE): ``t ~ U[0.3, 0.8]`` per sample, unweighted mean over masked tokens ->
  ``t_min=0.3 t_max=0.8 inverse_t=false normalize=masked``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDict

from dare.algorithms.base import Algorithm, AlgorithmConfig, check_settings, register_algorithm, settings_error
from dare.algorithms.logprobs import BlockLayout, masked_logprobs, model_inputs, prompt_lengths_of
from dare.diffusion import ForwardProcess, corrupt, nelbo_totals, nelbo_weights
from dare.errors import ConfigError, unknown_choice


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
    """Weight each masked token by 1/p_mask (the NELBO); false = unweighted CE (yjyddq/DARE's LLaDA2 SFT)."""
    block_size: int | None = None
    """Block-causal families: block length of the [noisy ; clean] training layout (and of per_block_t); null = the
    model's (config.json block_size, else the family default: SDAR 4, LLaDA2 32). Must match inference."""
    block_origin: str = "global"
    """Block-causal families: where block 0 starts: global (position 0, as the SDAR / LLaDA2 samplers) or
    response (the response starts a fresh block)."""
    per_block_t: bool = False
    """Block-causal families: one masking ratio per block (BD3LM) instead of one per sequence (SDAR, LLaDA2)."""

    def __post_init__(self):
        from dare.diffusion.elbo import ALIASES, NORMALIZATIONS
        from dare.diffusion.forward import SCHEDULES
        from dare.models.block_diffusion import BLOCK_ORIGINS

        choices = {"schedule": SCHEDULES, "normalize": (*NORMALIZATIONS, *ALIASES), "block_origin": BLOCK_ORIGINS}
        for key, options in choices.items():
            if getattr(self, key) not in options:
                raise unknown_choice(f"value for algorithm.{key}", getattr(self, key), options)
        check_settings(self, {"block_size": (lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)
                                                                     and v >= 1), "a positive integer (or null)")})
        if not 0.0 < self.t_min <= self.t_max <= 1.0:
            raise settings_error(self, "must satisfy 0 < t_min <= t_max <= 1", "t_min", "t_max")
        _ = self.process()  # ForwardProcess's own checks

    def process(self, block_size: int | None = None) -> ForwardProcess:
        """The forward process; ``block_size`` (the resolved block length) is used only with ``per_block_t``."""
        per_block = block_size if self.per_block_t else None
        return ForwardProcess(schedule=self.schedule, t_low=self.t_min, t_high=self.t_max, block_size=per_block,
                              block_origin=self.block_origin)


@register_algorithm
class SFT(Algorithm):
    """``L = sum_j w_j (-log p(y_j | z))``, ``w = 1[masked] / p_mask / normaliser`` (prompt never masked)."""

    name = "sft"
    config_class = SFTConfig
    _bound: bool = False

    def bind_model(self, model) -> None:
        """Resolve the block layout of a block-causal family; reject block options on full-attention ones."""
        from dare.models.spec import family_of

        cfg = self.config
        spec = family_of(model)
        self.check_family(cfg, spec)
        if spec.attention == "block_causal":
            self.blocks = BlockLayout(cfg.block_size or getattr(model, "block_size", None) or spec.block_size,
                                      cfg.block_origin)
            _record_block_size(model, self.blocks.size)
        else:
            self.blocks = None
        self._bound = True

    @classmethod
    def check_family(cls, config, spec) -> None:
        """Reject block options (``block_size``, ``per_block_t``, ``block_origin``) on a full-attention family."""
        from dare.models.spec import FAMILIES

        if spec.attention == "block_causal":
            return
        for key, value, default in (("block_size", config.block_size, None), ("per_block_t", config.per_block_t, False),
                                    ("block_origin", config.block_origin, "global")):
            if value != default:
                block_causal = ", ".join(sorted(n for n, f in FAMILIES.items() if f.attention == "block_causal"))
                raise ConfigError(f"algorithm.{key} applies to block-causal families ({block_causal}); "
                                  f"{spec.name} uses full attention")

    def corrupt(self, batch: TensorDict, step: int) -> TensorDict:
        if self.config.per_block_t and not self._bound:
            raise ConfigError("algorithm.per_block_t needs the model's block length: call bind_model(model) first")
        process = self.config.process(self.blocks.size if self.blocks is not None else None)
        views = corrupt(batch["input_ids"], batch["maskable"], batch["example_index"], self.token_ids.mask,
                        seed=self.seed, step=step, process=process)
        batch.update(views.as_dict())
        return batch

    def totals(self, batch: TensorDict) -> dict[str, torch.Tensor]:
        return nelbo_totals(batch["mask"], batch["maskable"], batch["example_index"])

    def estimate(self, model, batch: TensorDict) -> TensorDict:
        if not self._bound:
            self.bind_model(model)
        layout = model_inputs(batch)
        starts = None
        if self.blocks is not None and self.blocks.origin == "response":
            starts = prompt_lengths_of(batch["maskable"], layout.get("cu_seqlens"))
        logp = masked_logprobs(model, batch["noisy_ids"], batch["input_ids"], batch["mask"], prompt_lengths=starts,
                               **self.forward_options, **layout)
        return TensorDict({"logp": logp}, batch_size=batch.batch_size)

    def loss(self, batch: TensorDict, estimates: TensorDict, totals: dict[str, torch.Tensor]):
        weights = nelbo_weights(batch["mask"], batch["p_mask"], batch["maskable"], batch["example_index"],
                                totals, self.config.normalize, self.config.inverse_t).to(estimates["logp"].device)
        loss = -(weights * estimates["logp"]).sum()
        logp = estimates["logp"].detach()
        nll = -torch.where(batch["mask"], logp, torch.zeros((), dtype=logp.dtype, device=logp.device)).sum()
        metrics = {"loss": loss.detach(), "nll_masked": nll}  # no boolean indexing: no host sync
        return loss, metrics


def _record_block_size(model, size: int) -> None:
    """Make ``model``'s config say the block length it is trained with, so that the checkpoints this run saves
    (config.json) decode in it (:func:`dare.rollout.resolve_config` takes a block sampler's length from there),
    as does anything that decodes the model during the run; one warning when it changes the checkpoint's own."""
    import logging

    before = getattr(model, "block_size", None)  # config.json's, else the family's
    if before == size:
        return
    model.config.block_size = size
    logging.getLogger("dare.trainer").warning(
        "warning: training with algorithm.block_size=%d on a checkpoint configured for block size %s; saved checkpoints "
        "record block_size=%d in config.json, so decoding them uses it (a LoRA adapter carries no config.json: decode "
        "it with block_length=%d)", size, before, size, size)
