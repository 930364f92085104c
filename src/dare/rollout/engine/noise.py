"""Counter-based random numbers for static decoding steps: one stream per row, no generator objects.

A CUDA graph replays the same kernels every step, so randomness must come from device tensors: every number
is a hash of ``(row key, row step, completion position, stream[, vocabulary index])``. A row's key comes from
``derive_seed(seed, example_id)`` and its step counter only advances when the row takes a step, so the numbers
a row sees never depend on the other rows of its batch, on the batch bucket or on how many steps the batch ran.

The hash is a 32-bit integer mixer (multiply / xor-shift rounds) evaluated in int64 lanes holding values in
``[0, 2^32)``; uniforms take its top 23 bits, ``u = (k + 0.5) / 2^23``: exact in float32, so strictly inside
``(0, 1)`` and the Gumbel noise ``-log(-log u)`` is always finite (with 24 bits the largest value rounds to 1.0,
whose noise is ``+inf``: that entry would be drawn whatever its probability, even outside a filter).
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9
"""The 32-bit golden-ratio constant: streams and vocabulary entries are spaced by it before mixing."""
STREAM_SAMPLE = 1
"""Stream of the Gumbel noise tokens are drawn with."""
STREAM_CONFIDENCE = 2
"""Stream of the ``random`` confidence."""
UNIFORM_SHIFT = 9
"""A uniform keeps the hash's top ``32 - UNIFORM_SHIFT`` = 23 bits (:func:`uniform`)."""
UNIFORM_SCALE = 1.0 / 8388608.0
"""``2^-23``: the spacing of the uniforms (:func:`uniform`)."""


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijective 32-bit mixer on int64 tensors holding values in ``[0, 2^32)``."""
    x = ((x ^ (x >> 16)) * 0x21F0AAAD) & MASK32
    x = ((x ^ (x >> 15)) * 0x735A2D97) & MASK32
    return x ^ (x >> 15)


def row_keys(seeds: list[int], device) -> torch.Tensor:
    """``[B, 2]`` int64 (low, high 32 bits) of each row's 63-bit seed."""
    keys = torch.tensor([[s & MASK32, (s >> 32) & MASK32] for s in seeds], dtype=torch.long)
    return keys.to(device)


def position_hash(keys: torch.Tensor, counters: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """``[B, W]`` hashes of (row key ``[B, 2]``, row step ``[B]``, completion position ``[W]`` or ``[B, W]``, stream).

    The step counter is mixed before it joins the position's hash: XORed in raw, a collision between
    ``(p1, step c1)`` and ``(p2, step c2)`` (hashes before the counter differing by ``c1 ^ c2``) would repeat at
    every pair of steps with the same difference, the same two positions drawing the same noise step after step."""
    pos = positions if positions.ndim == 2 else positions[None, :]
    h = mix32((pos.long() + stream * GOLDEN) & MASK32)
    h = mix32(h ^ keys[:, 0:1])
    h = mix32(h ^ keys[:, 1:2])
    return mix32(h ^ mix32(counters[:, None].long() & MASK32))


def uniform(hashes: torch.Tensor) -> torch.Tensor:
    """float32 uniforms strictly inside ``(0, 1)`` from 32-bit hashes: ``(k + 0.5) / 2^23`` of their top 23 bits
    ``k``, exact in float32 (from ``2^-24`` to ``1 - 2^-24``)."""
    return ((hashes >> UNIFORM_SHIFT).to(torch.float32) + 0.5) * UNIFORM_SCALE


def gumbel_argmax(scores: torch.Tensor, base: torch.Tensor, salts: torch.Tensor | None = None) -> torch.Tensor:
    """``argmax(scores + Gumbel)`` over the last axis of float32 ``scores [B, W, V]``: a sample from
    ``softmax(scores)``. The Gumbel noise of entry ``v`` is a hash of ``base [B, W]`` (:func:`position_hash`)
    and ``salts[v]`` (default :func:`vocabulary_salts`); ``-inf`` scores are never drawn. The scores are shifted
    by their row's max before the noise joins them: at tiny temperatures ``logit / T`` is so large that float32
    would drop the noise's low bits and exactly tied logits would go to the lower id; shifted, tied maxima are
    exactly 0 and the noise alone breaks their tie. Pure tensor ops: the engine compiles them with the rest of a
    proposal (:mod:`dare.rollout.engine.compiled`), passing ``salts``."""
    if salts is None:
        salts = vocabulary_salts(scores.shape[-1], scores.device)
    h = mix32(base[..., None] ^ salts)
    top = scores.amax(-1, keepdim=True)
    shifted = scores - torch.where(top == float("-inf"), torch.zeros_like(top), top)
    return (shifted - torch.log(-torch.log(uniform(h)))).argmax(-1)


_SALTS: dict = {}


def vocabulary_salts(vocab: int, device) -> torch.Tensor:
    """``[V]`` int64: ``(v x golden) mod 2^32`` per vocabulary entry, computed once per (size, device).

    A constant tensor rather than an expression of ``arange`` inside a compiled kernel: the compiler evaluates
    index expressions in int32, where the 32-bit constant does not fit."""
    key = (vocab, str(device))
    if key not in _SALTS:
        _SALTS[key] = (torch.arange(vocab, device=device, dtype=torch.long) * GOLDEN) & MASK32
    return _SALTS[key]
