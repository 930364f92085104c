#!/usr/bin/env python
"""The small kernels of a decoding step (GPU), timed inside CUDA graphs (no launch overhead): RoPE on the
transposed projections and the KV-cache write, eager vs regionally compiled with dynamic or static shapes::

    python benchmarks/small_kernels.py

Shapes are a step's query rows: LLaDA-8B B=1 prefix window (256 rows), B=16 dual window (32 rows per row),
SDAR-8B B=64 block step (4 rows per row, 8 KV heads). Prints microseconds per call and the bandwidth floor.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from common import graph_us, require_cuda  # noqa: E402
from dare.models.layers import apply_rope, rope_angles  # noqa: E402
from dare.models.cache import copy_rows  # noqa: E402

BW = 4.3e12


def rope_fn(x, cos, sin, full):
    return apply_rope(x.transpose(1, 2), cos, sin, full_precision=full)


def main() -> int:
    require_cuda("small_kernels.py")
    dev, dt = torch.device("cuda"), torch.bfloat16
    cases = [("llada B=1 prefix", 1, 256, 32, 32, 4096), ("llada B=16 dual", 16, 32, 32, 32, 4096),
             ("sdar B=64 block", 64, 4, 32, 8, 388)]
    compiled = {"dynamic": torch.compile(rope_fn, dynamic=True), "static": torch.compile(rope_fn, dynamic=False)}
    for name, b, length, heads, kv_heads, width in cases:
        d = 128
        q = torch.randn(b, length, heads, d, device=dev, dtype=dt)
        positions = torch.arange(length, device=dev).expand(b, length) + 100
        cos, sin = rope_angles(positions, d, 10000.0 if kv_heads == heads else 1e6)
        full = kv_heads == heads  # LLaDA rotates in fp32
        floor = 2 * q.numel() * 2 / BW * 1e6
        row = [f"{name}: rope on q [{b},{length},{heads},{d}] floor {floor:.1f} us"]
        row.append(f"eager {graph_us(lambda: rope_fn(q, cos, sin, full)):.1f}")
        for kind, fn in compiled.items():
            row.append(f"compiled {kind} {graph_us(lambda fn=fn: fn(q, cos, sin, full)):.1f}")
        print(" | ".join(row), flush=True)
        # the KV-cache write: [B, Hkv, W, d] cache, slots along dim 2 (today) vs a [B, W, Hkv, d] cache along dim 1,
        # and a plain copy into a slice (possible where a recorded step's columns are fixed, e.g. per-block graphs)
        k = torch.randn(b, kv_heads, length, d, device=dev, dtype=dt)
        k_rows = k.transpose(1, 2).contiguous()
        slots = torch.arange(length, device=dev) + 8
        cache_hl = torch.zeros(b, kv_heads, width + length + 8, d, device=dev, dtype=dt)
        cache_lh = torch.zeros(b, width + length + 8, kv_heads, d, device=dev, dtype=dt)
        floor = 2 * k.numel() * 2 / BW * 1e6
        print(f"  cache write k [{b},{kv_heads},{length},{d}] floor {floor:.1f} us | "
              f"index_copy_ dim 2 {graph_us(lambda: cache_hl.index_copy_(2, slots, k)):.1f} | "
              f"copy_rows (engine, transposed source) {graph_us(lambda: copy_rows(cache_hl, slots, k_rows.transpose(1, 2))):.1f} | "
              f"index_copy_ dim 1 of [B,W,H,d] {graph_us(lambda: cache_lh.index_copy_(1, slots, k_rows)):.1f} | "
              f"transposed source into dim 1 {graph_us(lambda: cache_lh.index_copy_(1, slots, k.transpose(1, 2))):.1f} | "
              f"setitem dim 2 {graph_us(lambda: cache_hl.__setitem__((slice(None), slice(None), slots), k)):.1f} | "
              f"copy_ into a static slice {graph_us(lambda: cache_hl[:, :, 8:8 + length].copy_(k)):.1f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
