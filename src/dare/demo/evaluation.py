"""Held-out evaluation of the demo: :func:`dare.eval.evaluate` on the GSM8K benchmark, as ``dare eval`` runs it.

Generation mode, zero exemplars of GSM8K's ``few_shot`` template (``Question: ...\\nAnswer:``), no chat template;
completions end at the family's first stop token and the template's stop strings, and are scored by the
benchmark (GSM8K answer extraction: ``####`` > box > ``<answer>`` > "the answer is" > last number). The result is
a regular :class:`dare.eval.EvalResults` results file.
"""

from __future__ import annotations

from collections.abc import Sequence

from dare.demo.task import BENCHMARK, TEMPLATE


def evaluate_heldout(model, tokenizer, samples: Sequence, sampler, *, batch_size: int = 256, seed: int = 0,
                     data: dict | None = None):
    """Decode ``samples`` with ``sampler`` (greedy in the demo) and score them as GSM8K; returns ``EvalResults``."""
    from dare.eval import EvalConfig, evaluate

    config = EvalConfig(mode="generate", shots=0, template=TEMPLATE, chat=False, batch_size=batch_size, seed=seed)
    return evaluate(model, tokenizer, BENCHMARK, list(samples), sampler=sampler, config=config,
                    model_info={"path": str(getattr(model.config, "_name_or_path", ""))}, data_info=dict(data or {}))
