"""Tiny generated SFT tasks for tests and demos (deterministic in the seed, no downloads).

``copy`` (repeat a string), ``reverse`` (reverse it) and ``add`` (sum of two small integers); records are
``{"prompt": ..., "response": ...}`` like a jsonl dataset.
"""

from __future__ import annotations

import random

from dare.errors import unknown_choice

ALPHABET = "abcdefgh"


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(3, 6)))


def _copy(rng):
    w = _word(rng)
    return {"prompt": f"copy {w}", "response": w}


def _reverse(rng):
    w = _word(rng)
    return {"prompt": f"reverse {w}", "response": w[::-1]}


def _add(rng):
    a, b = rng.randint(0, 49), rng.randint(0, 49)
    return {"prompt": f"{a}+{b}=", "response": str(a + b)}


TASKS = {"copy": _copy, "reverse": _reverse, "add": _add}


def check_task(task: str) -> None:
    """One-line error for a task that is not one of :data:`TASKS`."""
    if task not in TASKS:
        raise unknown_choice("synthetic task", task, TASKS)


def synthetic_records(task: str, n: int, seed: int = 0) -> list[dict]:
    """``n`` records of ``task`` (copy, reverse, add)."""
    check_task(task)
    rng = random.Random(f"{task}:{seed}")
    return [TASKS[task](rng) for _ in range(n)]
