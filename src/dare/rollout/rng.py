"""Per-example random streams: a row's samples depend on (seed, example id) only, never on its batch."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch


def derive_seed(*parts: int) -> int:
    """A 63-bit seed mixing ``parts`` (e.g. base seed, example index) without collisions between tuples."""
    digest = hashlib.blake2b(":".join(str(int(p)) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def example_generators(seed: int, example_ids: Iterable[int], device: torch.device | str) -> list[torch.Generator]:
    """One ``torch.Generator`` on ``device`` per example, seeded by ``derive_seed(seed, example_id)``."""
    device = torch.device(device)
    return [torch.Generator(device=device).manual_seed(derive_seed(seed, i)) for i in example_ids]
