"""Evaluation: benchmark registry, prompts, answer extraction/scoring, pass@k, results files.

``get_benchmark(name)`` -> :class:`Benchmark` (load -> prompts -> score); ``score_predictions`` turns
predictions into an :class:`EvalResults` (the results file). Generation (``dare eval run``) and
likelihood scoring build on these.
"""

from dare.eval.benchmark import (
    BENCHMARKS,
    Benchmark,
    GenerationDefaults,
    HFSource,
    PromptTemplate,
    Sample,
    get_benchmark,
    register_benchmark,
)
from dare.eval.results import SCHEMA, EvalResults
from dare.eval.scoring import pass_at_k, score_predictions

__all__ = [
    "BENCHMARKS",
    "SCHEMA",
    "Benchmark",
    "EvalResults",
    "GenerationDefaults",
    "HFSource",
    "PromptTemplate",
    "Sample",
    "get_benchmark",
    "pass_at_k",
    "register_benchmark",
    "score_predictions",
]

from dare.eval import benchmarks as _builtin  # noqa: E402,F401  (registers the built-in benchmarks)
