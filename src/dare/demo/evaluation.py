"""Held-out evaluation of the demo with the GSM8K benchmark's own prompt, answer extraction and scorer.

The steps are those of ``dare eval run`` on GSM8K (generation mode, zero exemplars of the ``few_shot``
template, no chat template): render the prompt with the benchmark, decode with :func:`dare.rollout.generate`,
cut the completion at the family's first stop token and at the template's stop strings, then
:func:`dare.eval.score_predictions` (GSM8K answer extraction: ``####`` > box > ``<answer>`` > "the answer
is" > last number). The result is a regular :class:`dare.eval.EvalResults` results file.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from dare.demo.task import BENCHMARK, TEMPLATE, render_prompt


@torch.no_grad()
def evaluate_heldout(model, tokenizer, samples: Sequence, sampler, *, batch_size: int = 256, seed: int = 0,
                     data: dict | None = None):
    """Greedy (or as ``sampler`` says) completions for ``samples`` scored as GSM8K; returns ``EvalResults``."""
    from dare.eval import get_benchmark, score_predictions
    from dare.rollout import generate
    from dare.trainer.workflow import evaluating

    bench = get_benchmark(BENCHMARK)
    stop_strings = bench.generation_defaults(TEMPLATE).stop
    sampler = sampler.replace(seed=seed).resolved()
    prompts = [render_prompt(bench, s) for s in samples]
    encoded = [list(tokenizer(p, add_special_tokens=True)["input_ids"]) for p in prompts]
    predictions: list[str] = []
    with evaluating(model):
        for lo in range(0, len(encoded), batch_size):
            out = generate(model, encoded[lo:lo + batch_size], config=sampler,
                           example_ids=range(lo, min(lo + batch_size, len(encoded))))
            for row, keep in zip(out.completion.cpu(), out.completion_mask.cpu()):
                text = tokenizer.decode(row[keep].tolist(), skip_special_tokens=True)
                cut = min((text.find(s) for s in stop_strings if s in text), default=-1)
                predictions.append(text[:cut] if cut >= 0 else text)
    return score_predictions(
        bench, list(samples), predictions, prompts=prompts, seed=seed, data=dict(data or {}),
        model={"path": str(getattr(model.config, "_name_or_path", "")),
               "parameters": sum(p.numel() for p in model.parameters())},
        sampler={"name": sampler.sampler, "settings": dataclasses.asdict(sampler)},
        prompt={"template": TEMPLATE, "shots": 0, "chat": False},
    )
