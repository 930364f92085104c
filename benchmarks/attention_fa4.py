#!/usr/bin/env python
"""FlashAttention-4's Hopper kernels against SDPA at the attention shapes of DARE's rollouts and updates (GPU).

Attention is ~8 % of a LLaDA-8B B=16 dual-cache step (cuDNN at 37 us per layer against a 23 us read floor) and
~10 % of BGPO's update (cuDNN's backward at ~170 TFLOP/s on copies of ~390 tokens): the one attention route no
session had measured. ``flash-attn-4`` (CuTe DSL; Hopper forward and backward kernels) is timed directly
(``flash_attn.cute.interface.flash_attn_func``, ``[B, L, H, d]`` views of the same tensors) against
``F.scaled_dot_product_attention`` as DARE calls it (its default backend choice, ``enable_gqa``) and SDPA's
flash backend. Rollout shapes run forward only, each call timed inside a CUDA graph (eager launches where a kernel
cannot be captured); update shapes run forward + backward with CUDA events. Per shape: microseconds per call, the
attention FLOP rate, FA4's largest difference from SDPA's output, and FA4 / SDPA.

    python benchmarks/attention_fa4.py                          # every shape
    python benchmarks/attention_fa4.py --shapes llada_b16_dual_window bgpo_update_390

Needs ``flash-attn-4`` (pre-release, with ``nvidia-cutlass-dsl``, ``quack-kernels``, ``apache-tvm-ffi`` and
``torch-c-dlpack-ext``): ``pip install --pre flash-attn-4``.
"""

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import cuda_ms, graph_us, require_cuda  # noqa: E402


@dataclass(frozen=True)
class Shape:
    """One attention call: ``batch`` rows, ``heads`` query / ``kv_heads`` key-value heads of ``head_dim``,
    ``queries`` x ``keys`` tokens, no mask; ``update`` adds the backward pass."""

    batch: int
    heads: int
    kv_heads: int
    queries: int
    keys: int
    head_dim: int = 128
    update: bool = False
    note: str = ""

    def flops(self) -> float:
        """Attention FLOPs of one call: 4 B H Q K d forward (QK^T and PV); the backward adds 2.5x that."""
        forward = 4.0 * self.batch * self.heads * self.queries * self.keys * self.head_dim
        return forward * (3.5 if self.update else 1.0)


SHAPES = {
    "llada_b16_dual_window": Shape(16, 32, 32, 32, 384, note="LLaDA-8B B=16 dual-cache window step (a target cell)"),
    "llada_b1_prefix_window": Shape(1, 32, 32, 256, 384, note="LLaDA-8B B=1 prefix-cache first window"),
    "llada_d1_canvas": Shape(32, 32, 32, 384, 384, note="the d1 step's block-start forward (32 rows)"),
    "sdar_b64_block_step": Shape(64, 32, 8, 4, 260, note="SDAR-8B B=64 block step over its valid keys"),
    "bgpo_update_390": Shape(4, 32, 8, 780, 780, update=True,
                             note="BGPO update, [noisy ; clean] of ~390-token copies, dense (no block mask)"),
    "bgpo_update_2170": Shape(2, 32, 8, 4340, 4340, update=True,
                              note="BGPO update at 2048 generated tokens, dense (no block mask)"),
}


def load_fa4():
    """``flash_attn.cute.interface.flash_attn_func``, or a one-line exit naming the missing package."""
    try:
        from flash_attn.cute.interface import flash_attn_func
    except Exception as exc:  # ImportError, or the CuTe DSL failing to load its runtime
        print(f"attention_fa4.py: error: flash-attn-4 is not importable ({type(exc).__name__}: {exc}); "
              "pip install --pre flash-attn-4", file=sys.stderr)
        raise SystemExit(2) from None
    return flash_attn_func


def tensors(shape: Shape, device: torch.device, seed: int = 0):
    """``q [B, H, Q, d]``, ``k, v [B, Hkv, K, d]`` in bf16 (the layout DARE's blocks pass to SDPA)."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def rand(heads, length):
        return torch.randn(shape.batch, heads, length, shape.head_dim, device=device, dtype=torch.bfloat16,
                           generator=gen).requires_grad_(shape.update)

    return rand(shape.heads, shape.queries), rand(shape.kv_heads, shape.keys), rand(shape.kv_heads, shape.keys)


def callers(shape: Shape, fa4, q, k, v) -> dict:
    """Name -> a function returning ``[B, H, Q, d]`` attention outputs of ``q, k, v``."""
    gqa = shape.kv_heads != shape.heads

    def sdpa():
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)

    def sdpa_flash():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)

    def flash4():
        out = fa4(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=False)
        out = out[0] if isinstance(out, tuple) else out
        return out.transpose(1, 2)

    return {"sdpa": sdpa, "sdpa_flash": sdpa_flash, "fa4": flash4}


def time_call(shape: Shape, fn, grad) -> tuple[float, str]:
    """Microseconds per call and how they were timed."""
    if shape.update:
        def step():
            fn().backward(grad)
        return cuda_ms(step, reps=20) * 1000, "events (forward + backward)"
    with torch.no_grad():
        try:
            return graph_us(fn), "CUDA graph"
        except Exception:  # a kernel that cannot be captured: eager launches, launch overhead included
            torch.cuda.synchronize()
            return cuda_ms(fn) * 1000, "events (eager launches)"


def measure(name: str, shape: Shape, fa4, device: torch.device) -> list[dict]:
    q, k, v = tensors(shape, device)
    grad = torch.randn(shape.batch, shape.heads, shape.queries, shape.head_dim, device=device, dtype=torch.bfloat16)
    calls = callers(shape, fa4, q, k, v)
    with torch.no_grad():
        reference = calls["sdpa"]().float()
    rows = []
    for impl, fn in calls.items():
        row = {"shape": name, "impl": impl, **asdict(shape)}
        try:
            with torch.no_grad():
                row["max_abs_diff"] = float((fn().float() - reference).abs().max())
            us, how = time_call(shape, fn, grad)
            row.update(us=us, timed=how, tflops=shape.flops() / (us * 1e-6) / 1e12)
        except Exception as exc:  # one failing implementation leaves the others' numbers
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def print_table(rows: list[dict]) -> None:
    print("| shape | sdpa us | sdpa_flash us | fa4 us | fa4 TFLOP/s | fa4 / sdpa | fa4 max abs diff |")
    print("|---|---|---|---|---|---|---|")
    by_shape: dict[str, dict[str, dict]] = {}
    for row in rows:
        by_shape.setdefault(row["shape"], {})[row["impl"]] = row

    def us(r):
        return f"{r['us']:.1f}" if r and "us" in r else "failed"

    for name, impls in by_shape.items():
        sdpa, flash, fa4 = impls.get("sdpa"), impls.get("sdpa_flash"), impls.get("fa4")
        ratio = f"{fa4['us'] / sdpa['us']:.2f}" if fa4 and sdpa and "us" in fa4 and "us" in sdpa else ""
        rate = f"{fa4['tflops']:.0f}" if fa4 and "tflops" in fa4 else ""
        diff = f"{fa4['max_abs_diff']:.3g}" if fa4 and "max_abs_diff" in fa4 else ""
        print(f"| {name} | {us(sdpa)} | {us(flash)} | {us(fa4)} | {rate} | {ratio} | {diff} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    p.add_argument("--json", help="write every row to this file")
    args = p.parse_args(argv)
    require_cuda("attention_fa4.py")
    fa4 = load_fa4()
    device = torch.device("cuda")
    rows = []
    for name in args.shapes:
        print(f"# {name}: {SHAPES[name].note}", flush=True)
        rows.extend(measure(name, SHAPES[name], fa4, device))
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
