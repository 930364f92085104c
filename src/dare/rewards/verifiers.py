"""Answer-matching rewards: ``math`` (math-verify), ``gsm8k`` (numbers) and ``choice`` (option letters).

Each returns 1.0 for a correct answer and 0.0 otherwise (scale with weights in a combined reward);
samples carry ``answer`` (and ``labels`` for ``choice``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dare.rewards import answers
from dare.rewards.base import Reward, RewardResult, register_reward


def _binary(correct: bool, extracted: Any, **info: Any) -> RewardResult:
    return RewardResult(reward=float(correct), correct=correct, extracted=extracted, info=info)


@register_reward("math")
class MathReward(Reward):
    """Last ``\\boxed{}`` (else ``<answer>`` tag, else "the answer is") checked with math-verify.

    ``answer`` may be the bare gold answer or a worked solution containing a box (MATH's ``solution``).
    """

    required_fields = ("answer",)

    def score_one(self, completion: str, sample: Mapping[str, Any]) -> RewardResult:
        gold = answers.math_gold(sample["answer"])
        pred = answers.extract_math_answer(completion)
        return _binary(answers.math_equal(pred, gold), pred, gold=gold)


@register_reward("gsm8k")
class NumberReward(Reward):
    """GSM8K-style final number (``#### x``, box, ``<answer>``, "the answer is", last number)."""

    required_fields = ("answer",)

    def score_one(self, completion: str, sample: Mapping[str, Any]) -> RewardResult:
        gold = answers.gsm8k_gold(sample["answer"])
        pred = answers.extract_number_answer(completion)
        return _binary(answers.numbers_equal(pred, gold), pred, gold=gold)


@register_reward("choice")
class ChoiceReward(Reward):
    """Multiple choice: the option letter the completion commits to equals ``answer``.

    ``labels`` (default ``ABCD``) are the valid letters; a completion that is exactly one of the
    ``choices`` texts also counts as choosing it. An integer ``answer`` is an option index (MMLU's native rows:
    ``1`` is ``B``).
    """

    required_fields = ("answer",)

    def score_one(self, completion: str, sample: Mapping[str, Any]) -> RewardResult:
        labels = list(sample.get("labels") or "ABCD")
        pred = answers.extract_choice(completion, labels)
        if pred is None and sample.get("choices"):
            norm = completion.strip().rstrip(".").lower()
            for label, text in zip(labels, sample["choices"]):
                if norm == str(text).strip().rstrip(".").lower():
                    pred = label
        gold = sample["answer"]
        if isinstance(gold, int) and not isinstance(gold, bool) and 0 <= gold < len(labels):
            gold = labels[gold]
        return _binary(pred is not None and pred == str(gold).strip(), pred, gold=gold)
