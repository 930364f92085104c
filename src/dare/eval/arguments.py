"""Checks of the arguments of :func:`dare.eval.evaluate` given with the wrong type: a tokenizer path, rows or texts
instead of :class:`~dare.eval.Sample` objects, a benchmark that is neither a :class:`~dare.eval.Benchmark` nor a
name, a list where a mapping belongs. Each raises a one-line :class:`~dare.errors.DareError` naming the argument,
what it got and what to pass, before any model work."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from dare.errors import ConfigError, DareError, InputError, wrong_type
from dare.eval.benchmark import Benchmark, Sample


def check_tokenizer_arg(tokenizer: Any) -> None:
    """``tokenizer`` is a loaded tokenizer (callable, with ``decode``): a path is pointed to ``load_tokenizer``, a
    model is named as one (arguments swapped)."""
    if isinstance(tokenizer, (str, os.PathLike)):
        hint = f"load it first with dare.models.load_tokenizer({str(tokenizer)!r})"
    elif isinstance(tokenizer, torch.nn.Module):
        hint = "that is a model (model and tokenizer swapped?)"
    elif callable(tokenizer) and callable(getattr(tokenizer, "decode", None)):
        return
    else:
        hint = "load one with dare.models.load_tokenizer(path)"
    raise wrong_type("tokenizer", tokenizer, "a tokenizer", hint)


def check_benchmark_arg(benchmark: Any) -> None:
    """``benchmark`` is a :class:`Benchmark` or a registered name (an unknown name is refused by
    :func:`~dare.eval.get_benchmark`)."""
    if not isinstance(benchmark, (Benchmark, str)):
        raise wrong_type("benchmark", benchmark, "a Benchmark or its name ('gsm8k')",
                         "dare.eval.get_benchmark(name) returns one", ConfigError)


def check_samples_arg(argument: str, samples: Any) -> None:
    """``samples`` (or the few-shot pool) is a list of :class:`Sample` objects: a path, a raw row, a text or one
    Sample is pointed to what turns it into that list."""
    load = "benchmark.load(path) reads a file's rows into Samples"
    if isinstance(samples, Sample):
        raise wrong_type(argument, samples, "a list of Samples", "wrap one sample in a list ([sample])")
    if isinstance(samples, (str, os.PathLike)):
        raise wrong_type(argument, samples, "a list of Samples", load)
    if isinstance(samples, Mapping):
        raise wrong_type(argument, samples, "a list of Samples", f"{load}, benchmark.parse_row(row, index) one row")
    if not isinstance(samples, Sequence):
        hint = "pass list(...)" if hasattr(samples, "__iter__") else ""
        raise wrong_type(argument, samples, "a list of Samples", hint)
    for i, sample in enumerate(samples):
        if not isinstance(sample, Sample):
            hint = "benchmark.parse_row(row, index) turns a row into one" if isinstance(sample, Mapping) else load
            raise wrong_type(f"{argument}[{i}]", sample, "a Sample", hint)


def check_mapping_arg(argument: str, value: Any, error: type[DareError] = InputError) -> None:
    """``value`` is None or a mapping (keyword options, a record for the results file)."""
    if value is not None and not isinstance(value, Mapping):
        raise wrong_type(argument, value, "a dict or None", error=error)


def check_text_arg(argument: str, value: Any) -> None:
    """``value`` is None or a string."""
    if value is not None and not isinstance(value, str):
        raise wrong_type(argument, value, "a string or None")
