"""Sudoku (4x4 as in d1 / SPG, any n² x n² grid): partial credit = fraction of the puzzle's empty
cells filled with the solution's digit (d1 ``validate_sudoku_solution``: the answer's digits padded
with '0' / truncated to the grid size, 0.0 when no answer). ``correct`` = the full grid is a valid
sudoku that keeps the givens (equal to the solution when it is unique). The reward is the partial
credit, as in d1.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from dare.errors import InputError
from dare.rewards.answers import answer_tag
from dare.rewards.base import Reward, RewardResult, register_reward


def grid_string(grid: str | Sequence[Any]) -> str:
    """A grid as one string of digits, '0' for empty (accepts ``"3102..."``, ``"3 _ 0 2\\n..."``,
    lists of rows with ints / ``None``)."""
    if isinstance(grid, str):
        cells = re.findall(r"[0-9_.]", grid)
        return "".join("0" if c in "_." else c for c in cells)
    flat = []
    for row in grid:
        for cell in row if isinstance(row, (list, tuple)) else [row]:
            flat.append("0" if cell in (None, "", "_", ".") else str(int(cell)))
    return "".join(flat)


def is_valid_solution(cells: str, givens: str) -> bool:
    """Whether ``cells`` is a complete valid sudoku that agrees with the non-zero ``givens``."""
    size = math.isqrt(len(cells))
    box = math.isqrt(size)
    if size * size != len(cells) or box * box != size or len(givens) != len(cells):
        return False
    if any(g != "0" and g != c for g, c in zip(givens, cells)):
        return False
    digits = set("123456789"[:size])
    rows = [cells[r * size:(r + 1) * size] for r in range(size)]
    cols = ["".join(row[c] for row in rows) for c in range(size)]
    boxes = [
        "".join(rows[r][c] for r in range(br, br + box) for c in range(bc, bc + box))
        for br in range(0, size, box)
        for bc in range(0, size, box)
    ]
    return all(set(unit) == digits for unit in rows + cols + boxes)


def extract_grid(text: str, n_cells: int) -> str | None:
    """Digits of the last ``<answer>`` tag (d1), else the last run of ``n_cells`` digits separated only
    by spaces/newlines/``|``/``,`` (d1's eval fallback ``\\b(\\d{16})\\b``, generalised)."""
    tag = answer_tag(text)
    if tag is not None:
        return "".join(ch for ch in tag if ch.isdigit())
    runs = re.findall(r"(?:\d[\s|,]*){%d,}" % n_cells, text)
    if not runs:
        return None
    digits = "".join(ch for ch in runs[-1] if ch.isdigit())
    return digits[-n_cells:]


@register_reward("sudoku")
class SudokuReward(Reward):
    """Samples carry ``puzzle`` and ``solution`` (strings with '0' for empty cells, or lists of rows)."""

    required_fields = ("puzzle", "solution")

    def score_one(self, completion: str, sample: Mapping[str, Any]) -> RewardResult:
        puzzle, solution = grid_string(sample["puzzle"]), grid_string(sample["solution"])
        if len(puzzle) != len(solution) or math.isqrt(len(puzzle)) ** 2 != len(puzzle):
            raise InputError(f"sudoku: puzzle has {len(puzzle)} cells and solution {len(solution)}; need one square grid")
        n = len(puzzle)
        answer = extract_grid(completion, n)
        empty = [i for i, c in enumerate(puzzle) if c == "0"]
        if not answer:
            return RewardResult(0.0, False, partial=0.0, info={"why": "no grid", "empty_cells": len(empty), "correct_cells": 0})
        cells = (answer + "0" * n)[:n]
        right = sum(cells[i] == solution[i] for i in empty)
        partial = right / len(empty) if empty else 0.0
        correct = cells == solution or is_valid_solution(cells, puzzle)
        if correct:  # a different valid completion of a non-unique puzzle earns full credit too
            partial = 1.0
        info = {"empty_cells": len(empty), "correct_cells": right}
        return RewardResult(partial, correct, partial=partial, extracted=answer, components={"cells": partial}, info=info)
