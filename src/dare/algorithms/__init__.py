"""Algorithm registry: each algorithm is one module registering an :class:`Algorithm` subclass."""

from dare.algorithms.base import (
    ALGORITHMS, Algorithm, AlgorithmConfig, Needs, get_algorithm, register_algorithm, resolve_algorithm_config,
)
from dare.algorithms import sft  # noqa: F401,E402  (registers "sft")

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmConfig", "Needs", "get_algorithm", "register_algorithm",
           "resolve_algorithm_config"]
