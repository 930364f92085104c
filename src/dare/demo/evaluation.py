"""Held-out evaluation of the demo: :func:`dare.eval.evaluate` on the GSM8K benchmark, as ``dare eval`` runs it.

Generation mode, zero exemplars of GSM8K's ``few_shot`` template (``Question: ...\\nAnswer:``), no chat template;
completions end at the family's first stop token and the template's stop strings, and are scored by the
benchmark (GSM8K answer extraction: ``####`` > box > ``<answer>`` > "the answer is" > last number). The result is
a regular :class:`dare.eval.EvalResults` results file.

The demo's answers have a fixed budget (:func:`dare.demo.pipeline.eval_sampler`) and an untrained model is expected
to use all of it, so ``dare.eval``'s warning about completions cut off at the length (which suggests a
``--gen-length`` that ``dare demo`` does not have) is left out of the demo's output: the results file still counts
them (``timings.finished_by_length``, each sample's ``finish``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence

from dare.demo.task import BENCHMARK, TEMPLATE

CUT_OFF = "positions without a stop (finish=length)"
"""Part of ``dare.eval``'s warning about completions that ran out of positions (the one the demo leaves out)."""


class _DropCutOff(logging.Filter):
    """Drops ``dare.eval``'s cut-off-completions warning (:data:`CUT_OFF`), passes every other record."""

    def filter(self, record: logging.LogRecord) -> bool:
        return CUT_OFF not in record.getMessage()


@contextlib.contextmanager
def without_cut_off_warning() -> Iterator[None]:
    """While open, ``dare.eval`` does not warn about completions that used every position (the demo's own
    evaluations only: the filter is removed on exit)."""
    logger, drop = logging.getLogger("dare.eval"), _DropCutOff()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def evaluate_heldout(model, tokenizer, samples: Sequence, sampler, *, batch_size: int = 256, seed: int = 0,
                     data: dict | None = None):
    """Decode ``samples`` with ``sampler`` (greedy in the demo) and score them as GSM8K; returns ``EvalResults``."""
    from dare.eval import EvalConfig, evaluate

    config = EvalConfig(mode="generate", shots=0, template=TEMPLATE, chat=False, batch_size=batch_size, seed=seed)
    with without_cut_off_warning():
        return evaluate(model, tokenizer, BENCHMARK, list(samples), sampler=sampler, config=config,
                        model_info={"path": str(getattr(model.config, "_name_or_path", ""))},
                        data_info=dict(data or {}))
