#!/usr/bin/env python
"""Masked grouped-query attention at decoding-step shapes (GPU): which SDPA layout/kernel is fastest.

SDAR-8B shape (32 query / 8 KV heads, head 128), a block-cache step: ``--query`` query tokens per row against a
static KV cache of ``--keys`` slots, of which the first ``--valid`` are attendable (the rest are future blocks)::

    python benchmarks/attention_shapes.py --batch 1 64
    python benchmarks/attention_shapes.py --batch 64 --keys 2560 --valid 2400   # a long reasoning rollout
    python benchmarks/attention_shapes.py --batch 16 --heads 32 --kv-heads 32 --query 32 --keys 384 --valid 384 \
        --layers 32   # LLaDA-8B dual-cache window step

Several cache widths in one run: ``--keys 192 256 320 384 --valid 136 200 264 328`` (pairs); ``--kernel-only`` leaves
out the SDPA variants except the two references (SDPA's flash kernel over the valid keys, the split-KV kernel at its
default settings)::

    python benchmarks/attention_shapes.py --batch 64 --keys 192 256 320 384 --valid 136 200 264 328 --sweep --kernel-only

Prints microseconds per call, timed inside a CUDA graph as a recorded step runs them (no launch overhead), for
each variant and for the split-KV kernel's launch settings (``--sweep``), and the KV-read floor (valid keys
only / all slots).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import graph_us, require_cuda  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from dare.models.decode_attention import MAX_ROWS, decode_attention  # noqa: E402


def variants(q, k, v, mask, valid):
    b, h, n, d = q.shape
    groups = h // k.shape[1]
    folded = q.reshape(b, h // groups, groups * n, d)
    fmask = mask.repeat(1, 1, groups, 1)
    bias = torch.zeros(fmask.shape, dtype=q.dtype, device=q.device).masked_fill(~fmask, float("-inf"))
    kr, vr = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)

    def only(backend, fn):
        def run():
            with sdpa_kernel([backend]):
                return fn()
        return run

    def manual():
        s = torch.matmul(folded, k.transpose(-1, -2)).float() * d ** -0.5
        p = s.masked_fill(~fmask, float("-inf")).softmax(-1).to(q.dtype)
        return torch.matmul(p, v)

    return {
        "fold, default kernel": lambda: F.scaled_dot_product_attention(folded, k, v, attn_mask=fmask),
        "fold, cudnn": only(SDPBackend.CUDNN_ATTENTION, lambda: F.scaled_dot_product_attention(folded, k, v, attn_mask=fmask)),
        "fold, efficient": only(SDPBackend.EFFICIENT_ATTENTION, lambda: F.scaled_dot_product_attention(folded, k, v, attn_mask=fmask)),
        "fold, efficient, bf16 bias": only(SDPBackend.EFFICIENT_ATTENTION, lambda: F.scaled_dot_product_attention(folded, k, v, attn_mask=bias)),
        "fold, manual matmuls": manual,
        "repeat kv, efficient": only(SDPBackend.EFFICIENT_ATTENTION, lambda: F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask)),
        "enable_gqa + mask (math)": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
        "valid keys only, no mask (flash)": lambda: F.scaled_dot_product_attention(folded, k[:, :, :valid], v[:, :, :valid]),
        "split-KV kernel (decode_attention)": lambda: decode_attention(q, k, v, kernel_mask(mask, valid), d ** -0.5),
    }


REFERENCES = ("valid keys only, no mask (flash)", "split-KV kernel (decode_attention)")
"""The variants ``--kernel-only`` keeps."""


def backend_variants(q, k, v, valid):
    """SDPA over the valid keys (no mask) on each fused backend in turn. On Hopper PyTorch's default order tries
    cuDNN first, whose calls each add a memset node to a recorded graph."""
    groups = q.shape[1] // k.shape[1]
    ks, vs = k[:, :, :valid], v[:, :, :valid]

    def only(backend):
        def run():
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, ks, vs, enable_gqa=groups > 1)
        return run

    return {f"valid keys only, no mask ({name})": only(backend) for name, backend in
            (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash only", SDPBackend.FLASH_ATTENTION),
             ("efficient", SDPBackend.EFFICIENT_ATTENTION))}


def kernel_mask(mask, valid):
    """The mask the engine passes: none where every key is attendable (a full-attention cache step)."""
    return None if valid == mask.shape[-1] else mask


def kernel_settings(q, k, v, mask, valid):
    """The split-KV kernel under each launch setting (keys per tile, warps, pipeline stages), then under more key
    slices than its default (``processors`` x 2 / x 4: at SDAR B=64 the default gives 512 programs one slice each,
    every program walking all its tiles in turn)."""
    d, mask = q.shape[-1], kernel_mask(mask, valid)
    settings = {f"split-KV block_n={n} warps={w} stages={st}":
                (lambda n=n, w=w, st=st: decode_attention(q, k, v, mask, d ** -0.5, block_n=n, num_warps=w,
                                                          num_stages=st))
                for n in (32, 64, 128) for w in (4, 8) for st in (1, 2, 3)}
    sms = torch.cuda.get_device_properties(q.device).multi_processor_count
    for scale in (2, 4):
        for n in (64, 128):
            settings[f"split-KV block_n={n} slices x{scale}"] = (
                lambda n=n, scale=scale: decode_attention(q, k, v, mask, d ** -0.5, processors=scale * sms, block_n=n))
    return settings


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    p.add_argument("--query", type=int, default=4)
    p.add_argument("--keys", type=int, nargs="+", default=[388], help="KV cache slots (one or more widths)")
    p.add_argument("--valid", type=int, nargs="+", default=[260], help="attendable keys, one per --keys width")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--layers", type=int, default=36, help="layers per forward in the per-forward column (SDAR-8B: 36)")
    p.add_argument("--sweep", action="store_true", help="also time the split-KV kernel's launch settings")
    p.add_argument("--backends", action="store_true",
                   help="also time SDPA over the valid keys on each fused backend alone (cudnn, flash, efficient)")
    p.add_argument("--kernel-only", action="store_true",
                   help="of the SDPA variants, time only flash over the valid keys (a reference)")
    args = p.parse_args(argv)
    if len(args.keys) != len(args.valid) or any(not 0 < v <= k for k, v in zip(args.keys, args.valid)):
        p.error(f"--valid takes one count per --keys width, each in 1..width; got keys {args.keys}, valid {args.valid}")
    require_cuda("attention_shapes.py")
    dev, dt = torch.device("cuda"), torch.bfloat16
    bw = 4.3e12
    for b, (keys, valid) in ((b, kv) for b in args.batch for kv in zip(args.keys, args.valid)):
        q = torch.randn(b, args.heads, args.query, args.head_dim, device=dev, dtype=dt)
        k = torch.randn(b, args.kv_heads, keys, args.head_dim, device=dev, dtype=dt)
        v = torch.randn_like(k)
        mask = torch.zeros(b, 1, args.query, keys, dtype=torch.bool, device=dev)
        mask[..., :valid] = True
        kv_bytes = 2 * k.numel() * k.element_size()
        print(f"\nB={b}: query {args.query} x {args.heads} heads, {valid}/{keys} keys x {args.kv_heads} KV heads; "
              f"KV floor {kv_bytes * valid / keys / bw * 1e6:.1f} us (valid) / {kv_bytes / bw * 1e6:.1f} us (all)")
        ref = None
        cases = variants(q, k, v, mask, valid)
        if args.kernel_only:
            cases = {name: fn for name, fn in cases.items() if name in REFERENCES}
        if args.backends:
            cases.update(backend_variants(q, k, v, valid))
        if args.heads // args.kv_heads * args.query > MAX_ROWS:  # beyond the split-KV kernel's rows per program
            cases.pop("split-KV kernel (decode_attention)", None)
        if args.sweep:
            cases.update(kernel_settings(q, k, v, mask, valid))
        for name, fn in cases.items():
            try:
                out = fn()
                us = graph_us(fn, reps=50)
            except RuntimeError as e:
                print(f"  {name:44s} failed: {str(e).splitlines()[0][:80]}")
                continue
            out = out.reshape(b, args.heads, args.query, args.head_dim)
            ref = out if ref is None else ref
            err = (out.float() - ref.float()).abs().max().item()
            print(f"  {name:44s} {us:8.1f} us   x{args.layers} layers {us * args.layers / 1000:6.3f} ms   "
                  f"max|diff| {err:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
