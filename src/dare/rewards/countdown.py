"""Countdown: reach ``target`` with an arithmetic expression over ``numbers``, each used exactly once.

Scoring follows d1 / SPG ``compute_score``: 1.0 for a correct expression, ``format_score`` (0.1) when
an expression was extracted but is invalid or misses the target, 0.0 when none was found. Unlike d1
(regex + ``eval``), the expression is parsed with :mod:`ast`: only integer literals, ``+ - * /``, unary
minus and parentheses are accepted, and it is evaluated in exact rational arithmetic, so ``1/3*3``
equals 1 exactly and nothing but arithmetic can ever run.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from collections.abc import Mapping
from fractions import Fraction
from typing import Any

from dare.rewards.answers import answer_tag, last_boxed
from dare.rewards.ast_parse import parse
from dare.rewards.base import Reward, RewardResult, register_reward

_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


class InvalidExpression(ValueError):
    """The expression is not plain arithmetic over integer literals."""


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """Exact value of an arithmetic expression and the integer literals it uses.

    Raises :class:`InvalidExpression` for anything but integers, ``+ - * /``, unary minus and
    parentheses (names, calls, attributes, powers, floats, ...) and for division by zero.
    """
    if len(expression) > 500:
        raise InvalidExpression("expression too long")
    try:
        tree = parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as err:
        raise InvalidExpression(f"not an expression: {getattr(err, 'msg', err)}") from None
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise InvalidExpression("division by zero")
            return _BINOPS[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        raise InvalidExpression(f"'{type(node).__name__}' is not allowed")

    try:
        return walk(tree.body), used
    except RecursionError:
        raise InvalidExpression("expression nested too deeply") from None


def extract_expression(text: str) -> str | None:
    """The proposed expression: last ``<answer>`` tag, else last box; LaTeX operators become Python's
    and a trailing ``= target`` is dropped (d1 ``parse_countdown_answers``)."""
    expr = answer_tag(text)
    if expr is None:
        expr = last_boxed(text)
    if expr is None:
        return None
    expr = expr.replace("\\times", "*").replace("\\cdot", "*").replace("\\div", "/")
    expr = expr.replace("×", "*").replace("÷", "/").replace("−", "-").replace("$", "")
    expr = re.sub(r"\\(?:left|right)", "", expr).strip()
    if "=" in expr:  # "2*4-3 = 5" -> "2*4-3" ; "5 = 2*4-3" -> "2*4-3"
        sides = [s.strip() for s in expr.split("=") if s.strip()]
        expr = max(sides, key=lambda s: sum(ch in "+-*/" for ch in s)) if sides else ""
    return expr


@register_reward("countdown")
class CountdownReward(Reward):
    """Samples carry ``numbers`` (list of ints) and ``target`` (int)."""

    required_fields = ("numbers", "target")

    def __init__(self, format_score: float = 0.1, score: float = 1.0):
        self.format_score = format_score
        self.correct_score = score

    def score_one(self, completion: str, sample: Mapping[str, Any]) -> RewardResult:
        numbers = [int(n) for n in sample["numbers"]]
        target = Fraction(str(sample["target"]))
        expr = extract_expression(completion)
        if expr is None:
            return RewardResult(0.0, False, info={"why": "no expression"})
        try:
            value, used = evaluate(expr)
        except InvalidExpression as err:
            return self._invalid(expr, str(err))
        if Counter(used) != Counter(numbers):
            return self._invalid(expr, f"uses {sorted(used)}, must use each of {sorted(numbers)} exactly once")
        if value != target:
            return self._invalid(expr, f"evaluates to {value}")
        return RewardResult(self.correct_score, True, extracted=expr, components={"correct": self.correct_score})

    def _invalid(self, expr: str, why: str) -> RewardResult:
        """d1: an extracted but wrong or invalid expression still earns the format score."""
        score = self.format_score
        return RewardResult(score, False, extracted=expr, components={"format": score}, info={"why": why})
