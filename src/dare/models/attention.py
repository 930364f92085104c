"""Attention layouts and interchangeable attention backends.

A forward call builds one :class:`AttentionLayout` (who may attend to whom) and every layer hands
it, with its queries/keys/values, to :func:`attend`. The layout caches the dense boolean mask (for
``eager``/``sdpa``) and the FlexAttention ``BlockMask`` (for ``flex``), so they are built once per
forward, not once per layer.

Backends (selectable per call, ``attn_backend=...``):

``sdpa`` (default)
    ``torch.nn.functional.scaled_dot_product_attention`` with a boolean mask, or no mask at all when
    every token sees every token (so the flash kernel can run).
``eager``
    Plain ``softmax(q k^T / sqrt(d)) v`` with the softmax in fp32: the reference the others are tested
    against.
``flex``
    FlexAttention with a block-sparse ``BlockMask``: packed documents and block-causal masks without an
    ``L x L`` dense mask. Compiled on CUDA; on CPU PyTorch only offers an unfused forward (no backward).
``varlen``
    ``torch.nn.attention.varlen.varlen_attn`` (flash attention over ``cu_seqlens``) for packed training
    rows on CUDA.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from dare.errors import ConfigError, InputError, unknown_choice

ATTENTION_BACKENDS = ("sdpa", "eager", "flex", "varlen")

MaskMod = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def check_backend(name: str) -> str:
    """Validate an attention backend name (one-line error naming the valid ones)."""
    if name not in ATTENTION_BACKENDS:
        raise unknown_choice("attention backend", name, ATTENTION_BACKENDS)
    return name


@dataclass
class AttentionLayout:
    """Which keys each query may attend to, for one forward call.

    Query ``q`` of row ``b`` may attend key ``k`` iff every rule that is set holds:

    * ``key_mask[b, k]`` - the key is a real token (padding mask, ``True`` = attend);
    * ``q_doc[b, q] == k_doc[b, k]`` - same packed document;
    * ``k_block[b, k] <= q_block[b, q]`` - block-causal (bidirectional inside a block);
    * ``extra(b, h, q, k)`` - any further rule written as a FlexAttention ``mask_mod``.

    All index tensors are ``[B, Q]`` or ``[B, K]`` long tensors; rules left as ``None`` impose nothing.
    ``cu_seqlens`` (with ``max_seqlen``) describes the packed documents of a batch-1 row for the
    ``varlen`` backend.

    ``sequence`` (sequence parallelism) is the exchange of a sharded forward: queries, keys and values arrive as
    this rank's slice of the positions with all heads; :func:`attend` moves them to a slice of the heads over all
    positions (``sequence.to_heads``), attends with this layout (which describes the whole row) and moves the
    output back (``sequence.to_sequence``); see :class:`dare.distributed.sequence.SequenceParallel`.
    """

    batch_size: int
    q_len: int
    kv_len: int
    device: torch.device
    key_mask: torch.Tensor | None = None
    q_doc: torch.Tensor | None = None
    k_doc: torch.Tensor | None = None
    q_block: torch.Tensor | None = None
    k_block: torch.Tensor | None = None
    extra: MaskMod | None = None
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int | None = None
    sequence: object | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def is_full(self) -> bool:
        """True when every query sees every key (no mask needed)."""
        return (
            self.key_mask is None
            and self.q_doc is None
            and self.q_block is None
            and self.extra is None
        )

    def mask_mod(self) -> MaskMod:
        """The layout as a FlexAttention ``mask_mod(b, h, q_idx, kv_idx) -> bool``.

        Written with indexing and elementwise ops only, so it works both under ``vmap`` (FlexAttention)
        and with broadcast index tensors (dense materialisation).
        """
        key_mask, q_doc, k_doc = self.key_mask, self.q_doc, self.k_doc
        q_block, k_block, extra = self.q_block, self.k_block, self.extra

        def mod(b, h, q, k):
            allowed = torch.ones((), dtype=torch.bool, device=q.device)
            if key_mask is not None:
                allowed = allowed & key_mask[b, k]
            if q_doc is not None:
                allowed = allowed & (q_doc[b, q] == k_doc[b, k])
            if q_block is not None:
                allowed = allowed & (k_block[b, k] <= q_block[b, q])
            if extra is not None:
                allowed = allowed & extra(b, h, q, k)
            return allowed

        return mod

    def dense_mask(self) -> torch.Tensor | None:
        """Boolean mask broadcastable to ``[B, 1, Q, K]`` (``True`` = attend), or None when full.

        Query rows that would attend to nothing (e.g. a row made only of padding) are opened to all keys
        so that softmax stays finite; their outputs are meaningless and callers mask them out.
        """
        if self.is_full:
            return None
        if "dense" not in self._cache:
            only_padding = self.q_doc is None and self.q_block is None and self.extra is None
            if only_padding:
                key_mask = self.key_mask | ~self.key_mask.any(-1, keepdim=True)
                mask = key_mask[:, None, None, :]
            else:
                dev = self.device
                b = torch.arange(self.batch_size, device=dev)[:, None, None, None]
                h = torch.zeros((), dtype=torch.long, device=dev)
                q = torch.arange(self.q_len, device=dev)[None, None, :, None]
                k = torch.arange(self.kv_len, device=dev)[None, None, None, :]
                mask = self.mask_mod()(b, h, q, k)
                mask = mask.expand(self.batch_size, 1, self.q_len, self.kv_len)
                mask = mask | ~mask.any(-1, keepdim=True)
            self._cache["dense"] = mask
        return self._cache["dense"]

    def block_mask(self):
        """FlexAttention ``BlockMask`` for this layout (None when full).

        On CUDA the mask is built by a compiled ``create_block_mask``, which never materialises the dense
        ``[B, Q, K]`` mask; eager (CPU) construction evaluates it densely, which is fine at test sizes.
        """
        if self.is_full:
            return None
        if "block" not in self._cache:
            from torch.nn.attention.flex_attention import create_block_mask

            build = _compiled_create_block_mask() if self.device.type == "cuda" else create_block_mask
            self._cache["block"] = build(
                self.mask_mod(), self.batch_size, None, self.q_len, self.kv_len, device=self.device
            )
        return self._cache["block"]


def documents_from_cu_seqlens(cu_seqlens: torch.Tensor, total: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Document id and within-document position of every token of a packed row.

    ``cu_seqlens`` holds the cumulative lengths ``[0, l_1, l_1 + l_2, ..., total]``.
    """
    cu = cu_seqlens.to(torch.long)
    if cu.ndim != 1 or cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != total:
        raise InputError(
            f"cu_seqlens must be 1-D, start at 0 and end at the packed length {total}; got {cu.tolist()}"
        )
    lengths = cu.diff()
    if bool((lengths <= 0).any()):
        raise InputError(f"cu_seqlens must be strictly increasing; got {cu.tolist()}")
    doc = torch.repeat_interleave(torch.arange(lengths.numel(), device=cu.device), lengths)
    pos = torch.arange(total, device=cu.device) - cu[:-1][doc]
    return doc, pos


def build_layout(
    batch_size: int,
    q_len: int,
    kv_len: int,
    device: torch.device,
    *,
    attention_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
    extra: MaskMod | None = None,
    q_block: torch.Tensor | None = None,
    k_block: torch.Tensor | None = None,
) -> AttentionLayout:
    """Build the layout of a forward call from the usual HF-style inputs.

    ``attention_mask`` is a ``[B, K]`` padding mask over all keys (cached ones included), 1 = real.
    ``cu_seqlens`` marks packed documents of a batch-1 row (queries and keys are the same tokens).
    """
    key_mask = None
    if attention_mask is not None:
        if attention_mask.ndim != 2 or tuple(attention_mask.shape) != (batch_size, kv_len):
            raise InputError(
                f"attention_mask must have shape [batch, keys] = [{batch_size}, {kv_len}]; "
                f"got {list(attention_mask.shape)}"
            )
        key_mask = attention_mask.to(device=device, dtype=torch.bool)
        if bool(key_mask.all()):
            key_mask = None
    layout = AttentionLayout(
        batch_size, q_len, kv_len, device, key_mask=key_mask, extra=extra, q_block=q_block, k_block=k_block
    )
    if cu_seqlens is not None:
        if batch_size != 1 or q_len != kv_len:
            raise InputError("packed inputs (cu_seqlens) must be a single row [1, total_tokens] without a KV cache")
        doc, _ = documents_from_cu_seqlens(cu_seqlens.to(device), q_len)
        layout.q_doc = layout.k_doc = doc[None, :]
        layout.cu_seqlens = cu_seqlens.to(device=device, dtype=torch.int32)
        layout.max_seqlen = int(cu_seqlens.diff().max())
    return layout


@functools.cache
def _compiled_create_block_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    return torch.compile(create_block_mask)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def _flex(q, k, v, layout: AttentionLayout, scale: float) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    gqa = q.shape[1] != k.shape[1]
    if q.device.type == "cuda":
        return _compiled_flex()(q, k, v, block_mask=layout.block_mask(), scale=scale, enable_gqa=gqa)
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise InputError("the flex attention backend has no backward pass on CPU; use attn_backend='sdpa' for CPU training")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch warns that uncompiled flex is unfused: expected on CPU
        return flex_attention(q, k, v, block_mask=layout.block_mask(), scale=scale, enable_gqa=gqa)


@functools.cache
def _varlen_has_gqa() -> bool:
    import inspect

    from torch.nn.attention.varlen import varlen_attn

    return "enable_gqa" in inspect.signature(varlen_attn).parameters


def _varlen(q, k, v, layout: AttentionLayout, scale: float) -> torch.Tensor:
    if q.device.type != "cuda":
        raise InputError("the varlen attention backend needs CUDA; use 'sdpa' (or 'flex' for inference) on CPU")
    if layout.key_mask is not None or layout.q_block is not None or layout.extra is not None:
        raise InputError("the varlen backend only supports packed documents (cu_seqlens), not padding or block masks")
    if q.shape[0] != 1 or q.shape[2] != k.shape[2]:
        raise InputError("the varlen backend needs one packed row [1, total_tokens] without a KV cache")
    from torch.nn.attention.varlen import varlen_attn

    total = q.shape[2]
    cu = layout.cu_seqlens
    if cu is None:
        cu = torch.tensor([0, total], dtype=torch.int32, device=q.device)
    max_len = layout.max_seqlen or total
    gqa = {}
    if q.shape[1] != k.shape[1]:
        if _varlen_has_gqa():
            gqa = {"enable_gqa": True}
        else:  # older PyTorch: expand the KV heads ourselves
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = varlen_attn(
        q[0].transpose(0, 1), k[0].transpose(0, 1), v[0].transpose(0, 1), cu, cu, max_len, max_len,
        scale=scale, **gqa,
    )
    return out.transpose(0, 1)[None]


def _eager(q, k, v, layout: AttentionLayout, scale: float) -> torch.Tensor:
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    mask = layout.dense_mask()
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)


def _sdpa(q, k, v, layout: AttentionLayout, scale: float) -> torch.Tensor:
    mask = layout.dense_mask()
    if q.is_cuda:  # decoding steps: split-KV kernels where they serve (dare.models.decode_attention)
        from dare.models import decode_attention

        if decode_attention.applies(q, k, mask):
            out = decode_attention.attend_or_none(q, k, v, mask, scale)
            if out is not None:
                return out
    groups = q.shape[1] // k.shape[1]
    if groups == 1 or mask is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=groups > 1)
    return _masked_gqa_sdpa(q, k, v, mask, scale, groups)


def folds_query_groups(query_len: int, mask: torch.Tensor, groups: int, heads: int, head_dim: int) -> bool:
    """Whether masked grouped-query attention folds the query heads of a KV head into its query axis (True) or
    repeats the KV heads (False): folding repeats the mask ``groups`` times along the queries (free when the mask
    does not depend on the query), repeating writes ``2 x heads x head_dim`` more elements per key, so folding
    wins for short query blocks (decoding steps against a KV cache) and repeating for long rows (training)."""
    return mask.shape[-2] == 1 or groups * query_len <= 2 * heads * head_dim


def _masked_gqa_sdpa(q, k, v, mask: torch.Tensor, scale: float, groups: int) -> torch.Tensor:
    """Grouped-query attention with a mask on a fused kernel. PyTorch's fused SDPA kernels refuse ``enable_gqa``
    together with a mask and fall back to the math kernel, which expands the KV heads and materialises every
    score in float32; either layout below is the same attention and runs on the memory-efficient kernel."""
    b, h, n, d = q.shape
    if folds_query_groups(n, mask, groups, h, d):  # the layout's mask is one for all heads ([B, 1, Q, K])
        # query head j reads KV head j // groups: the groups of one KV head become groups x n queries of it
        folded = q.reshape(b, h // groups, groups * n, d)
        if mask.shape[-2] != 1:
            mask = mask.repeat(1, 1, groups, 1)
        return F.scaled_dot_product_attention(folded, k, v, attn_mask=mask, scale=scale).reshape(b, h, n, d)
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)


_BACKEND_FNS = {"sdpa": _sdpa, "eager": _eager, "flex": _flex, "varlen": _varlen}


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: AttentionLayout, backend: str = "sdpa"
) -> torch.Tensor:
    """Scaled dot-product attention ``[B, H, Q, d] x [B, Hkv, K, d] -> [B, Q, H * d]``.

    Scale is ``1/sqrt(d)`` for every family; grouped-query attention repeats each KV head ``H/Hkv``
    times consecutively. With ``layout.sequence`` the inputs are this rank's sequence shard (see
    :class:`AttentionLayout`) and so is the output.
    """
    fn = _BACKEND_FNS.get(backend)
    if fn is None:
        raise unknown_choice("attention backend", backend, ATTENTION_BACKENDS)
    if q.shape[1] % k.shape[1] != 0:
        raise ConfigError(f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} key/value heads")
    if layout.sequence is not None:
        q, k, v = layout.sequence.to_heads(q, k, v)
    out = fn(q, k, v, layout, q.shape[-1] ** -0.5)
    if layout.sequence is not None:
        out = layout.sequence.to_sequence(out)
    b, h, L, d = out.shape
    return out.transpose(1, 2).reshape(b, L, h * d)
