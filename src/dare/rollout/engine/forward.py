"""The model forward of a static decoding step: fixed shapes, a preallocated KV cache, no host syncs.

:func:`static_hidden` runs the family's own modules (``embed``, ``blocks``, ``final_norm``; the LM head is applied
by the caller on the rows it needs) like :meth:`dare.models.base.DiffusionLM.forward`, without that method's input
checks (they read device values) and with a :class:`StaticKVCache`: this call's keys/values are written into
their canvas columns (``slots``, a device tensor) and attention runs over the whole preallocated cache, in which
columns not yet written hold zeros and are excluded by the key mask or the block-causal rule.

For a full-attention model this equals each Fast-dLLM cache mode: ``prefix`` (write ``[start, L)``; columns
before ``start`` hold the block-start keys) and ``dual`` (write the block; the rest is frozen). For a
block-causal model it equals the exact block cache (earlier blocks hold the keys of their final tokens; later
columns are never attended).
"""

from __future__ import annotations

import torch

from dare.models.attention import AttentionLayout
from dare.models.layers import rope_angles


class StaticKVCache:
    """Keys/values ``[B, Hkv, width, d]`` per layer, allocated on the first write (zeros) and reused.

    ``length`` (a host int, set per step by :func:`static_hidden`) limits what a step attends over to the first
    ``length`` columns: views of the same buffers, so a recorded step reads only those."""

    mode = "static"

    def __init__(self, num_layers: int, width: int):
        self.width = width
        self.length = width
        self.keys: list[torch.Tensor | None] = [None] * num_layers
        self.values: list[torch.Tensor | None] = [None] * num_layers
        self.slots: torch.Tensor | None = None

    def update(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys[layer] is None:
            b, h, _, d = key.shape
            self.keys[layer] = key.new_zeros((b, h, self.width, d))
            self.values[layer] = value.new_zeros((b, value.shape[1], self.width, value.shape[-1]))
        copy_rows(self.keys[layer], self.slots, key)
        copy_rows(self.values[layer], self.slots, value)
        if self.length == self.width:
            return self.keys[layer], self.values[layer]
        return self.keys[layer][:, :, :self.length], self.values[layer][:, :, :self.length]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)


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


def static_hidden(
    model,
    ids: torch.Tensor,
    positions: torch.Tensor,
    *,
    key_mask: torch.Tensor | None,
    cache: StaticKVCache | None = None,
    slots: torch.Tensor | None = None,
    key_positions: torch.Tensor | None = None,
    block_size: int | None = None,
    backend: str = "sdpa",
    kv_length: int | None = None,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """Final hidden states ``[B, W, D]`` of the query ``ids [B, W]`` at RoPE ``positions [B, W]``.

    Without a cache the query attends to itself (``key_mask [B, W]``); with one it is written at ``slots [W]``
    and attends to every cache column (``key_mask``/``key_positions`` ``[B, width]``). ``block_size`` applies the
    family's block-causal rule (block-causal families only). ``kv_length`` attends over the first cache columns
    only (a host int; every written slot and every key the step may see must lie before it). ``keep`` (query rows
    ``[Q]``, a device tensor) returns ``[B, Q, D]``, the rows whose logits the step reads: the last block stores
    every row's keys and values but runs its attention output, MLP and residual for those rows only (the other
    rows' last-layer outputs feed nothing).
    """
    batch, width = ids.shape
    x = model.embed(ids)
    keys_at = positions if cache is None else key_positions
    kv_len = width if cache is None else cache.width
    if cache is not None and kv_length is not None and kv_length < kv_len:
        kv_len = kv_length
        keys_at = keys_at[:, :kv_len]
        key_mask = None if key_mask is None else key_mask[:, :kv_len]

    def layout_of(query_positions):
        rules = model.layout_rules(query_positions, keys_at, block_size) if block_size is not None else {}
        return AttentionLayout(batch, query_positions.shape[1], kv_len, ids.device, key_mask=key_mask, **rules)

    layout = layout_of(positions)
    rope = rope_angles(positions, model.rope_dim, model.rope_theta)
    if cache is not None:
        cache.slots, cache.length = slots, kv_len
    *blocks, last = model.blocks
    for block in blocks:
        x = block(x, rope, layout, cache, backend)
    if keep is None:
        x = last(x, rope, layout, cache, backend)
    else:
        x = last(x, rope, layout_of(positions.index_select(1, keep)), cache, backend, keep=keep)
    return model.final_norm(x)
