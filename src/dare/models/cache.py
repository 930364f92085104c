"""Key/value cache for diffusion decoding.

The cache holds post-RoPE keys/values ``[B, Hkv, S, d]`` per layer. Because the model always applies
RoPE with explicit positions, caching post-RoPE keys is exactly equivalent to Fast-dLLM's pre-RoPE
cache that re-rotates keys every call.

One object serves every caching scheme through its ``mode``:

``append``
    store this call's keys/values after the cached ones and attend over all of them (prefill; committing a
    finished block in block diffusion).
``read``
    attend over cached + this call's keys/values without storing anything (block-diffusion denoising steps;
    Fast-dLLM prefix cache, where the query is the suffix after the cached prefix).
``replace``
    overwrite slots ``[start, start + L)`` with this call's keys/values and attend over the whole cache
    (Fast-dLLM dual cache: prefix and suffix frozen, current block refreshed).

The cache also remembers the RoPE position of every cached key (``positions``, shared by all layers), so
position-dependent attention rules (block-causal masks) see cached keys at their own positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dare.errors import InputError

CACHE_MODES = ("append", "read", "replace")


@dataclass
class KVCache:
    """Per-layer key/value store; see the module docstring for the modes."""

    mode: str = "append"
    replace_start: int = 0
    keys: list[torch.Tensor | None] = field(default_factory=list)
    values: list[torch.Tensor | None] = field(default_factory=list)
    positions: torch.Tensor | None = None  # [B, S] positions of the cached keys (same for every layer)

    def set_mode(self, mode: str, replace_start: int = 0) -> KVCache:
        if mode not in CACHE_MODES:
            raise InputError(f"unknown cache mode '{mode}'; choose from {', '.join(CACHE_MODES)}")
        self.mode, self.replace_start = mode, replace_start
        return self

    @property
    def seq_len(self) -> int:
        """Number of cached positions (0 when empty)."""
        return 0 if not self.keys or self.keys[0] is None else self.keys[0].shape[2]

    def key_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """Positions ``[B, K]`` of the keys a call with query ``positions [B, L]`` attends to, per ``mode``.

        Pure: nothing is recorded until :meth:`store_positions`.
        """
        if self.seq_len == 0:
            if self.mode == "replace":
                raise InputError("cache mode 'replace' needs a filled cache")
            return positions
        if self.positions is None or self.positions.shape[1] != self.seq_len:
            raise InputError("the cache holds keys without recorded positions; fill it through the model's forward")
        cached = self.positions.to(positions.device)
        if self.mode == "replace":
            end = self.replace_start + positions.shape[1]
            if end > cached.shape[1]:
                raise InputError(f"replace slots [{self.replace_start}, {end}) exceed the cache length {cached.shape[1]}")
            cached = cached.clone()
            cached[:, self.replace_start:end] = positions
            return cached
        return torch.cat([cached.expand(positions.shape[0], -1), positions], dim=1)

    def store_positions(self, key_positions: torch.Tensor) -> None:
        """Record the key positions of a call (from :meth:`key_positions`); ``read`` mode stores nothing."""
        if self.mode != "read":
            self.positions = key_positions

    def update(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Combine this call's ``key/value`` with the cache per ``mode``; return what to attend over."""
        while len(self.keys) <= layer:
            self.keys.append(None)
            self.values.append(None)
        old_k, old_v = self.keys[layer], self.values[layer]
        if self.mode == "replace":
            if old_k is None:
                raise InputError("cache mode 'replace' needs a filled cache")
            end = self.replace_start + key.shape[2]
            if end > old_k.shape[2]:
                raise InputError(f"replace slots [{self.replace_start}, {end}) exceed the cache length {old_k.shape[2]}")
            old_k[:, :, self.replace_start:end] = key
            old_v[:, :, self.replace_start:end] = value
            return old_k, old_v
        if old_k is None:
            full_k, full_v = key, value
        else:
            full_k, full_v = torch.cat([old_k, key], dim=2), torch.cat([old_v, value], dim=2)
        if self.mode == "append":
            self.keys[layer], self.values[layer] = full_k, full_v
        return full_k, full_v

    def truncate(self, length: int) -> KVCache:
        """Keep only the first ``length`` cached positions of every layer."""
        self.keys = [None if k is None else k[:, :, :length] for k in self.keys]
        self.values = [None if v is None else v[:, :, :length] for v in self.values]
        if self.positions is not None:
            self.positions = self.positions[:, :length]
        return self

    def reorder(self, index: torch.Tensor) -> KVCache:
        """Keep the batch rows ``index`` (e.g. drop finished sequences)."""
        self.keys = [None if k is None else k[index] for k in self.keys]
        self.values = [None if v is None else v[index] for v in self.values]
        if self.positions is not None:
            self.positions = self.positions[index]
        return self


_WIDE = (torch.int64, torch.int32, torch.int16)


def copy_rows(cache: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor) -> None:
    """``cache.index_copy_(2, slots, rows)``, moving each head row as the widest integer elements that tile it.

    PyTorch's index kernels move one element per thread step: copying bf16 rows as int64 moves 4x the bytes per
    step (on an H200 the LLaDA-8B B=16 dual-cache writes took ~15 us per call as bf16 elements, ~5 % of a
    window step). The bytes written are the same; without a legal wider view of both tensors it copies as is."""
    for dtype in _WIDE:
        if _views_as(cache, dtype) and _views_as(rows, dtype):
            cache.view(dtype).index_copy_(2, slots, rows.view(dtype))
            return
    cache.index_copy_(2, slots, rows)


def _views_as(t: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether ``t.view(dtype)`` is legal and widens the element (PyTorch's rule for a wider dtype view)."""
    ratio = dtype.itemsize // t.element_size()
    if ratio <= 1 or dtype.itemsize % t.element_size() or t.shape[-1] % ratio:
        return False
    return t.stride(-1) == 1 and t.storage_offset() % ratio == 0 and all(st % ratio == 0 for st in t.stride()[:-1])


class StaticLayerKV:
    """One layer's preallocated keys/values ``[B, Hkv, width, d]`` and where a static decoding step writes them.

    The static engine (``dare.rollout.engine``) may pass it to a block in place of the whole cache. Then the
    block writes this step's keys/values itself, in :func:`dare.models.base.rotary_attention`, before the
    attention call that compiled code stops at. Under regional ``torch.compile`` this means:
    * the writes join the block's generated kernels: the value write is fused with the projection split, and
      no separate index kernels are launched;
    * the tensors are ordinary graph inputs, so one compiled graph still serves every layer.
    ``slots`` (``[W]``, device) are the columns written; the step attends over the first ``length`` columns.
    """

    __slots__ = ("keys", "values", "slots", "length")

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys, self.values = keys, values
        self.slots: torch.Tensor | None = None
        self.length = keys.shape[2]

    def store(self, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``key``/``value`` ``[B, Hkv, W, d]`` at :attr:`slots`; return the columns the step attends."""
        if torch.compiler.is_compiling():  # the compiler writes into the buffers in place (no copy of them)
            self.keys.index_copy_(2, self.slots, key)
            self.values.index_copy_(2, self.slots, value)
        else:
            copy_rows(self.keys, self.slots, key)
            copy_rows(self.values, self.slots, value)
        if self.length == self.keys.shape[2]:
            return self.keys, self.values
        return self.keys[:, :, :self.length], self.values[:, :, :self.length]
