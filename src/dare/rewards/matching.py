"""Rewards for the generated tasks of ``dare.data.synthetic`` (copy, reverse, add): the completion (stripped)
against ``answer``.

* ``exact_match``: ``partial`` = matching characters at equal positions / max(len(prediction), len(answer)); the
  reward is ``partial`` (``dense=True``, a learning signal for a partly competent model) or ``1[exact]``.
* ``char_closeness``: per position, credit ``max(0, 1 - |ord(p) - ord(g)| / scale)`` (1 for the right
  character, less for a character nearby in the code table), summed and divided by max(len(prediction),
  len(answer)). Its maximum is the exact answer, and it varies between the completions of even a random model, so
  a group of rollouts is (almost) never flat: the tiny RL recipes use it to get a gradient from the first step.
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


@register_reward("char_closeness")
class CharClosenessReward(Reward):
    required_fields = ("answer",)

    def __init__(self, scale: float = 32.0):
        if scale <= 0:
            from dare.errors import ConfigError

            raise ConfigError(f"char_closeness: scale must be positive; got {scale}")
        self.scale = float(scale)

    def score_one(self, completion: str, sample: Mapping[str, Any]) -> RewardResult:
        pred, gold = completion.strip(), str(sample["answer"]).strip()
        credit = sum(max(0.0, 1.0 - abs(ord(a) - ord(b)) / self.scale) for a, b in zip(pred, gold))
        reward = credit / max(len(pred), len(gold), 1)
        return RewardResult(reward=reward, correct=pred == gold, partial=reward, extracted=pred)
