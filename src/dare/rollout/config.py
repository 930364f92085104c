"""``SamplerConfig``: every knob of diffusion decoding in one typed dataclass.

Fields left as ``None`` take the value of the named sampler's preset (:mod:`dare.rollout.samplers`), so
``SamplerConfig(sampler="fastdllm", cache="dual")`` is Fast-dLLM's recipe with a dual cache. Caching
(``cache``), the selection rule (``decoder``), the transfer schedule (``schedule``) and the confidence
(``confidence``) are independent choices.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from dare.errors import ConfigError, closest
from dare.rollout.kernels import (
    CONFIDENCE_ALIASES,
    CONFIDENCE_DTYPES,
    CONFIDENCE_SOURCES,
    CONFIDENCES,
    DECODERS,
    SCHEDULES,
)


@dataclass
class SamplerConfig:
    """Settings of one rollout (see the field docstrings; ``None`` = the sampler preset's value)."""

    sampler: str = "llada"
    """Preset name: ``llada``, ``dream``, ``fastdllm``, ``fastdllm_dream`` (``dare.rollout.SAMPLERS``)."""

    gen_length: int = 128
    """Number of generated positions ``G`` (the canvas is prompt + ``G`` mask tokens)."""

    block_length: int | None = None
    """Semi-autoregressive block length ``Lb`` (must divide ``gen_length``); blocks are decoded left to
    right. Preset: 32 for ``llada``/``fastdllm`` (one block when ``gen_length < 32``), ``gen_length`` (one
    block) for ``dream``."""

    steps: int | None = None
    """Denoising steps over the whole generation for the ``quota``/``dynamic`` decoders (a multiple of the
    number of blocks; ``steps / num_blocks`` per block). Default: ``gen_length`` (one token per step).
    Threshold/factor decoders run until each block is filled and ignore it."""

    temperature: float = 0.0
    """Sampling temperature; 0 is an explicit argmax path."""

    top_p: float | None = None
    """Nucleus filter applied after the temperature (None or 1 = off)."""

    top_k: int | None = None
    """Top-k filter applied after top-p (None or 0 = off)."""

    confidence: str | None = None
    """Score ranking candidates: ``prob`` (probability of the proposed token), ``margin`` (top-1 minus
    top-2 probability), ``neg_entropy``, ``random``. Reference names are accepted: ``low_confidence``,
    ``maskgit_plus`` -> prob, ``topk_margin`` -> margin, ``entropy`` -> neg_entropy."""

    confidence_source: str | None = None
    """Distribution the confidence is computed from: ``logits`` (raw model distribution at T=1, LLaDA and
    Fast-dLLM) or ``sampling`` (after temperature/top-p/top-k, Dream)."""

    confidence_dtype: str | None = None
    """Precision of the confidence softmax: ``model`` (logits dtype, LLaDA/Dream), ``float32``, ``float64``
    (Fast-dLLM)."""

    schedule: str | None = None
    """Tokens per step for quota decoding: ``linear`` (LLaDA: ``n // s`` plus a front-loaded remainder) or
    ``timestep`` (Dream: ``floor(n_masked * (1 - s/t))`` on ``linspace(1, eps, s + 1)``)."""

    eps: float = 1e-3
    """Final time of the ``timestep`` schedule (Dream's ``eps``)."""

    decoder: str | None = None
    """Selection rule: ``quota`` (top-k by schedule), ``threshold`` (Fast-dLLM: all with confidence >=
    threshold, at least the top-1), ``factor`` (Fast-dLLM factor rule), ``dynamic`` (all with confidence >
    threshold if at least the scheduled count, else top-k by schedule). Default: ``factor`` if ``factor``
    is set, else ``threshold`` if ``threshold`` is set, else the preset's."""

    threshold: float | None = None
    """Confidence threshold of the ``threshold``/``dynamic`` decoders (default 0.9)."""

    factor: float | None = None
    """Factor ``f`` of the ``factor`` decoder (commit the longest prefix with ``c_(n) >= 1 - f/(n+1)``;
    default 1.0)."""

    factor_last_rank_quirk: bool = False
    """Reproduce dInfer's factor code, which commits all candidates when only the last rank fails."""

    cache: str | None = None
    """KV caching: ``none`` (full forward every step), ``prefix`` (Fast-dLLM prefix cache: prompt and
    finished blocks cached at each block start, the rest recomputed), ``dual`` (Fast-dLLM dual cache: prefix
    and masked suffix cached, only the current block recomputed)."""

    refresh_every: int = 0
    """With a cache, also recompute the full canvas (and the cache) every N forwards inside a block;
    0 = only at block starts (Fast-dLLM). 1 makes cached decoding identical to ``cache=none``."""

    suppress_eos: bool = False
    """Set the EOS logit to -inf before sampling (LLaDA's ``logits_eos_inf``, used for code benchmarks)."""

    eos_early_stop: bool = True
    """Stop decoding a row once its first stop token (EOS/EOT) is committed and every position before it is
    decoded; the loop ends when every row has stopped. Tokens up to the first stop are unaffected; the
    undecoded positions after it hold the pad id."""

    record_trajectory: bool = False
    """Record every step's state, predictions, confidences and committed set (MDPO, CJ-GRPO, TraceRL)."""

    seed: int = 0
    """Base seed; row ``i`` samples from a generator seeded by ``(seed, example_id[i])``."""

    max_blocks: int | None = None
    """Decode only the first N blocks (benchmarks/debugging); the rest stays undecoded (pad id)."""

    full_logits: bool = False
    """Compute logits for the whole canvas inside the model's forward (for wrappers such as FSDP that only
    gather weights there). Default: run the LM head only on the rows of the current block."""

    attn_backend: str | None = None
    """Attention backend passed to the model (``sdpa`` by default)."""

    # ---------------------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, values: dict) -> SamplerConfig:
        """Build from a mapping; an unknown key is a one-line error naming the closest valid key."""
        names = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in names:
                hint = closest(key, names)
                raise ConfigError(f"unknown sampler option '{key}'" + (f" (did you mean '{hint}'?)" if hint else ""))
        return cls(**values)

    def replace(self, **changes) -> SamplerConfig:
        """A copy with ``changes`` (unknown names are one-line errors)."""
        merged = dataclasses.asdict(self)
        merged.update(changes)
        return SamplerConfig.from_dict(merged)

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    def resolved(self) -> SamplerConfig:
        """Fill ``None`` fields from the sampler preset, normalise aliases and validate (``ConfigError``)."""
        from dare.rollout.samplers import get_sampler

        preset = get_sampler(self.sampler)
        values = dataclasses.asdict(self)
        for key, value in preset.defaults.items():
            if values.get(key) is None:
                values[key] = value
        if values["block_length"] is None or (self.block_length is None and values["block_length"] > self.gen_length):
            values["block_length"] = values["gen_length"]  # a preset's block longer than the generation: one block
        if values["steps"] is None:
            values["steps"] = values["gen_length"]
        if self.decoder is None:
            if self.factor is not None:
                values["decoder"] = "factor"
            elif self.threshold is not None:
                values["decoder"] = "threshold"
        if values["threshold"] is None:
            values["threshold"] = 0.9
        if values["factor"] is None:
            values["factor"] = 1.0
        if values["confidence"] in CONFIDENCE_ALIASES:
            values["confidence"] = CONFIDENCE_ALIASES[values["confidence"]]
        config = SamplerConfig(**values)
        config.validate()
        return config

    def validate(self) -> None:
        """Check a resolved config; every problem is a one-line :class:`ConfigError`."""
        from dare.rollout.caching import CACHES

        def choice(key: str, options) -> None:
            value = getattr(self, key)
            if value not in options:
                hint = closest(str(value), options)
                raise ConfigError(
                    f"unknown {key} '{value}'" + (f" (did you mean '{hint}'?)" if hint else "")
                    + f"; choose from: {', '.join(sorted(options))}"
                )

        choice("confidence", list(CONFIDENCES))
        choice("confidence_source", list(CONFIDENCE_SOURCES))
        choice("confidence_dtype", list(CONFIDENCE_DTYPES))
        choice("schedule", list(SCHEDULES))
        choice("decoder", list(DECODERS))
        choice("cache", list(CACHES))
        if self.gen_length < 1:
            raise ConfigError(f"gen_length must be >= 1; got {self.gen_length}")
        if not 1 <= self.block_length <= self.gen_length or self.gen_length % self.block_length:
            raise ConfigError(
                f"block_length ({self.block_length}) must divide gen_length ({self.gen_length})"
            )
        if self.steps < 1:
            raise ConfigError(f"steps must be >= 1; got {self.steps}")
        if self.decoder in ("quota", "dynamic") and self.steps % self.num_blocks:
            raise ConfigError(
                f"steps ({self.steps}) must be a multiple of the number of blocks "
                f"(gen_length / block_length = {self.num_blocks})"
            )
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0; got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1]; got {self.top_p}")
        if self.top_k is not None and self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0 (0 = off); got {self.top_k}")
        if not 0 < self.threshold <= 1:
            raise ConfigError(f"threshold must be in (0, 1]; got {self.threshold}")
        if self.factor <= 0:
            raise ConfigError(f"factor must be > 0; got {self.factor}")
        if not 0 < self.eps < 1:
            raise ConfigError(f"eps must be in (0, 1); got {self.eps}")
        if self.refresh_every < 0:
            raise ConfigError(f"refresh_every must be >= 0; got {self.refresh_every}")
        if self.max_blocks is not None and self.max_blocks < 1:
            raise ConfigError(f"max_blocks must be >= 1; got {self.max_blocks}")

