"""Score predictions of a benchmark: per-prediction records, accuracy, pass@k, partial credit."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from dare.errors import InputError
from dare.eval.benchmark import Benchmark, Sample
from dare.eval.results import EvalResults


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021): ``1 - C(n-c, k) / C(n, k)`` for ``c`` correct of ``n``."""
    if not 0 <= c <= n or k < 1 or k > n:
        raise InputError(f"pass@k needs 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)))


def default_ks(n_min: int) -> list[int]:
    """pass@k reported by default: 1, 5, 10, 20, 50, 100 up to n, and n itself."""
    return sorted({k for k in (1, 5, 10, 20, 50, 100) if k <= n_min} | {n_min})


def score_predictions(
    benchmark: Benchmark,
    samples: Sequence[Sample],
    predictions: Sequence[str | Sequence[str]],
    *,
    prompts: Sequence[str] | None = None,
    ks: Iterable[int] | None = None,
    reward_options: dict[str, Any] | None = None,
    **settings: Any,
) -> EvalResults:
    """Score ``predictions[i]`` (one completion or a list of ``n`` completions) for ``samples[i]``.

    ``settings`` fill the results file (``model``, ``sampler``, ``seed``, ``prompt``, ``data``).
    Metrics: ``accuracy`` (mean correctness over all predictions), ``pass@k`` for every k <= the
    smallest n (code benchmarks always report pass@1), ``partial`` (mean partial credit, where the
    reward defines one), ``cell_accuracy`` (sudoku, pooled over cells as d1 reports it), ``reward``.
    """
    if len(samples) != len(predictions):
        raise InputError(f"{benchmark.name}: {len(predictions)} predictions for {len(samples)} samples")
    groups = [[p] if isinstance(p, str) else list(p) for p in predictions]
    for sample, group in zip(samples, groups):
        if not group:
            raise InputError(f"{benchmark.name}: sample {sample.id} has no prediction")
        bad = [type(p).__name__ for p in group if not isinstance(p, str)]
        if bad:
            raise InputError(f"{benchmark.name}: sample {sample.id} has a non-text prediction ({bad[0]})")
    sizes = [len(group) for group in groups]
    for k in sorted(set(ks or ())):  # before any program runs
        if k > min(sizes):
            raise InputError(f"{benchmark.name}: pass@{k} needs at least {k} predictions per problem (fewest: "
                             f"{min(sizes)})")
    if min(sizes) != max(sizes):
        logging.getLogger("dare.eval").warning(
            f"warning: {benchmark.name}: problems have {min(sizes)} to {max(sizes)} predictions each: accuracy is the "
            "mean over predictions (a problem with more counts more), pass@k uses each problem's own n")
    flat = [(i, j, p) for i, group in enumerate(groups) for j, p in enumerate(group)]
    results = benchmark.score([p for _, _, p in flat], [samples[i] for i, _, _ in flat], **(reward_options or {}))

    records = []
    for (i, j, prediction), result in zip(flat, results):
        sample = samples[i]
        record = {"id": sample.id, "sample_index": j}
        if prompts is not None:
            record["prompt"] = prompts[i]
        record.update(
            prediction=prediction,
            extracted=result.to_dict()["extracted"],
            gold=sample.answer,
            correct=result.correct,
            reward=result.reward,
            partial=result.partial,
            components=result.components,
            info=result.info,
        )
        records.append(record)

    metrics = _metrics(benchmark, groups, results, ks)
    return EvalResults(
        benchmark=benchmark.name,
        metrics=metrics,
        samples=records,
        num_problems=len(samples),
        num_predictions=len(flat),
        **settings,
    )


def _metrics(benchmark: Benchmark, groups, results, ks) -> dict[str, float]:
    correct = [r.correct for r in results]
    metrics: dict[str, float] = {"accuracy": float(np.mean(correct))}
    per_problem, start = [], 0
    for group in groups:
        per_problem.append((len(group), sum(correct[start:start + len(group)])))
        start += len(group)
    n_min = min(n for n, _ in per_problem)
    asked = ks is not None  # pass@k values given explicitly are always reported (or refused), never dropped
    ks = sorted(set(ks)) if asked else default_ks(n_min)
    if n_min > 1 or "pass@k" in benchmark.metrics or asked:
        for k in ks:  # an asked k above n_min was refused before scoring; the default ones are <= n_min
            metrics[f"pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for n, c in per_problem]))
    partial = [r.partial for r in results if r.partial is not None]
    if partial:
        metrics["partial"] = float(np.mean(partial))
    if "cell_accuracy" in benchmark.metrics:
        empty = sum(r.info.get("empty_cells", 0) for r in results)
        right = sum(r.info.get("correct_cells", 0) for r in results)
        metrics["cell_accuracy"] = right / empty if empty else 0.0
    metrics["reward"] = float(np.mean([r.reward for r in results]))
    return metrics
