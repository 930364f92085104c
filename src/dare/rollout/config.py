"""``SamplerConfig``: every knob of diffusion decoding in one typed dataclass.

Fields left as ``None`` take the value of the named sampler's preset (:mod:`dare.rollout.samplers`), so
``SamplerConfig(sampler="fastdllm", cache="dual")`` is Fast-dLLM's recipe with a dual cache. Caching
(``cache``), the selection rule (``decoder``), the transfer schedule (``schedule``) and the confidence
(``confidence``) are independent choices.

Two kinds of samplers share the config: masked-diffusion samplers (``llada``, ``dream``, ``fastdllm*``;
:mod:`dare.rollout.mdlm`) and block-diffusion samplers (``sdar``, ``llada2``, ``llada21*``;
:mod:`dare.rollout.block`). Each sampler completes and checks the fields that only it uses (its
``finalize``/``check`` hooks), so a field meant for the other kind is a one-line error, never ignored.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import numbers
from dataclasses import dataclass

from dare.errors import ConfigError, and_join, closest
from dare.rollout.kernels import (
    CONFIDENCE_ALIASES,
    CONFIDENCE_DTYPES,
    CONFIDENCE_SOURCES,
    CONFIDENCES,
    DECODER_ALIASES,
    DECODER_SETTINGS,
    DECODERS,
    SCHEDULES,
)
from dare.rollout.registry import SAMPLERS, family_sampler, get_sampler


DEFAULT_GEN_LENGTH = 128
"""``gen_length`` of a config that leaves it unset (outside ``evaluate``, which takes the benchmark's)."""
ENGINES = ("auto", "eager", "static", "graph")
"""Values of :attr:`SamplerConfig.engine` (:mod:`dare.rollout.engine` runs them)."""
WEIGHTS = ("model", "merged", "fp8")
"""Values of :attr:`SamplerConfig.weights`."""
_NUMERIC_TYPES = ("int", "float")
RANGES = {
    "gen_length": (lambda v: v >= 1, ">= 1"),
    "block_length": (lambda v: v >= 1, ">= 1"),
    "temperature": (lambda v: v >= 0, ">= 0"),
    "top_p": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "top_k": (lambda v: v >= 0, ">= 0 (0 = off)"),
    "threshold": (lambda v: 0 < v <= 1, "in (0, 1]"),
    "factor": (lambda v: v > 0, "> 0"),
    "entropy_bound": (lambda v: v > 0, "> 0"),
    "eps": (lambda v: 0 < v < 1, "in (0, 1)"),
    "refresh_every": (lambda v: v >= 0, ">= 0"),
    "max_blocks": (lambda v: v >= 1, ">= 1"),
}
"""Allowed values of the numeric :class:`SamplerConfig` fields (a test and the words of the one-line error)."""
"""Annotated field types of :class:`SamplerConfig` whose values must be numbers."""
_WARNED: set[tuple] = set()
"""Keys of the warnings :func:`warn_once` has logged in this process."""

THRESHOLD_DECODERS = ("threshold", "dynamic", "factor")
"""Selection rules that compare confidences with a bound in (0, 1] (``threshold``, ``1 - f/(n+1)``): they need a
confidence on that scale (``prob``, ``margin``), not ``neg_entropy`` (<= 0)."""

log = logging.getLogger("dare.rollout")


def warn_once(key: tuple, message: str) -> None:
    """Log ``message`` as a warning the first time this process sees ``key`` (rollouts repeat every RL step)."""
    if key not in _WARNED:
        _WARNED.add(key)
        log.warning(message)


def warn_unread(key: str, value, decoder: str, readers: tuple[str, ...]) -> None:
    """``warning: ignoring KEY=VALUE: only the ... decoders read it`` (once per process for each setting)."""
    rules = and_join([f"'{r}'" for r in readers])
    readers_read = "decoders read" if len(readers) > 1 else "decoder reads"
    warn_once(("unread", key, value, decoder), f"warning: ignoring {key}={value}: only the {rules} {readers_read} it, "
                                               f"this rollout uses decoder '{decoder}'")


@dataclass
class SamplerConfig:
    """Settings of one rollout (see the field docstrings; ``None`` = the sampler preset's value)."""

    sampler: str | None = None
    """Preset name: ``llada``, ``dream``, ``fastdllm``, ``fastdllm_dream`` (masked diffusion); ``sdar``,
    ``llada2``, ``llada21``, ``llada21_speed`` (block diffusion) - ``dare.rollout.SAMPLERS``. None: the model
    family's default (:func:`dare.rollout.default_sampler`: ``llada`` for LLaDA, ``dream`` for Dream, ``sdar`` for
    SDAR, ``llada2`` for LLaDA2), filled in by ``generate``, ``evaluate`` and the trainer, which know the model."""

    gen_length: int | None = None
    """Number of generated positions ``G`` (the completion has ``G`` positions). None: the benchmark's
    ``max_new_tokens`` in ``evaluate``, else :data:`DEFAULT_GEN_LENGTH` (128)."""

    block_length: int | None = None
    """Block length ``Lb``; blocks are decoded left to right. Masked diffusion: the canvas after the prompt is
    cut into blocks (``Lb`` must divide ``gen_length``); preset 32 for ``llada``/``fastdllm`` (one block when
    ``gen_length < 32``), ``gen_length`` for ``dream``. Block diffusion: the block grid of the model's
    block-causal attention, anchored at position 0 of each prompt (need not divide ``gen_length``); preset 4
    for ``sdar``, 32 for ``llada2``/``llada21``."""

    steps: int | None = None
    """Masked diffusion: denoising steps over the whole generation for the ``quota``/``dynamic`` decoders (a
    multiple of the number of blocks; ``steps / num_blocks`` per block). Default: ``gen_length`` (one token
    per step). Threshold/factor decoders run until each block is filled and ignore it. Block samplers count
    steps per block: use ``block_steps``."""

    block_steps: int | None = None
    """Block diffusion: denoising steps per block ``S`` (SDAR ``denoising_steps``, LLaDA2 ``steps``), at most
    ``block_length``. Step ``i`` of a block commits at least ``Lb // S + [i < Lb % S]`` masks (the reference
    ``k_step``, clamped to the masks left), so a block never takes more than ``S`` steps. Default:
    ``block_length`` (one token per step unless the decoder commits more)."""

    temperature: float = 0.0
    """Sampling temperature; 0 is an explicit argmax path."""

    top_p: float | None = None
    """Nucleus filter applied after the temperature (None or 1 = off)."""

    top_k: int | None = None
    """Top-k filter applied after top-p (None or 0 = off)."""

    top_k_first: bool | None = None
    """Apply top-k before top-p (SDAR, LLaDA2) instead of after it (Dream). Preset: True for the block
    samplers, False otherwise."""

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
    """Selection rule: ``quota`` (top-k by schedule; SDAR ``low_confidence_static``), ``threshold``
    (Fast-dLLM: all with confidence >= threshold, at least the top-1), ``factor`` (Fast-dLLM factor rule),
    ``dynamic`` (all with confidence > threshold if at least the scheduled count, else top-k by schedule;
    SDAR ``low_confidence_dynamic``, LLaDA2), ``sequential`` (the leftmost scheduled count),
    ``entropy_bounded`` (SDAR/JetEngine: lowest-entropy positions while their cumulative entropy stays below
    ``entropy_bound``). Masked-diffusion default: ``factor`` if ``factor`` is set, else ``threshold`` if
    ``threshold`` is set, else the preset's; block samplers always default to their preset's."""

    threshold: float | None = None
    """Confidence threshold of the ``threshold``/``dynamic`` decoders (default 0.9; LLaDA2 preset 0.95,
    LLaDA2.1 quality 0.7, speed 0.5). Like ``factor`` and ``entropy_bound``, a setting only some decoders read:
    given with another decoder it is not applied, with a warning, and the resolved config (the one results files
    record) holds None for it."""

    entropy_bound: float | None = None
    """Cumulative-entropy bound of the ``entropy_bounded`` decoder (SDAR ``eb_threshold``; default 0.35)."""

    editing_threshold: float | None = None
    """LLaDA2.1 token editing (T2T): an already decoded, non-prompt position of the current block is
    rewritten when the model proposes a different token with confidence > this value. None or 0 = no
    editing. Preset: 0.5 for ``llada21`` (quality mode), off for ``llada21_speed``."""

    max_post_steps: int = 16
    """LLaDA2.1: at most this many edit-only forwards per block once it has no masks left (the block also
    ends at the first such forward that edits nothing)."""

    num_to_transfer: int | None = None
    """LLaDA2.1: masks committed per step when fewer than that are above ``threshold`` (a constant count
    replacing the ``block_steps`` schedule; a block then runs until it has no masks). Preset 1 for
    ``llada21``; None = the schedule."""

    factor: float | None = None
    """Factor ``f`` of the ``factor`` decoder (commit the longest prefix with ``c_(n) >= 1 - f/(n+1)``;
    default 1.0)."""

    factor_last_rank_quirk: bool = False
    """Reproduce dInfer's factor code, which commits all candidates when only the last rank fails."""

    cache: str | None = None
    """KV caching. Masked diffusion: ``none`` (full forward every step), ``prefix`` (Fast-dLLM prefix cache:
    prompt and finished blocks cached at each block start, the rest recomputed), ``dual`` (Fast-dLLM dual
    cache: prefix and masked suffix cached, only the current block recomputed). Block diffusion: ``block``
    (exact KV cache of the prompt and finished blocks; steps run the current block only) or ``none`` (every
    step recomputes prompt and finished blocks, as LLaDA2's reference ``generate``)."""

    refresh_every: int = 0
    """With a cache, also recompute the full canvas (and the cache) every N forwards inside a block;
    0 = only at block starts (Fast-dLLM). 1 makes cached decoding identical to ``cache=none``."""

    suppress_eos: bool = False
    """Set the EOS logit to -inf before sampling (LLaDA's ``logits_eos_inf``, used for code benchmarks)."""

    eos_early_stop: bool = True
    """Stop decoding a row once its first stop token (EOS/EOT) is committed and every position before it is
    decoded; the loop ends when every row has stopped. Tokens up to the first stop are unaffected; the
    undecoded positions after it hold the pad id. Block samplers stop a row at the end of the block that
    holds its first stop token, as the references do (the rest of that block is decoded). False: decode
    all ``gen_length`` positions."""

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

    engine: str = "auto"
    """How the steps run (:mod:`dare.rollout.engine`): ``eager`` (the reference loops), ``static`` (fixed-shape
    steps over preallocated buffers, run eagerly), ``graph`` (static steps recorded once per shape into CUDA
    graphs and replayed; CUDA only), ``auto`` = ``graph`` on CUDA, ``eager`` elsewhere. With ``T > 0`` the
    static engines draw from counter-based per-row streams: batch-invariant, but other samples than ``eager``'s
    for the same seed."""

    weights: str = "model"
    """What the projection matmuls read (static and graph engines; :mod:`dare.models.fusion`):

    * ``model``: the model's own weights (the reference samplers' tokens);
    * ``merged`` (LoRA policies): copies of the LoRA-wrapped projections in the model's dtype (the autocast dtype
      under autocast) with the active adapters merged in, one matmul where the wrapper runs three; the tokens can
      differ from the wrapper's by rounding;
    * ``fp8``: FP8 e4m3 copies of the dense projections inside the blocks, one scale per output channel,
      activations quantised per row at each matmul (:mod:`dare.models.fp8`; GPUs of compute capability 8.9+, bf16
      models): faster matmuls at some precision, the tokens are no longer the reference samplers'.

    Embeddings, the LM head and MoE experts keep the model's weights, and so does a projection whose sizes are not
    multiples of 16 (``fp8``) or whose LoRA has no plain weight form (DoRA, LoRA bias, other peft variants); it is
    an error when no projection is left to copy. LoRA dropout does not apply to merged adapters. The copies are
    refreshed from the parameters at every call (``rollout/weight_refresh_s`` in RL)."""

    # ---------------------------------------------------------------------------------------------

    @classmethod
    def from_dict(cls, values: dict) -> SamplerConfig:
        """Build from a mapping; an unknown key is a one-line error naming the closest valid key."""
        names = [f.name for f in dataclasses.fields(cls)]
        for key in values:
            if key not in names:
                hint = closest(key, names)
                said = f" (did you mean '{hint}'?)" if hint else f"; the options: {', '.join(sorted(names))}"
                raise ConfigError(f"unknown sampler option '{key}'{said}")
        return cls(**values)

    def replace(self, **changes) -> SamplerConfig:
        """A copy with ``changes`` (unknown names are one-line errors)."""
        merged = dataclasses.asdict(self)
        merged.update(changes)
        return SamplerConfig.from_dict(merged)

    @property
    def num_blocks(self) -> int:
        return self.gen_length // self.block_length

    def for_family(self, family: str) -> SamplerConfig:
        """This config with an unset ``sampler`` set to ``family``'s default sampler (a copy; self when it is set)."""
        if self.sampler is not None:
            return self
        return dataclasses.replace(self, sampler=family_sampler(family))

    def resolved(self) -> SamplerConfig:
        """Fill ``None`` fields from the sampler preset, normalise aliases and validate (``ConfigError``). The
        ``sampler`` must be set (:meth:`for_family`): its preset depends on the model."""
        if self.sampler is None:
            raise ConfigError("sampler is unset and there is no model to take its family's default from: name one "
                              f"({', '.join(sorted(SAMPLERS))}), or call for_family(FAMILY) first")
        preset = get_sampler(self.sampler)
        self.check_values()  # before the preset's defaults compare values; also a value a decoder will not read
        values = dataclasses.asdict(self)
        if values["gen_length"] is None:
            values["gen_length"] = DEFAULT_GEN_LENGTH
        for key, value in preset.defaults.items():
            if values.get(key) is None:
                values[key] = value
        if values["confidence"] in CONFIDENCE_ALIASES:
            values["confidence"] = CONFIDENCE_ALIASES[values["confidence"]]
        if values["decoder"] in DECODER_ALIASES:
            values["decoder"] = DECODER_ALIASES[values["decoder"]]
        if values["decoder"] == "entropy_bounded" and self.confidence is None:
            values["confidence"] = "neg_entropy"  # the rule ranks positions by entropy
        preset.finalize(values, self)
        self.warn_unread_settings(values["decoder"])
        self.warn_unread_filters(values)
        for key, default in (("threshold", 0.9), ("factor", 1.0), ("entropy_bound", 0.35), ("top_k_first", False)):
            if values[key] is None:
                values[key] = default
        defaults = {f.name: f.default for f in dataclasses.fields(self)}
        for key, readers in DECODER_SETTINGS.items():
            if values["decoder"] not in readers:  # a preset's value for a rule not chosen is recorded as unset
                values[key] = defaults[key]
        config = SamplerConfig(**values)
        config.validate()
        return config

    def validate(self) -> None:
        """Check a resolved config; every problem is a one-line :class:`ConfigError`."""
        self.choice("confidence", CONFIDENCES)
        self.choice("confidence_source", CONFIDENCE_SOURCES)
        self.choice("confidence_dtype", CONFIDENCE_DTYPES)
        self.choice("schedule", SCHEDULES)
        self.choice("decoder", DECODERS)
        self.choice("engine", ENGINES)
        self.choice("weights", WEIGHTS)
        if self.weights != "model" and self.engine == "eager":
            raise ConfigError(f"weights '{self.weights}' decodes on the static engines: set engine to 'static' or "
                              f"'graph' ('auto' picks 'graph' on CUDA); the eager loops read the model's weights")
        self.check_ranges()
        if self.decoder == "entropy_bounded" and self.confidence != "neg_entropy":
            raise ConfigError(f"decoder 'entropy_bounded' ranks by entropy: confidence must be 'neg_entropy' "
                              f"(got '{self.confidence}')")
        if self.decoder in THRESHOLD_DECODERS and self.confidence == "neg_entropy":
            fix = "confidence='prob' or 'margin'" + (", or sampler 'fastdllm_dream'" if self.sampler == "dream" else "")
            raise ConfigError(f"decoder '{self.decoder}' compares confidences with a bound in (0, 1], but "
                              f"confidence 'neg_entropy' is <= 0 (one token per step): use {fix}")
        get_sampler(self.sampler).check(self)

    def warn_unread_settings(self, decoder: str) -> None:
        """Warn (once per process and setting) about a setting given here that selection rule ``decoder`` does not
        read, e.g. a ``threshold`` with the ``quota`` decoder: it is not applied. A warning, not an error, so that
        a sweep may share one ``threshold`` across points with different decoders."""
        for key, readers in DECODER_SETTINGS.items():
            if getattr(self, key) not in (None, False) and decoder not in readers:
                warn_unread(key, getattr(self, key), decoder, readers)

    def warn_unread_filters(self, values: dict) -> None:
        """Warn (once per process and setting) about a ``top_p`` / ``top_k`` given here that the resolved ``values``
        never read: at temperature 0 with confidences from the raw logits (LLaDA, Fast-dLLM) the token is the raw
        argmax and the confidence the raw softmax, which no filter changes. (Samplers whose confidence comes from the
        filtered distribution - Dream, SDAR, LLaDA2 - do read them at temperature 0.)"""
        if values["temperature"] != 0 or values["confidence_source"] != "logits":
            return
        for key, off in (("top_p", 1.0), ("top_k", 0)):
            value = getattr(self, key)
            if value is not None and value != off:
                warn_once(("greedy", key, value), f"warning: ignoring {key}={value}: at temperature 0 sampler "
                                                   f"'{values['sampler']}' takes the argmax of the raw logits, which "
                                                   f"{key} does not change; set a temperature > 0 to sample with it")

    def check_values(self) -> None:
        """:meth:`check_types` and :meth:`check_ranges`: what can be checked before the config is resolved (and
        before a model is loaded), on the fields that are set."""
        self.check_types()
        self.check_ranges()

    def check_ranges(self) -> None:
        """One-line error for a set field outside its range (:data:`RANGES`) or not finite (``--temperature inf``,
        ``nan``); unset fields are skipped."""
        for key, (allowed, rule) in RANGES.items():
            value = getattr(self, key)
            if value is not None and not math.isfinite(value):
                raise ConfigError(f"{key} must be a finite number {rule}; got {value}")
            if value is not None and not allowed(value):
                raise ConfigError(f"{key} must be {rule}; got {value}")

    def check_types(self) -> None:
        """One-line error for a numeric field holding something else (e.g. ``threshold='a'`` from a command line),
        before a comparison with it would fail with a stack trace, and for a switch holding anything but
        ``True``/``False``: ``suppress_eos='no'`` is a non-empty string, so it would act as true. ``true`` is no number
        and ``4.0`` no whole number (an integer field). Choice fields are checked by :meth:`choice`."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            kinds = [k.strip() for k in str(f.type).split("|") if k.strip() != "None"]
            if value is None:
                continue
            if kinds == ["bool"] and not isinstance(value, bool):
                raise ConfigError(f"{f.name} must be true or false; got {value!r}")
            if set(kinds) <= set(_NUMERIC_TYPES) and isinstance(value, numbers.Real) and not isinstance(value, bool) \
                    and type(value) not in (int, float):  # numpy's numbers (a sweep's np.arange): plain Python ones
                value = int(value) if isinstance(value, numbers.Integral) else float(value)
                setattr(self, f.name, value)
            if set(kinds) <= set(_NUMERIC_TYPES) and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ConfigError(f"{f.name} must be a number; got {value!r}")
            if kinds == ["int"] and not isinstance(value, int):  # steps=4.0 would fail in torch after the model loads
                raise ConfigError(f"{f.name} must be a whole number; got {value!r}")

    def choice(self, key: str, options) -> None:
        """One-line error when field ``key`` is not one of ``options``."""
        value = getattr(self, key)
        if value not in options:
            hint = closest(str(value), list(options))
            raise ConfigError(
                f"unknown {key} '{value}'" + (f" (did you mean '{hint}'?)" if hint else "")
                + f"; choose from: {', '.join(sorted(options))}"
            )

    def reject_fields(self, fields: tuple[str, ...], reason: str) -> None:
        """One-line error naming the first of ``fields`` that is set (not None)."""
        for key in fields:
            if getattr(self, key) is not None:
                raise ConfigError(f"{key} does not apply to sampler '{self.sampler}' ({reason})")
