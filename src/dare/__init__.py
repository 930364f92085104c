"""DARE: dLLM Alignment & Reinforcement Executor.

``import dare`` is light: torch and transformers load on first use, so the ``dare`` command starts at once.
DARE's model families (LLaDA, Dream, LLaDA-MoE, ...) are registered with transformers' ``AutoConfig`` /
``AutoModel`` / ``AutoModelForCausalLM`` / ``AutoModelForMaskedLM`` as soon as transformers is imported (see
:mod:`dare.auto_classes`); ``dare.FAMILIES``, ``dare.family_of`` and ``dare.get_family`` load :mod:`dare.models`
when first accessed, and ``dare.<subpackage>`` imports that subpackage.
"""

from __future__ import annotations

import importlib
import importlib.util

from dare import auto_classes
from dare.errors import ConfigError, DareError, InputError, PluginError

__version__ = "0.1.0"

_FROM_MODELS = ("FAMILIES", "family_of", "get_family")

__all__ = ["ConfigError", "DareError", "InputError", "PluginError", "FAMILIES", "family_of", "get_family", "__version__"]


def __getattr__(name: str):
    if name in _FROM_MODELS:
        value = getattr(importlib.import_module("dare.models"), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"dare.{name}") is not None:
        value = importlib.import_module(f"dare.{name}")
    else:
        raise AttributeError(f"module 'dare' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_FROM_MODELS})


auto_classes.install()
