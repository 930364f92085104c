"""The sampler registry: named decoding presets and the hooks of the loop that runs each.

It sits below the loops and :mod:`dare.rollout.config` (which resolves a config against its preset), and the
loops' modules register the built-in samplers (:mod:`dare.rollout.samplers`). Adding a sampler is one
:func:`dare.rollout.register_sampler` call; hooks left ``None`` run the masked-diffusion loop, and ``defaults``
keys left out take that loop's base preset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dare.errors import unknown_choice


@dataclass(frozen=True)
class Sampler:
    """A named decoding recipe.

    Attributes:
        name: registry key (``SamplerConfig.sampler``).
        description: one line for ``--help`` and docs.
        defaults: values for the ``SamplerConfig`` fields the user leaves as ``None``; keys left out here take the
            base preset of the sampler's loop at registration (``llada``'s, one block; ``sdar``'s for the block loop).
        run: ``run(model, input_ids, attention_mask, resolved_config, *, example_ids, progress) -> RolloutOutput``
            (None: :func:`dare.rollout.mdlm.denoise_mdlm`).
        finalize: ``finalize(values, given)`` completes the field dict of ``SamplerConfig.resolved`` after the
            preset defaults (loop-specific defaults; None: the masked-diffusion loop's).
        check: ``check(config)`` loop-specific validation of a resolved config (one-line ``ConfigError``; None: the
            masked-diffusion loop's).
        static_state: the fixed-shape twin of ``run`` for the ``static``/``graph`` engines
            (:mod:`dare.rollout.engine`; None: the built-in loop's twin when ``run`` is a built-in loop, else none:
            the sampler decodes on the eager engine only).
        attention: the model attention the loop decodes (``full`` or ``block_causal``, ``FamilySpec.attention``).
        families: model families this sampler is the default for (``default_sampler``).
    """

    name: str
    description: str
    defaults: dict = field(default_factory=dict)
    run: Callable | None = None
    finalize: Callable | None = None
    check: Callable | None = None
    static_state: type | None = None
    attention: str = "full"
    families: tuple[str, ...] = ()


SAMPLERS: dict[str, Sampler] = {}
"""Registered samplers by name (every hook filled in)."""


def get_sampler(name: str) -> Sampler:
    if name not in SAMPLERS:
        raise unknown_choice("sampler", name, SAMPLERS)
    return SAMPLERS[name]


def family_sampler(family: str) -> str:
    """The sampler registered as the default for model family ``family`` (its ``families``), else ``llada``."""
    return next((s.name for s in SAMPLERS.values() if family in s.families), "llada")
