"""math-verify equivalence, run inside :class:`dare.rewards.worker.BoundedWorker`'s helper process
(imported there, so the parent never loads sympy for it)."""

from __future__ import annotations

from math_verify import parse, verify


def verify_pair(gold_latex: str, pred_latex: str) -> bool:
    """``verify(parse(gold), parse(pred))``; math-verify's own timeouts are off (the helper is killed instead)."""
    gold = parse(gold_latex, parsing_timeout=None)
    pred = parse(pred_latex, parsing_timeout=None)
    return bool(gold and pred and verify(gold, pred, timeout_seconds=None))
