"""Synthetic SFT workloads shared by the training benchmarks (fixed-seed, no downloads).

Sequence lengths are log-uniform between ``min_len`` and ``max_len`` (many short answers, a long tail, like
SFT answer lengths); each example's prompt is 10-50 % of it. Token ids are uniform below the smallest
special id, so no random token is a mask / EOS / pad token.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from dare.data.sft import Example


@dataclass(frozen=True)
class Workload:
    """The examples of one optimizer step and their lengths."""

    examples: list[Example]

    @property
    def lengths(self) -> list[int]:
        return [len(ex) for ex in self.examples]

    @property
    def tokens(self) -> int:
        return sum(self.lengths)

    @property
    def answer_tokens(self) -> int:
        return sum(len(ex) - ex.prompt_len for ex in self.examples)

    def summary(self) -> dict:
        lengths = sorted(self.lengths)
        return {"examples": len(lengths), "tokens": self.tokens, "answer_tokens": self.answer_tokens,
                "min": lengths[0], "median": lengths[len(lengths) // 2], "max": lengths[-1],
                "mean": round(self.tokens / len(lengths), 1)}


def sample_lengths(tokens: int, min_len: int, max_len: int, seed: int = 0) -> list[int]:
    """Log-uniform lengths in ``[min_len, max_len]`` whose sum is at most ``tokens`` (at least one length)."""
    if not 1 <= min_len <= max_len:
        raise ValueError(f"need 1 <= min_len <= max_len; got {min_len}, {max_len}")
    rng = random.Random(seed)
    lengths: list[int] = []
    while True:
        length = int(round(math.exp(rng.uniform(math.log(min_len), math.log(max_len)))))
        if lengths and sum(lengths) + length > tokens:
            return lengths
        lengths.append(length)


def make_workload(tokens: int, min_len: int, max_len: int, vocab_limit: int, seed: int = 0) -> Workload:
    """Examples of :func:`sample_lengths` with random ids in ``[0, vocab_limit)`` and 10-50 % prompts."""
    rng = random.Random(seed + 1)
    examples = []
    for index, length in enumerate(sample_lengths(tokens, min_len, max_len, seed)):
        prompt = min(length - 1, max(1, int(length * rng.uniform(0.1, 0.5))))
        ids = tuple(rng.randrange(vocab_limit) for _ in range(length))
        examples.append(Example(ids, prompt, index))
    return Workload(examples)


def fixed_workload(rows: int, length: int, prompt: int, vocab_limit: int, seed: int = 0) -> Workload:
    """``rows`` examples of exactly ``length`` tokens (RL-style: prompt + fixed generation length)."""
    rng = random.Random(seed + 2)
    return Workload([Example(tuple(rng.randrange(vocab_limit) for _ in range(length)), prompt, i) for i in range(rows)])
