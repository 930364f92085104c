"""How a denoising step obtains the logits of the current block: full forward or Fast-dLLM KV caches.

A strategy returns, for the block ``[start, end)`` of the canvas, logits aligned so that row ``j`` predicts
position ``start + j``. Shifted families (Dream, ``logit_shift = 1``: the output at ``i - 1`` predicts token
``i``) are handled generically by querying the window from ``start - shift``: the prediction of every block
position, including the first, is computed in every step (Fast-dLLM's Dream sampler instead commits the
first block position at the block start because its predictor sits in the cache).

``none``
    every step runs the whole canvas (exact).
``prefix``
    Fast-dLLM prefix cache: at the start of each block one full forward fills the cache and serves the
    block's first step; the keys/values of ``[0, start - shift)`` (prompt and finished blocks) are kept and
    later steps run only ``[start - shift, L)`` against them.
``dual``
    Fast-dLLM dual cache: the block-start forward keeps the whole cache; later steps run only
    ``[start - shift, end)`` and overwrite those slots in place, prefix and masked suffix stay frozen.

``refresh_every = N`` additionally recomputes the full canvas every N forwards inside a block. Cached
decoding is approximate in general (cached keys/values were computed in an older context); it is exact
when every forward is a refresh (``refresh_every = 1``, or one step per block), and for a one-layer model
(first-layer keys/values depend only on the token and its position).
"""

from __future__ import annotations

import torch

from dare.models.cache import KVCache


def window_logits(model, ids: torch.Tensor, take: int, length: int, *, full_logits: bool, **kwargs) -> torch.Tensor:
    """Logits of the ``length`` query rows starting at ``take`` of ``model(ids, **kwargs)``.

    By default the LM head runs only on those rows (``return_hidden``); ``full_logits`` computes every row's
    logits inside the forward and slices them (for wrappers that only materialise weights in ``forward``).
    """
    if full_logits:
        return model(ids, **kwargs).logits[:, take:take + length]
    hidden = model(ids, return_hidden=True, **kwargs).last_hidden_state[:, take:take + length]
    return model.head(hidden)


class NoCache:
    """Full forward of the canvas at every step."""

    def __init__(self, model, shift: int, refresh_every: int = 0, full_logits: bool = False, attn_backend=None):
        self.model, self.shift, self.refresh_every = model, shift, refresh_every
        self.kwargs = {"full_logits": full_logits, "attn_backend": attn_backend}

    def logits(self, ids, attention_mask, positions, start: int, end: int, forward_index: int) -> torch.Tensor:
        return window_logits(self.model, ids, start - self.shift, end - start, attention_mask=attention_mask,
                             position_ids=positions, **self.kwargs)

    def reorder(self, keep: torch.Tensor) -> None:
        pass

    def _refresh_due(self, forward_index: int) -> bool:
        return forward_index == 0 or (self.refresh_every > 0 and forward_index % self.refresh_every == 0)


class PrefixCache(NoCache):
    """Fast-dLLM prefix cache (see the module docstring)."""

    cache: KVCache | None = None

    def logits(self, ids, attention_mask, positions, start, end, forward_index):
        first = start - self.shift
        if self._refresh_due(forward_index):
            self.cache = KVCache(mode="append")
            out = window_logits(self.model, ids, first, end - start, attention_mask=attention_mask,
                                position_ids=positions, cache=self.cache, **self.kwargs)
            self._keep(first)
            return out
        return window_logits(self.model, self._query(ids, first, end), 0, end - start,
                             attention_mask=attention_mask, position_ids=self._query(positions, first, end),
                             cache=self.cache, **self.kwargs)

    def _keep(self, first: int) -> None:
        self.cache.truncate(first).set_mode("read")

    def _query(self, tensor: torch.Tensor, first: int, end: int) -> torch.Tensor:
        return tensor[:, first:]

    def reorder(self, keep):
        if self.cache is not None:
            self.cache.reorder(keep)


class DualCache(PrefixCache):
    """Fast-dLLM dual cache (see the module docstring)."""

    def _keep(self, first: int) -> None:
        self.cache.set_mode("replace", replace_start=first)

    def _query(self, tensor, first, end):
        return tensor[:, first:end]


CACHES = {"none": NoCache, "prefix": PrefixCache, "dual": DualCache}
"""Cache strategies by name (``SamplerConfig.cache``)."""
