"""Algorithm registry: each algorithm is one module registering an :class:`Algorithm` subclass.

SFT (``sft``), online RL on the shared rollout workflow (``d1``, ``wd1``, ``coupled_grpo``, ``mdpo``,
``cj_grpo``, ``spg``, ``bgpo``, ``ebpo``, ``tracerl``, ``dtreerpo``, ``igpo``, ``dipo``; base classes in
:mod:`dare.algorithms.rl`) and preference
optimisation on pairs (``vrpo``, ``dpo``). The pure math lives in :mod:`dare.algorithms.functional`.
"""

from dare.algorithms.base import (
    ALGORITHMS, Algorithm, AlgorithmConfig, Needs, get_algorithm, register_algorithm, resolve_algorithm_config,
)
from dare.algorithms import sft  # noqa: F401,E402  (registers "sft")
from dare.algorithms import bgpo, cj_grpo, coupled_grpo, d1, ebpo, mdpo, spg, tracerl, vrpo, wd1  # noqa: F401,E402,I001
from dare.algorithms import espo, gdpo, justgrpo  # noqa: F401,E402,I001
from dare.algorithms import dipo, dtreerpo, igpo  # noqa: F401,E402  (2026 algorithms, one module each)

__all__ = ["ALGORITHMS", "Algorithm", "AlgorithmConfig", "Needs", "get_algorithm", "register_algorithm",
           "resolve_algorithm_config"]
