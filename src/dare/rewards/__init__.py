"""Reward plug-ins (``get_reward(name).score(completions, samples)``) and the code sandbox.

Built-in rewards: ``math``, ``gsm8k``, ``choice``, ``countdown``, ``sudoku``, ``code`` and the format
rewards ``code_format``, ``xml_count``, ``soft_format``, ``strict_format``, ``integer_answer``,
``boxed_format``; presets combine them as the reference recipes do (``coupled_grpo_code``,
``d1_gsm8k``, ``d1_math``, ``d1_countdown``, ``d1_sudoku``).
"""

from dare.rewards.base import (
    PRESETS, REWARDS, Reward, RewardFailed, RewardResult, WeightedSum, get_reward, register_reward, reward_fields,
    score_checked,
)
from dare.rewards import coding, countdown, formats, matching, sudoku, verifiers  # noqa: F401,E402  (register)
from dare.rewards.sandbox import ExecResult, Program, Sandbox, SandboxConfig, default_sandbox

__all__ = [
    "PRESETS",
    "REWARDS",
    "ExecResult",
    "Program",
    "Reward",
    "RewardFailed",
    "RewardResult",
    "Sandbox",
    "SandboxConfig",
    "WeightedSum",
    "default_sandbox",
    "get_reward",
    "register_reward",
    "reward_fields",
    "score_checked",
]
