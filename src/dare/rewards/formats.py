"""Format rewards of the reference recipes (never count as accuracy: ``correct`` is always False).

* d1 / SPG (``diffu-grpo/reward_func.py``): ``xml_count`` (0.125 per well-placed
  ``<reasoning>``/``<answer>`` tag, minus 0.001 per character after ``</answer>``), ``soft_format`` and
  ``strict_format`` (the ``<reasoning>...</reasoning><answer>...</answer>`` layout, 1.0 here, weighted
  0.5 by the ``d1_gsm8k`` preset; as in d1 the soft pattern has no DOTALL, so tag contents spanning
  lines fail it, and the strict one allows one line per tag), ``integer_answer`` (the answer tag holds only digits),
  ``boxed_format`` (d1 math ``boxed_in_answer``: 1 for answer tags + 1 for a box inside, else 0.5).
* DiffuCoder (``src/open_r1/rewards.py::get_code_format_reward``): ``code_format`` is 1.0 when the
  completion is prose then exactly one ```` ```python ```` block closing the text and the code parses,
  0.5 when that block has a syntax error, else 0.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dare.rewards.answers import answer_tag
from dare.rewards.ast_parse import parse
from dare.rewards.base import Reward, RewardResult, register_reward


class _FormatReward(Reward):
    def value(self, completion: str) -> float:
        raise NotImplementedError

    def score_one(self, completion: str, sample: Mapping[str, Any]) -> RewardResult:
        return RewardResult(reward=self.value(completion), correct=False)


@register_reward("xml_count")
class XmlCountReward(_FormatReward):
    def value(self, text: str) -> float:
        score = 0.0
        if text.count("<reasoning>\n") == 1:
            score += 0.125
        if text.count("\n</reasoning>\n") == 1:
            score += 0.125
        if text.count("\n<answer>\n") == 1:
            score += 0.125 - len(text.split("\n</answer>\n")[-1]) * 0.001
        if text.count("\n</answer>") == 1:
            score += 0.125 - (len(text.split("\n</answer>")[-1]) - 1) * 0.001
        return score


@register_reward("soft_format")
class SoftFormatReward(_FormatReward):
    def value(self, text: str) -> float:
        return float(bool(re.match(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", text)))


@register_reward("strict_format")
class StrictFormatReward(_FormatReward):
    def value(self, text: str) -> float:
        return float(bool(re.match(r"^<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n$", text)))


@register_reward("integer_answer")
class IntegerAnswerReward(_FormatReward):
    def value(self, text: str) -> float:
        # d1 splits on the tags without requiring them, so a bare integer also counts
        inner = text.split("<answer>")[-1].split("</answer>")[0].strip()
        return float(inner.isdigit())


@register_reward("boxed_format")
class BoxedFormatReward(_FormatReward):
    """d1's ``boxed_in_answer``. d1 tests ``"\\boxed"`` written as ``"\boxed"`` (a backspace), so it
    always adds 0.5; this reward implements the evident intent (1.0 when a box is inside the tags)."""

    def value(self, text: str) -> float:
        inner = answer_tag(text)
        if inner is None:
            return 0.5 if "\\boxed" not in text else 1.0
        return 1.0 + (1.0 if "\\boxed" in inner else 0.5)


_CODE_LAYOUT = re.compile(r"^(?:(?!```)[\s\S])*?```python\n(?:(?!```)[\s\S])*?```\n$", re.DOTALL)


@register_reward("code_format")
class CodeFormatReward(_FormatReward):
    def value(self, text: str) -> float:
        if not _CODE_LAYOUT.fullmatch(text):
            return 0.0
        block = re.search(r"```python\n(.*?)```", text, re.DOTALL)
        try:
            parse(block.group(1).strip())
        except (SyntaxError, ValueError):
            return 0.5
        return 1.0
