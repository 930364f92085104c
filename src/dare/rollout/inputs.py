"""The arguments of :func:`dare.rollout.generate` checked before any work: a wrong type (a dict for ``config``,
text for ``prompts``, a float ``example_ids``, a list ``canvas``, ...) is a one-line :class:`~dare.errors.DareError`
naming the argument, what it got and what it expects, never a stack trace from deep inside a sampler. Shapes and
values that depend on the resolved :class:`~dare.rollout.SamplerConfig` (``canvas`` rows x ``gen_length``, the
``step_range`` bounds) are checked in :mod:`dare.rollout.samplers` once the config is resolved."""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from dare.errors import InputError, check_config_object, check_id_range, described, wrong_type
from dare.models.loading import check_model_object
from dare.rollout.config import SamplerConfig

TOKENIZE_HINT = "tokenize it first (tokenizer(texts)['input_ids'] is a list of id lists)"


def check_generate_args(model: Any, prompts: Any, attention_mask: Any, config: Any, *, example_ids: Any = None,
                        canvas: Any = None, step_range: Any = None) -> None:
    """One-line errors for arguments of :func:`~dare.rollout.generate` of the wrong type (see the module
    docstring)."""
    check_model_object(model)
    check_config_object("config", config, SamplerConfig,
                        "to pick a sampler by name pass sampler={value!r} (generate(model, prompts, sampler=...))")
    check_prompts_arg(prompts)
    check_attention_mask_arg(attention_mask)
    check_example_ids_arg(example_ids)
    check_canvas_arg(canvas, getattr(getattr(model, "config", None), "vocab_size", None))
    check_step_range_arg(step_range)


def is_integer(value: Any) -> bool:
    """An integer that is not a bool (Python, numpy or a 0-d integer tensor)."""
    if isinstance(value, torch.Tensor):
        return value.ndim == 0 and not value.dtype.is_floating_point and value.dtype != torch.bool
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def check_prompts_arg(prompts: Any) -> None:
    """``prompts`` is a tensor or a list of token-id lists (their ids are checked by
    :func:`~dare.rollout.left_pad`): text, the tokenizer's whole output and one flat list of ids are named."""
    if isinstance(prompts, torch.Tensor):
        return
    if isinstance(prompts, (str, bytes)):
        raise wrong_type("prompts", prompts, "token ids", TOKENIZE_HINT)
    if isinstance(prompts, Mapping):
        raise wrong_type("prompts", prompts, "token ids", "pass the tokenizer output's ['input_ids'] (with its "
                         "attention_mask for a padded tensor)")
    if not isinstance(prompts, Sequence):
        hint = "convert it with torch.as_tensor(prompts)" if hasattr(prompts, "__array__") else ""
        raise wrong_type("prompts", prompts, "a [B, P] tensor or a list of token-id lists", hint)
    for i, row in enumerate(prompts):
        check_prompt_row(i, row)


def check_prompt_row(index: int, row: Any) -> None:
    """Row ``index`` of a list of prompts is a sequence of ids or a 1-d tensor (not text, not one id)."""
    name = f"prompts[{index}]"
    if isinstance(row, (str, bytes)):
        raise wrong_type(name, row, "a list of token ids", TOKENIZE_HINT)
    if is_integer(row):
        raise wrong_type(name, row, "a list of token ids", "for one prompt pass [ids] (a list of id lists)")
    if isinstance(row, torch.Tensor) and row.ndim != 1:
        raise InputError(f"{name} must be a 1-d tensor of token ids; got shape {list(row.shape)}")
    if not isinstance(row, (Sequence, torch.Tensor)) and not hasattr(row, "__array__"):
        raise wrong_type(name, row, "a list of token ids")


def check_attention_mask_arg(attention_mask: Any) -> None:
    """``attention_mask`` is None or a tensor (a config given in its place is named: the third positional argument
    is the mask); its shape and values are checked with the prompts (:func:`dare.rollout.mdlm.check_prompts`)."""
    if attention_mask is None or isinstance(attention_mask, torch.Tensor):
        return
    if isinstance(attention_mask, SamplerConfig):
        raise wrong_type("attention_mask", attention_mask, "a tensor or None", "pass the sampler settings as "
                         "config=... (the third positional argument is the attention mask)")
    raise wrong_type("attention_mask", attention_mask, "a tensor or None", "convert it with torch.as_tensor(mask)")


def check_example_ids_arg(example_ids: Any) -> None:
    """``example_ids`` is None, a 1-d integer tensor or a sequence of integers (their count is checked against the
    batch later)."""
    if example_ids is None:
        return
    expected = "a list of integers (one per prompt) or None"
    if isinstance(example_ids, torch.Tensor):
        if example_ids.ndim != 1 or example_ids.dtype.is_floating_point or example_ids.dtype == torch.bool:
            raise InputError(f"example_ids must be {expected}; got a {example_ids.dtype} tensor of shape "
                             f"{list(example_ids.shape)}")
        return
    if isinstance(example_ids, (str, bytes)) or not isinstance(example_ids, Sequence):
        raise wrong_type("example_ids", example_ids, expected)
    for i, value in enumerate(example_ids):
        if not is_integer(value):
            raise InputError(f"example_ids[{i}] must be an integer; got {described(value)}")


def check_canvas_arg(canvas: Any, vocab_size: int | None) -> None:
    """``canvas`` is None or a ``[B, G]`` tensor of integer token ids below ``vocab_size`` (rows and ``G`` are
    checked once the config is resolved)."""
    if canvas is None:
        return
    if not isinstance(canvas, torch.Tensor):
        raise wrong_type("canvas", canvas, "a [B, gen_length] tensor of token ids or None",
                         "convert it with torch.as_tensor(canvas)")
    if canvas.dtype.is_floating_point or canvas.dtype.is_complex or canvas.dtype == torch.bool:
        raise InputError(f"canvas must hold integer token ids (the mask id where decoding starts); got a "
                         f"{canvas.dtype} tensor")
    if canvas.ndim != 2:
        raise InputError(f"canvas must be a [B, gen_length] tensor; got shape {list(canvas.shape)}")
    if vocab_size is not None:
        check_id_range(canvas, vocab_size, "canvas ids")


def check_step_range_arg(step_range: Any) -> None:
    """``step_range`` is None or a pair ``(start, stop)`` of integers (``stop`` may be None); its bounds are checked
    by the sampler."""
    if step_range is None:
        return
    expected = "a pair (start, stop) of step indices (stop None = to the end) or None"
    if isinstance(step_range, (str, bytes)) or not isinstance(step_range, Sequence) or len(step_range) != 2:
        raise wrong_type("step_range", step_range, expected)
    start, stop = step_range
    if not is_integer(start) or not (stop is None or is_integer(stop)):
        raise InputError(f"step_range must be {expected}; got {tuple(step_range)!r}")
