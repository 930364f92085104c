"""Split-KV attention for decoding steps: a few query rows per KV head against a long, masked KV cache (Triton).

A block-cache decoding step (SDAR, LLaDA2) runs 4-8 query tokens per row against every cached key under a mask;
with grouped-query attention the query heads of one KV head together are ``groups x queries`` rows (16-64).
Flash kernels tile queries by 64-128 rows and give each (row, KV head) one program that walks all keys, so at
these shapes they read the cache far below the memory bandwidth. Here each program takes the query heads of one
KV head and one slice of the keys (flash-decoding): ``B x Hkv x splits`` programs each read their slice of K and
V once, keep an online softmax in float32, and a second kernel merges the slices (skipped with one slice).

Routing (:func:`applies`, environment variable ``DARE_DECODE_ATTENTION``): ``auto`` (the default) sends masked
calls with at most :data:`MAX_ROWS` rows per KV head on CUDA here - where SDPA's masked grouped-query paths are
slow - and leaves unmasked ones to SDPA's flash kernel, which is as fast; ``triton`` sends unmasked calls too;
``sdpa`` never uses the kernel. Measured on an H200 (``benchmarks/attention_shapes.py``, inside CUDA graphs): one
SDAR-8B B=64 block step, 260 of 388 keys valid, 43 us against 65 us for cuDNN over the folded heads; a LLaDA-8B
B=16 dual-cache window (unmasked) 35 us against flash's 33 us. An SDAR-8B B=64 rollout forward took 12.2 ms
against 13.4 ms with SDPA (``benchmarks/RESULTS.md``). The mask is the layout's boolean ``[B, 1, Q, K]``
(broadcastable) mask, the same for all heads; rows that would see no key are opened by the layout, so every row
has at least one key.
"""

from __future__ import annotations

import functools
import logging
import math
import os

import torch

from dare.errors import ConfigError, first_line

log = logging.getLogger("dare.models")

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

MAX_ROWS = 64
"""Most query rows per KV head (``groups x queries``) one program holds."""
BLOCK_N = 64
"""Keys per tile (with 4 warps and 2 pipeline stages). On an H200, SDAR-8B shapes (``attention_shapes.py --sweep
--kernel-only``, tenth session): at B=64 and cache widths 192 / 256 / 320 / 384, 16.1 / 21.2 / 25.5 / 29.2 us per
call against 21.6 / 24.7 / 31.6 / 32.5 us with 128-key tiles (the earlier default); at B=1 5.4-6.2 us against
6.0-6.5 us."""
CHOICES = ("auto", "triton", "sdpa")
"""Values of ``DARE_DECODE_ATTENTION``."""
_FAILED = False
"""Set when the kernels failed under ``auto`` routing: SDPA serves every later call."""


def applies(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None) -> bool:
    """Whether :func:`decode_attention` serves this call: routed by ``DARE_DECODE_ATTENTION``
    (:func:`routes`), a CUDA GPU it suits (:func:`_generation`), fp16/bf16, head size 64/128, few rows per KV
    head, and no gradient wanted (the kernels have no backward)."""
    choice = setting()
    if not routes(choice, masked=mask is not None) or (choice == "auto" and _FAILED):
        return False
    if triton is None or not q.is_cuda or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)):
        return False
    if _generation(q.device) < (9 if choice == "auto" else 8):
        return False
    groups = q.shape[1] // k.shape[1]
    mask_ok = mask is None or (mask.dtype == torch.bool and mask.shape[1] == 1)
    return (q.dtype in (torch.bfloat16, torch.float16) and q.shape[-1] in (64, 128) and mask_ok
            and groups * q.shape[2] <= MAX_ROWS)


def _generation(device: torch.device) -> int:
    """The GPU's compute capability major: ``auto`` routes on 9+ (Hopper and newer, where the kernels were
    measured); ``triton`` needs 8+ (bf16 tensor-core matmuls)."""
    return _capability_major(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _capability_major(index: int) -> int:
    return torch.cuda.get_device_capability(index)[0]


def setting() -> str:
    """``DARE_DECODE_ATTENTION`` (``auto`` when unset); a misspelt value is a one-line error."""
    choice = os.environ.get("DARE_DECODE_ATTENTION") or "auto"
    if choice not in CHOICES:
        raise ConfigError(f"DARE_DECODE_ATTENTION must be one of {', '.join(CHOICES)} (auto is the default), "
                          f"got {choice!r}")
    return choice


def routes(choice: str, masked: bool) -> bool:
    """Whether the setting ``choice`` sends a masked / unmasked call to the kernel."""
    return choice == "triton" or (choice == "auto" and masked)


def attend_or_none(q, k, v, mask, scale: float) -> torch.Tensor | None:
    """:func:`decode_attention`, or None when the kernels cannot run here under the default ``auto`` routing
    (e.g. Triton cannot compile them for this driver): a one-line warning, and SDPA serves this and every later
    call. With ``DARE_DECODE_ATTENTION=triton`` the error is raised. Out-of-memory errors are always raised."""
    global _FAILED
    try:
        return decode_attention(q, k, v, mask, scale)
    except torch.OutOfMemoryError:
        raise
    except Exception as error:  # noqa: BLE001 - any kernel build/launch failure: SDPA computes the same attention
        if setting() != "auto":
            raise
        _FAILED = True
        log.warning("split-KV decoding attention unavailable, using SDPA (DARE_DECODE_ATTENTION=sdpa silences "
                    "this): %s", first_line(error)[:200])
        return None


def num_splits(programs: int, keys: int, processors: int, block_n: int = BLOCK_N) -> int:
    """Key slices per (row, KV head): enough programs for two waves over ``processors``, whole tiles each."""
    tiles = -(-keys // block_n)
    return max(1, min(tiles, -(-2 * processors // programs)))


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                     processors: int | None = None, block_n: int | None = None, num_warps: int = 4,
                     num_stages: int = 2) -> torch.Tensor:
    """``softmax(q k^T x scale, masked) v`` for ``q [B, H, Q, D]``, ``k, v [B, Hkv, K, D]`` (query head ``j``
    reads KV head ``j // (H / Hkv)``) and a boolean ``mask`` broadcastable to ``[B, 1, Q, K]`` (None: every key);
    returns ``[B, H, Q, D]``, a transposed view of a ``[B, Q, H, D]`` tensor (the layout read next).

    ``processors`` (default: the GPU's multiprocessor count) sets how many key slices are used; ``block_n``
    (keys per tile; default :data:`BLOCK_N`), ``num_warps`` and ``num_stages`` are the
    kernel's launch settings (benchmarks sweep them)."""
    b, h, n, d = q.shape
    hkv, keys = k.shape[1], k.shape[2]
    groups = h // hkv
    rows = groups * n
    block_m = max(16, triton.next_power_of_2(rows))
    if processors is None:
        processors = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 8
    if block_n is None:
        block_n = BLOCK_N
    tiles = -(-keys // block_n)
    per_split = -(-tiles // num_splits(b * hkv, keys, processors, block_n)) * block_n  # whole tiles per slice
    splits = -(-keys // per_split)
    masked = mask is not None
    allowed = mask.expand(b, 1, n, keys)[:, 0] if masked else q.new_ones((1, 1, 1), dtype=torch.bool)
    allowed = allowed.view(torch.uint8)
    out = torch.empty((b, n, h, d), dtype=q.dtype, device=q.device).transpose(1, 2)
    final = splits == 1
    acc = out if final else torch.empty((b * hkv, splits, block_m, d), dtype=torch.float32, device=q.device)
    stats = torch.empty((2, b * hkv, splits, block_m), dtype=torch.float32, device=q.device)
    _partial_kernel[(b * hkv, splits)](
        q, k, v, allowed, acc, stats, out,
        *q.stride(), *k.stride(), *v.stride(), *allowed.stride(), *out.stride(),
        hkv, groups, n, keys, scale * math.log2(math.e),
        PER_SPLIT=per_split, SPLITS=splits, BLOCK_M=block_m, BLOCK_N=block_n, HEAD=d, FINAL=final, MASKED=masked,
        num_warps=num_warps, num_stages=num_stages,
    )
    if not final:
        _merge_kernel[(b * hkv,)](acc, stats, out, *out.stride(), hkv, groups, n, SPLITS=splits,
                                  BLOCK_M=block_m, HEAD=d)
    return out


if triton is not None:

    @triton.jit
    def _partial_kernel(Q, K, V, Mask, Acc, Stats, Out,
                        sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd, smb, smn, smk,
                        sob, soh, son, sod,
                        HKV, GROUPS, QLEN, KLEN, SCALE_LOG2, PER_SPLIT: tl.constexpr, SPLITS: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HEAD: tl.constexpr, FINAL: tl.constexpr,
                        MASKED: tl.constexpr):
        bh = tl.program_id(0)
        split = tl.program_id(1)
        b = bh // HKV
        kvh = bh % HKV
        r = tl.arange(0, BLOCK_M)
        real = r < GROUPS * QLEN
        g = r // QLEN
        qi = r % QLEN
        head = kvh * GROUPS + g
        dims = tl.arange(0, HEAD)
        q = tl.load(Q + b * sqb + head[:, None] * sqh + qi[:, None] * sqn + dims[None, :] * sqd,
                    mask=real[:, None], other=0.0)
        m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        l_i = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, HEAD), tl.float32)
        begin = split * PER_SPLIT
        for offset in range(0, PER_SPLIT, BLOCK_N):  # tiles past KLEN (in the last slice) load nothing
            cols = begin + offset + tl.arange(0, BLOCK_N)
            inside = cols < KLEN
            kt = tl.load(K + b * skb + kvh * skh + cols[:, None] * skn + dims[None, :] * skd,
                         mask=inside[:, None], other=0.0)
            scores = tl.dot(q, tl.trans(kt)) * SCALE_LOG2
            if MASKED:
                seen = tl.load(Mask + b * smb + qi[:, None] * smn + cols[None, :] * smk,
                               mask=real[:, None] & inside[None, :], other=0)
                scores = tl.where((seen != 0) | (~real[:, None] & inside[None, :]), scores, float("-inf"))
            else:
                scores = tl.where(inside[None, :], scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            base = tl.where(m_new == float("-inf"), 0.0, m_new)
            p = tl.exp2(scores - base[:, None])
            alpha = tl.exp2(m_i - base)
            l_i = l_i * alpha + tl.sum(p, 1)
            vt = tl.load(V + b * svb + kvh * svh + cols[:, None] * svn + dims[None, :] * svd,
                         mask=inside[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(vt.dtype), vt)
            m_i = m_new
        if FINAL:
            out = acc / l_i[:, None]
            tl.store(Out + b * sob + head[:, None] * soh + qi[:, None] * son + dims[None, :] * sod,
                     out.to(Out.dtype.element_ty), mask=real[:, None])
        else:
            slot = bh * SPLITS + split
            tl.store(Acc + (slot * BLOCK_M + r[:, None]) * HEAD + dims[None, :], acc)
            tl.store(Stats + slot * BLOCK_M + r, m_i)
            tl.store(Stats + (tl.num_programs(0) * SPLITS + slot) * BLOCK_M + r, l_i)

    @triton.jit
    def _merge_kernel(Acc, Stats, Out, sob, soh, son, sod, HKV, GROUPS, QLEN, SPLITS: tl.constexpr,
                      BLOCK_M: tl.constexpr, HEAD: tl.constexpr):
        bh = tl.program_id(0)
        b = bh // HKV
        kvh = bh % HKV
        r = tl.arange(0, BLOCK_M)
        real = r < GROUPS * QLEN
        dims = tl.arange(0, HEAD)
        m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
        for s in range(0, SPLITS):
            m = tl.maximum(m, tl.load(Stats + (bh * SPLITS + s) * BLOCK_M + r))
        m = tl.where(m == float("-inf"), 0.0, m)
        total = tl.zeros((BLOCK_M,), tl.float32)
        acc = tl.zeros((BLOCK_M, HEAD), tl.float32)
        for s in range(0, SPLITS):
            slot = bh * SPLITS + s
            w = tl.exp2(tl.load(Stats + slot * BLOCK_M + r) - m)
            total += w * tl.load(Stats + (tl.num_programs(0) * SPLITS + slot) * BLOCK_M + r)
            acc += w[:, None] * tl.load(Acc + (slot * BLOCK_M + r[:, None]) * HEAD + dims[None, :])
        g = r // QLEN
        qi = r % QLEN
        head = kvh * GROUPS + g
        tl.store(Out + b * sob + head[:, None] * soh + qi[:, None] * son + dims[None, :] * sod,
                 (acc / total[:, None]).to(Out.dtype.element_ty), mask=real[:, None])
