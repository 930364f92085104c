"""Model-family specs: the one place that knows a family's facts.

Everything outside ``dare.models`` asks the spec for special token ids, the logit alignment (Dream's
shift), the attention topology, default block size, LoRA targets and the tiny test config. Adding a
family means writing one module that defines its config/model classes and calls
:func:`register_family`; a plug-in file does the same (docs/extending.md, "Model families").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from dare.errors import ConfigError, unknown_choice
from dare.plugins import count_registration, redefined_in_main


@dataclass(frozen=True)
class TokenIds:
    """Special token ids of one model (resolved from its config, falling back to the family spec)."""

    mask: int
    eos: int
    pad: int
    eot: int | None = None
    bos: int | None = None

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Ids that end a completion (EOS and, when the family has one, end-of-turn)."""
        return (self.eos,) if self.eot is None or self.eot == self.eos else (self.eos, self.eot)


@dataclass(frozen=True)
class FamilySpec:
    """Facts about one diffusion LM family.

    Attributes:
        name: registry key used on the CLI and in configs (``llada``, ``dream``, ...).
        config_class / model_class: the transformers classes (registered with the Auto classes).
        attention: ``"full"`` (bidirectional MDLM) or ``"block_causal"`` (BDLM).
        logit_shift: 0 when the output at position ``i`` predicts token ``i``; 1 when it predicts token
            ``i + 1`` (Dream, AR-initialised) and must be shifted right by one to align.
        mask_token_id / eos_token_id / pad_token_id / eot_token_id / bos_token_id: defaults used when the
            checkpoint's config.json does not name them (values of the released checkpoints).
        block_size: default block length for block-diffusion training and decoding (None for MDLMs).
        lora_targets: regex over module paths that LoRA adapts by default (peft ``target_modules``).
        tiny_config: returns the config.json dict of a tiny random model for tests (2 layers, hidden 64).
    """

    name: str
    config_class: type
    model_class: type
    attention: str
    logit_shift: int
    mask_token_id: int
    eos_token_id: int
    pad_token_id: int
    lora_targets: str
    tiny_config: Callable[..., dict]
    eot_token_id: int | None = None
    bos_token_id: int | None = None
    block_size: int | None = None
    description: str = ""

    def token_ids(self, config) -> TokenIds:
        """Special ids of a model config (config.json values win over the family defaults)."""

        def pick(key: str, default):
            value = getattr(config, key, None)
            if isinstance(value, (list, tuple)):
                value = value[0] if value else None
            return default if value is None else int(value)

        return TokenIds(
            mask=pick("mask_token_id", self.mask_token_id),
            eos=pick("eos_token_id", self.eos_token_id),
            pad=pick("pad_token_id", self.pad_token_id),
            eot=pick("eot_token_id", self.eot_token_id),
            bos=pick("bos_token_id", self.bos_token_id),
        )

    @staticmethod
    def context_length(config) -> int | None:
        """Positions the model was configured for (LLaDA ``max_sequence_length``, the others
        ``max_position_embeddings``), or None when the config names neither."""
        for key in ("max_sequence_length", "max_position_embeddings"):
            value = getattr(config, key, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    def align_logits(self, logits: torch.Tensor, cu_seqlens: torch.Tensor | None = None) -> torch.Tensor:
        """Return logits where position ``i`` predicts token ``i``.

        For shifted families (Dream) the prediction of token ``i`` is the output at ``i - 1``; the first
        position of every sequence (of every packed document when ``cu_seqlens`` is given) reuses its own
        output, as the reference samplers do. It is always a prompt token.
        """
        if self.logit_shift == 0:
            return logits
        shifted = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        if cu_seqlens is not None:
            starts = cu_seqlens[:-1].to(device=logits.device, dtype=torch.long)
            shifted[:, starts] = logits[:, starts]
        return shifted


FAMILIES: dict[str, FamilySpec] = {}


ATTENTIONS = ("full", "block_causal")
"""The attention topologies of :attr:`FamilySpec.attention`."""


def register_family(spec: FamilySpec) -> FamilySpec:
    """Add a family to the registry and to transformers' Auto classes (``AutoConfig`` by its config class's
    ``model_type``; ``AutoModel``, ``AutoModelForCausalLM``, ``AutoModelForMaskedLM`` by its config class).

    A name taken already, a config ``model_type`` another family registered (it would take that family's
    checkpoints over), or an ``attention`` / ``logit_shift`` outside the contract is a ``ValueError``: a plug-in's
    import then fails with one line. A notebook cell run again replaces its own family."""
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM

    taken = FAMILIES.get(spec.name)
    if taken is not None and not redefined_in_main(taken.config_class, spec.config_class):
        raise ValueError(f"model family '{spec.name}' registered twice (config class {spec.config_class.__name__}; "
                         f"the first: {taken.config_class.__module__}.{taken.config_class.__name__}): give the "
                         "second one another name")
    model_type = getattr(spec.config_class, "model_type", "")
    owner = next((other.name for other in FAMILIES.values()
                  if other.name != spec.name and other.config_class.model_type == model_type), None)
    if not model_type or owner is not None:
        held = f"is model family '{owner}'s" if owner else "is empty"
        raise ValueError(f"model family '{spec.name}': the model_type {model_type!r} of {spec.config_class.__name__} "
                         f"{held}: give the config class a model_type of its own")
    if spec.attention not in ATTENTIONS or spec.logit_shift not in (0, 1):
        raise ValueError(f"model family '{spec.name}': attention must be one of {', '.join(ATTENTIONS)} and "
                         f"logit_shift 0 or 1; got {spec.attention!r} and {spec.logit_shift!r}")
    count_registration()
    FAMILIES[spec.name] = spec
    AutoConfig.register(spec.config_class.model_type, spec.config_class, exist_ok=True)
    for auto in (AutoModel, AutoModelForCausalLM, AutoModelForMaskedLM):
        auto.register(spec.config_class, spec.model_class, exist_ok=True)
    return spec


def get_family(name: str) -> FamilySpec:
    """Look a family up by name (one-line error with the closest valid name)."""
    if name not in FAMILIES:
        raise unknown_choice("model family", name, FAMILIES)
    return FAMILIES[name]


def family_of(obj) -> FamilySpec:
    """The spec of a model, a peft-wrapped model, or a config: the family of the nearest class in the config's MRO (a
    family whose config class subclasses another family's is its own, not its parent's)."""
    config = getattr(obj, "config", obj)
    by_class = {spec.config_class: spec for spec in FAMILIES.values()}
    for cls in type(config).__mro__:
        if cls in by_class:
            return by_class[cls]
    raise ConfigError(f"{type(config).__name__} is not a DARE model family config")


def validate_token_ids(ids: TokenIds, vocab_size: int, family: str) -> None:
    """Reject special ids that cannot work (outside the vocabulary, mask equal to EOS/pad)."""
    for label, value in (("mask_token_id", ids.mask), ("eos_token_id", ids.eos), ("pad_token_id", ids.pad)):
        if not 0 <= value < vocab_size:
            raise ConfigError(f"{family}: {label}={value} is outside the vocabulary (size {vocab_size})")
    if ids.mask in (ids.eos, ids.pad):
        raise ConfigError(f"{family}: mask_token_id={ids.mask} must differ from eos ({ids.eos}) and pad ({ids.pad})")
