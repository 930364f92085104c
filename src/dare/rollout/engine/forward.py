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

from dare.config import env_switch
from dare.models.attention import AttentionLayout
from dare.models.cache import StaticLayerKV
from dare.models.layers import rope_angles


class StaticKVCache:
    """Keys/values ``[B, Hkv, width, d]`` per layer (:class:`StaticLayerKV`), allocated on the first write
    (zeros) and reused.

    ``length`` (a host int, set per step by :func:`static_hidden`) limits what a step attends over to the first
    ``length`` columns: views of the same buffers, so a recorded step reads only those."""

    mode = "static"

    def __init__(self, num_layers: int, width: int):
        self.width = width
        self.length = width
        self.layers: list[StaticLayerKV | None] = [None] * num_layers
        self.slots: torch.Tensor | None = None

    @property
    def keys(self) -> list[torch.Tensor | None]:
        return [None if layer is None else layer.keys for layer in self.layers]

    @property
    def values(self) -> list[torch.Tensor | None]:
        return [None if layer is None else layer.values for layer in self.layers]

    def update(self, layer: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.layers[layer] is None:
            b, h, _, d = key.shape
            self.layers[layer] = StaticLayerKV(key.new_zeros((b, h, self.width, d)),
                                               value.new_zeros((b, value.shape[1], self.width, value.shape[-1])))
        return self.for_layer(layer).store(key, value)

    def for_layer(self, index: int) -> StaticLayerKV:
        """Layer ``index``'s buffers (allocated) with this step's slots and length set."""
        layer = self.layers[index]
        layer.slots, layer.length = self.slots, self.length
        return layer

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values if t is not None)


def cache_writes_in_blocks() -> bool:
    """``DARE_FUSE_CACHE_WRITES=1`` (the default): static steps hand each block its own :class:`StaticLayerKV`, so
    the block writes its keys/values itself (inside compiled blocks: fused into the generated kernels) instead of
    the cache doing it outside them; ``0`` leaves the writes to the cache. The tokens are the same either way; on an
    H200 the writes in blocks saved 0.8-3 % per forward (benchmarks/RESULTS.md, "Seventh H200 session")."""
    return env_switch("DARE_FUSE_CACHE_WRITES", default=True)


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
    layer_writes: bool | None = None,
) -> torch.Tensor:
    """Final hidden states ``[B, W, D]`` of the query ``ids [B, W]`` at RoPE ``positions [B, W]``.

    Without a cache the query attends to itself (``key_mask [B, W]``); with one it is written at ``slots [W]``
    and attends to every cache column (``key_mask``/``key_positions`` ``[B, width]``). ``block_size`` applies the
    family's block-causal rule (block-causal families only). ``kv_length`` attends over the first cache columns
    only (a host int; every written slot and every key the step may see must lie before it). ``keep`` (query rows
    ``[Q]``, a device tensor) returns ``[B, Q, D]``, the rows whose logits the step reads: the last block stores
    every row's keys and values but runs its attention output, MLP and residual for those rows only (the other
    rows' last-layer outputs feed nothing). ``layer_writes`` hands each block its own cache layer
    (:class:`StaticLayerKV`; default: :func:`cache_writes_in_blocks`).
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
    in_blocks = cache is not None and (cache_writes_in_blocks() if layer_writes is None else layer_writes)
    if in_blocks and any(layer is None for layer in cache.layers):
        _allocate_by_probe(model, ids, positions, key_mask, cache, slots, key_positions, block_size, backend, kv_len)
    if cache is not None:
        cache.slots, cache.length = slots, kv_len
    *blocks, last = model.blocks
    for index, block in enumerate(blocks):
        x = block(x, rope, layout, cache.for_layer(index) if in_blocks else cache, backend)
    last_cache = cache.for_layer(len(blocks)) if in_blocks else cache
    if keep is None:
        x = last(x, rope, layout, last_cache, backend)
    else:
        x = last(x, rope, layout_of(positions.index_select(1, keep)), last_cache, backend, keep=keep)
    return model.final_norm(x)


def _allocate_by_probe(model, ids, positions, key_mask, cache, slots, key_positions, block_size, backend, kv_length):
    """Allocate ``cache``'s layers before a step hands blocks their own layers: one eager forward of the step's
    first query column writes every layer through the cache (shapes and dtypes as the blocks produce them), then
    the buffers are zeroed. A step's first run and its recording then take the same path; had the first run
    allocated, a compiled block would compile again while being recorded, which a CUDA graph cannot hold."""
    with torch.compiler.set_stance("force_eager"):
        static_hidden(model, ids[:, :1], positions[:, :1], key_mask=key_mask, cache=cache, slots=slots[:1],
                      key_positions=key_positions, block_size=block_size, backend=backend, kv_length=kv_length,
                      layer_writes=False)
    for layer in cache.layers:
        layer.keys.zero_()
        layer.values.zero_()
