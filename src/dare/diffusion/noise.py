"""Per-example random streams: the noise of one example never depends on batching, ranks or resume.

Every random draw of a forward process comes from :func:`example_generator`, a ``torch.Generator``
seeded by a hash of ``(seed, example_index, step, mc_index, stream)``. The same example at the same
optimizer step therefore gets the same corruption whether it sits in the first or the second
micro-batch, on rank 0 or rank 3, before or after a restart.
"""

from __future__ import annotations

import torch

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """The SplitMix64 finaliser: a bijective 64-bit mixer (good avalanche, no state)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def example_seed(seed: int, example_index: int, step: int = 0, mc_index: int = 0, stream: int = 0) -> int:
    """A 63-bit seed derived from the tuple (distinct tuples give unrelated seeds)."""
    h = 0
    for part in (seed, example_index, step, mc_index, stream):
        h = _splitmix64(h ^ (int(part) & _MASK64))
    return h & ((1 << 63) - 1)


def example_generator(seed: int, example_index: int, step: int = 0, mc_index: int = 0,
                      stream: int = 0) -> torch.Generator:
    """A CPU generator private to one (example, step, Monte-Carlo sample, purpose).

    Args:
        seed: the run's seed.
        example_index: global index of the example in the dataset / rollout batch (not its row).
        step: optimizer step (so the same example gets fresh noise in every epoch / update).
        mc_index: Monte-Carlo sample index (independent corruptions of one example).
        stream: purpose of the draws (e.g. 0 = response masks, 1 = stratification offsets,
            2 = prompt masking) so adding a new kind of draw never shifts existing ones.
    """
    return torch.Generator(device="cpu").manual_seed(example_seed(seed, example_index, step, mc_index, stream))


def sample_t(gen: torch.Generator, low: float = 1e-3, high: float = 1.0) -> float:
    """One masking ratio ``t = low + (high - low) u``, ``u ~ U(0, 1)``.

    With ``low = eps`` and ``high = 1`` this is the LLaDA draw ``t = (1 - eps) u + eps`` (eps = 1e-3 keeps
    the ``1/t`` weight below 1000).
    """
    u = torch.rand((), generator=gen, dtype=torch.float64).item()
    return low + (high - low) * u
