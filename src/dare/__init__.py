"""DARE: dLLM Alignment & Reinforcement Executor.

``import dare`` registers the native model families (LLaDA, Dream, LLaDA-MoE, ...) with transformers'
``AutoConfig`` / ``AutoModel`` / ``AutoModelForCausalLM`` / ``AutoModelForMaskedLM``.
"""

from dare import models  # noqa: F401  (registers the families)
from dare.errors import ConfigError, DareError, InputError
from dare.models import FAMILIES, family_of, get_family

__version__ = "0.1.0"

__all__ = ["ConfigError", "DareError", "InputError", "FAMILIES", "family_of", "get_family", "__version__"]
