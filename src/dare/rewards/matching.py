"""``exact_match``: the completion (stripped) equals ``answer``, with per-character partial credit.

Meant for the generated tasks of ``dare.data.synthetic`` (copy, reverse, add) used by the tiny RL recipes and
the demo: ``partial`` = matching characters at equal positions / max(len(prediction), len(answer)), and the
reward is ``partial`` (``dense=True``, a learning signal even for a weak model) or ``1[exact]``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dare.rewards.base import Reward, RewardResult, register_reward


@register_reward("exact_match")
class ExactMatchReward(Reward):
    required_fields = ("answer",)

    def __init__(self, dense: bool = True):
        self.dense = dense

    def score_one(self, completion: str, sample: Mapping[str, Any]) -> RewardResult:
        pred, gold = completion.strip(), str(sample["answer"]).strip()
        same = sum(a == b for a, b in zip(pred, gold))
        partial = same / max(len(pred), len(gold), 1)
        correct = pred == gold
        return RewardResult(reward=partial if self.dense else float(correct), correct=correct, partial=partial,
                            extracted=pred)
