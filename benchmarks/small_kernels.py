#!/usr/bin/env python
"""The small kernels of a decoding step (GPU), timed inside CUDA graphs (no launch overhead): RoPE on the
transposed projections and the KV-cache write, eager vs regionally compiled with dynamic or static shapes::

    python benchmarks/small_kernels.py

Shapes are a step's query rows: LLaDA-8B B=1 prefix window (256 rows), B=16 dual window (32 rows per row),
SDAR-8B B=64 block step (4 rows per row, 8 KV heads). Prints microseconds per call and the bandwidth floor.

A second table times what a compiled LLaDA block fuses into one kernel before its attention call - the q/k/v split
of the projections' output (plus a LoRA delta where marked), RoPE and the cache writes - at window and full-canvas
shapes (a dual-cache block start writes all 384 columns), in three exact formulations side by side: ``cat`` (the
models' ``apply_rope`` on ``[B, H, L, d]`` views, as today), ``roll`` (the rotated half as ``torch.roll`` with a
signed sine, no concatenation) and ``untransposed`` (RoPE on ``[B, L, H, d]``, transposed afterwards), plus its two
halves alone (``q only``, ``writes only``). In the thirty-eighth session's RL-step profile these kernels took 3-4.5x
their estimated bandwidth floor on average over all calls; by the call counts, the loss is in the full-canvas
forwards (this table is meant to confirm or refute that).
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
    fused_step_table(dev, dt)
    return 0


HEADS, HEAD_DIM = 32, 128


def _split(qkv, lora):
    x = qkv if lora is None else qkv + lora
    b, w, _ = x.shape
    return [t.view(b, w, HEADS, HEAD_DIM) for t in x.split(HEADS * HEAD_DIM, dim=-1)]


def step_cat(qkv, lora, cos, sin, kc, vc, slots):
    q, k, v = (t.transpose(1, 2) for t in _split(qkv, lora))
    q, k = apply_rope(q, cos, sin, full_precision=True), apply_rope(k, cos, sin, full_precision=True)
    kc.index_copy_(2, slots, k)
    vc.index_copy_(2, slots, v)
    return q


def _roll_rope(x, cos, signed_sin):
    xf = x.float()
    return (xf * cos + torch.roll(xf, HEAD_DIM // 2, dims=-1) * signed_sin).to(x.dtype)


def step_roll(qkv, lora, cos, sin, kc, vc, slots):
    q, k, v = (t.transpose(1, 2) for t in _split(qkv, lora))
    signed = torch.cat((-sin[..., :HEAD_DIM // 2], sin[..., HEAD_DIM // 2:]), dim=-1)
    q, k = _roll_rope(q, cos, signed), _roll_rope(k, cos, signed)
    kc.index_copy_(2, slots, k)
    vc.index_copy_(2, slots, v)
    return q


def step_untransposed(qkv, lora, cos, sin, kc, vc, slots):
    q, k, v = _split(qkv, lora)
    c, s = cos.transpose(1, 2), sin.transpose(1, 2)
    q = apply_rope(q, c, s, full_precision=True).transpose(1, 2)
    kc.index_copy_(2, slots, apply_rope(k, c, s, full_precision=True).transpose(1, 2))
    vc.index_copy_(2, slots, v.transpose(1, 2))
    return q


def step_q_only(qkv, lora, cos, sin, kc, vc, slots):
    return apply_rope(_split(qkv, lora)[0].transpose(1, 2), cos, sin, full_precision=True)


def step_writes_only(qkv, lora, cos, sin, kc, vc, slots):
    q, k, v = _split(qkv, lora)
    kc.index_copy_(2, slots, k.transpose(1, 2))
    vc.index_copy_(2, slots, v.transpose(1, 2))
    return q


FUSED_STEPS = {"cat": step_cat, "roll": step_roll, "untransposed": step_untransposed, "q only": step_q_only,
               "writes only": step_writes_only}
FUSED_SHAPES = [(32, 384, True), (32, 32, True), (16, 384, False), (16, 32, False), (1, 256, False)]
"""(batch, query columns, LoRA delta) of the fused-step table: the d1 RL step's 32 rows (full canvas, window),
rollout.py's B=16 dual cell (full, window), its B=1 prefix window; a 384-column cache (prompt 128 + 256)."""


def fused_step_table(dev, dt, width: int = 384) -> None:
    compiled = {name: torch.compile(fn, dynamic=False) for name, fn in FUSED_STEPS.items()}
    for b, w, lora in FUSED_SHAPES:
        qkv = torch.randn(b, w, 3 * HEADS * HEAD_DIM, device=dev, dtype=dt)
        delta = torch.randn_like(qkv) if lora else None
        cos, sin = rope_angles(torch.arange(width - w, width, device=dev).expand(b, w), HEAD_DIM, 500000.0)
        kc = torch.zeros(b, HEADS, width, HEAD_DIM, device=dev, dtype=dt)
        vc = torch.zeros_like(kc)
        slots = torch.arange(width - w, width, device=dev)
        moved = qkv.numel() * qkv.element_size() * (2 if lora else 1) + 3 * b * w * HEADS * HEAD_DIM * 2
        row = [f"fused step B={b} columns={w}{' +LoRA' if lora else ''}: floor {moved / BW * 1e6:.1f} us"]
        for name, fn in compiled.items():
            row.append(f"{name} {graph_us(lambda fn=fn: fn(qkv, delta, cos, sin, kc, vc, slots), reps=20):.1f}")
        print(" | ".join(row), flush=True)


if __name__ == "__main__":
    sys.exit(main())
