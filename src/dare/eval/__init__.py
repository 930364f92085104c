"""Evaluation: benchmark registry, prompts, answer extraction/scoring, pass@k, results files.

``get_benchmark(name)`` -> :class:`Benchmark` (load -> prompts -> score); ``score_predictions`` turns
predictions into an :class:`EvalResults` (the results file). ``evaluate(model, tokenizer, bench, samples,
sampler=SamplerConfig(...), config=EvalConfig(...))`` runs a model on a benchmark (generation with any
registered sampler, or MC-ELBO likelihood scoring of multiple-choice options) and returns the results.
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
from dare.eval.likelihood import LikelihoodConfig, Request, continuation_elbo
from dare.eval.results import SCHEMA, EvalResults
from dare.eval.run import EvalConfig, evaluate
from dare.eval.scoring import pass_at_k, score_predictions

__all__ = [
    "BENCHMARKS",
    "SCHEMA",
    "Benchmark",
    "EvalConfig",
    "EvalResults",
    "GenerationDefaults",
    "HFSource",
    "LikelihoodConfig",
    "PromptTemplate",
    "Request",
    "Sample",
    "continuation_elbo",
    "evaluate",
    "get_benchmark",
    "pass_at_k",
    "register_benchmark",
    "score_predictions",
]

from dare.eval import benchmarks as _builtin  # noqa: E402,F401  (registers the built-in benchmarks)
