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

    def set_mode(self, mode: str, replace_start: int = 0) -> KVCache:
        if mode not in CACHE_MODES:
            raise InputError(f"unknown cache mode '{mode}'; choose from {', '.join(CACHE_MODES)}")
        self.mode, self.replace_start = mode, replace_start
        return self

    @property
    def seq_len(self) -> int:
        """Number of cached positions (0 when empty)."""
        return 0 if not self.keys or self.keys[0] is None else self.keys[0].shape[2]

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
        return self

    def reorder(self, index: torch.Tensor) -> KVCache:
        """Keep the batch rows ``index`` (e.g. drop finished sequences)."""
        self.keys = [None if k is None else k[index] for k in self.keys]
        self.values = [None if v is None else v[index] for v in self.values]
        return self
