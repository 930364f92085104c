"""What the external-harness adapters share (lm-evaluation-harness: :mod:`dare.eval.lm_harness`, OpenCompass:
:mod:`dare.eval.opencompass`): splitting a flat option mapping into sampler / likelihood settings, the sampler
of one generation request, and turning a rollout row into the text the harness scores.

Both adapters decode exactly as ``dare eval run`` does: :func:`dare.rollout.generate` with a resolved
:class:`~dare.rollout.SamplerConfig`, completions cut after the family's first stop id (``completion_mask``),
decoded without special tokens and cut at the first stop string.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from dare.errors import ConfigError, closest


SHARED_OPTIONS = ("full_logits",)
"""Keys that are a field of both configs with one meaning, so one value sets both."""
TARGETS = ("sampler", "likelihood")
"""Prefixes that send a key to one config: ``sampler.KEY`` / ``likelihood.KEY``."""


def split_options(options: Mapping[str, Any], own: Sequence[str], kind: str) -> tuple[dict, dict]:
    """``(sampler fields, likelihood fields)`` of a flat option mapping: every key must be one of ``own`` (the
    adapter's own arguments, left out of both), a :class:`~dare.rollout.SamplerConfig` field or a
    :class:`~dare.eval.likelihood.LikelihoodConfig` field, optionally prefixed ``sampler.`` / ``likelihood.`` to
    send it to that config only. A key of :data:`SHARED_OPTIONS` sets both; a key that both configs have with
    different meanings (``schedule``: the unmasking schedule of the sampler, the masking schedule of the ELBO)
    must carry a prefix. Anything else is a one-line ``ConfigError`` naming the closest valid key (``kind`` names
    the options in the message). A prefixed key that names one of ``own`` (``sampler.seed``: the adapter's ``seed``
    seeds every request) is an error pointing to ``own``'s."""
    from dare.eval.likelihood import LikelihoodConfig
    from dare.rollout import SamplerConfig

    names = {"sampler": {f.name for f in dataclasses.fields(SamplerConfig)},
             "likelihood": {f.name for f in dataclasses.fields(LikelihoodConfig)}}
    split = {"sampler": {}, "likelihood": {}}
    for key, value in options.items():
        if key in own:
            continue
        target, dot, name = key.partition(".")
        if dot and target in TARGETS:
            targets = [target] if name in names[target] else []
        else:
            name = key
            targets = [t for t in TARGETS if name in names[t]]
        if not targets:
            valid = [*own, *names["sampler"], *names["likelihood"]] + [f"{t}.{n}" for t in TARGETS for n in names[t]]
            hint = closest(key, valid)
            raise ConfigError(f"unknown {kind} '{key}'" + (f" (did you mean '{hint}'?)" if hint else "")
                              + "; valid: the adapter's own, any SamplerConfig or LikelihoodConfig field")
        if name in own:  # ``sampler.seed``: the adapter's own ``seed`` replaces it in every request
            raise ConfigError(f"{kind} '{key}' is not used: the model's own {name} applies to every request; "
                              f"write {name}={value}")
        if len(targets) > 1 and name not in SHARED_OPTIONS:
            raise ConfigError(f"{kind} '{key}' is a SamplerConfig field and a LikelihoodConfig field with different "
                              f"meanings: write sampler.{name}=... or likelihood.{name}=...")
        for target in targets:
            split[target][name] = value
    return split["sampler"], split["likelihood"]


def request_sampler(fields: Mapping[str, Any], default: str, max_new_tokens: int | None, seed: int, model=None):
    """The resolved :class:`~dare.rollout.SamplerConfig` of one generation request.

    ``fields``: the user's sampler fields (they win); ``default``: the sampler when ``fields`` names none (the
    family's, :func:`dare.rollout.default_sampler`). Without ``gen_length`` the completion gets
    ``max_new_tokens`` positions (256 when None), rounded up to whole blocks when longer than one block, so that
    semi-autoregressive samplers keep their block length; the adapter then cuts the text to ``max_new_tokens``
    tokens. With ``model``, it is resolved as :func:`dare.rollout.generate` resolves it: a block sampler's unset
    block length is the model's block size (:func:`dare.rollout.resolve_config`), so the recorded settings are the
    ones decoded with."""
    from dare.rollout import SamplerConfig, get_sampler, resolve_config
    from dare.rollout.samplers import model_block_size

    values = {"sampler": default, **fields, "seed": seed}
    if "gen_length" not in values:
        gen = int(max_new_tokens or 256)
        model_block = None if model is None else model_block_size(model)
        block = values.get("block_length") or model_block or get_sampler(values["sampler"]).defaults.get(
            "block_length") or gen
        values["gen_length"] = -(-gen // block) * block if gen > block or "block_length" in values else gen
    config = SamplerConfig.from_dict(values)
    return config.resolved() if model is None else resolve_config(config, model)


def cut_at_stop(text: str, stops: Sequence[str]) -> tuple[str, bool]:
    """``text`` up to the first occurrence of any stop string, and whether one was found."""
    cut = min((text.find(s) for s in stops if s and s in text), default=-1)
    return (text[:cut], True) if cut >= 0 else (text, False)


def completion_text(tokenizer, out, row: int, stops: Sequence[str] = (), max_tokens: int | None = None) -> str:
    """Text of row ``row`` of a :class:`~dare.rollout.RolloutOutput`: the tokens up to the first stop id (at most
    ``max_tokens`` of them), decoded without special tokens, cut at the first stop string."""
    tokens = out.completion[row][out.completion_mask[row]].tolist()
    if max_tokens:
        tokens = tokens[:max_tokens]
    return cut_at_stop(tokenizer.decode(tokens, skip_special_tokens=True), stops)[0]


def positive_int(name: str, value: Any) -> int:
    """``value`` as a positive int (harness arguments often arrive as strings); a one-line error otherwise."""
    try:
        number = int(str(value).strip())
    except ValueError:
        number = 0
    if number < 1:
        raise ConfigError(f"{name} must be a positive integer; got {value!r}")
    return number


def seed_number(name: str, value: Any) -> int:
    """``value`` as a seed (harness arguments often arrive as strings): a whole number in
    :data:`dare.config.SEEDS` (:func:`dare.config.check_seed`); a one-line error otherwise."""
    from dare.config import check_seed

    try:
        number = int(str(value).strip())
    except ValueError:
        raise ConfigError(f"{name} must be a whole number; got {value!r}") from None
    check_seed(number, name)
    return number


def boolean(name: str, value: Any) -> bool:
    """``value`` as a bool (``true``/``false``/``1``/``0``/``yes``/``no`` when it arrives as a string); a
    one-line error otherwise."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"{name} must be true or false; got {value!r}")


__all__ = ["boolean", "completion_text", "cut_at_stop", "positive_int", "request_sampler", "split_options"]
