#!/usr/bin/env python
"""Does a matmul with the SwiGLU activation in its epilogue beat cuBLAS plus the activation kernel? (GPU probe)

The input half of an 8B MLP (LLaDA-8B and SDAR-8B share ``4096 -> 2 x 12288``) at a rollout step's row count:
cuBLAS's fused gate/up matmul ``[M, 2N]`` followed by ``silu(gate) * up``, against one Triton kernel (below) that
computes a tile of the gate and the matching tile of the up projection (two accumulators over one input tile, TMA
loads), applies the activation and writes ``[M, N]`` once. Every layer's weights are cycled (nothing stays in
L2); microseconds per layer inside a CUDA graph::

    python benchmarks/swiglu_gemm.py --rows 512 256 224

Baselines: ``mm`` (the matmul alone: a lower bound for the separate path), ``mm+act`` (the matmul, then the
activation compiled into one kernel, as compiled blocks run it) and ``mm+eager`` (matmul, ``silu``, multiply).
Every kernel configuration (``--configs``; default :data:`CONFIGS`) is checked against the separate path and timed
once; then the ``--top`` fastest and the baselines are timed over ``--rounds`` interleaved rounds (medians, spread
max - min, gain over ``mm+act``).

The kernel rounds like the separate kernels (gate and up to bf16 before the activation, the activation before the
product); on the H200 its outputs equalled cuBLAS + activation bit for bit at every measured shape. Measured there
(thirteenth session, ``benchmarks/RESULTS.md``): 1.04x over ``mm+act`` at 512 rows, 0.80-0.89x at 224-256 rows;
the activation kernel itself costs only 4-7 us of a ~80-150 us layer, so this fusion cannot close the rollout
targets and is not used by the framework. The kernel needs TMA (compute capability 9.0+); the test suite runs it
in Triton's interpreter.
"""

import argparse
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import graph_us, require_cuda  # noqa: E402

try:
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - CPU-only installs without triton
    triton = None


@dataclass(frozen=True)
class Config:
    """One launch configuration of the fused kernel."""

    block_m: int = 128
    """Rows of the input per tile."""
    block_n: int = 128
    """Output columns per tile (each tile computes this many gate and this many up columns)."""
    block_k: int = 64
    """Inner-dimension slice per pipeline stage."""
    stages: int = 4
    """Pipeline stages (shared-memory buffers of input and weight slices)."""
    warps: int = 8
    """Warps per program."""
    group_m: int = 8
    """Row tiles walked together (tiles sharing a weight slice run close in time, for L2 reuse)."""
    persistent: bool = False
    """One program per SM walking the tiles, instead of one program per tile."""
    warp_specialize: bool = False
    """Triton's warp specialisation of the tile loop (producer / consumer warps)."""

    def label(self) -> str:
        flags = ("p" if self.persistent else "") + ("w" if self.warp_specialize else "")
        return (f"{self.block_m}x{self.block_n}x{self.block_k}s{self.stages}w{self.warps}g{self.group_m}"
                + (f"-{flags}" if flags else ""))


DEFAULT = Config()
"""The fastest configuration at 512 rows on the H200 (128 x 128 x 64 tiles, 4 stages, 8 warps, one program per
tile)."""


def swiglu_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` from one matmul over the concatenated ``weight [2N, K]`` (what the kernel computes)."""
    gate, up = F.linear(x, weight).chunk(2, dim=-1)
    return F.silu(gate) * up


def supported(x: torch.Tensor, weight: torch.Tensor, config: Config = DEFAULT) -> bool:
    """Whether the kernel serves these operands: triton, 2-D contiguous operands of one floating dtype, the inner
    size a multiple of 16 bytes' worth (TMA strides), and ``N`` a multiple of ``config.block_n`` (a gate tile must
    not reach into the up rows). A CUDA device is checked by the caller (the interpreter runs on CPU tensors)."""
    if triton is None or x.dim() != 2 or weight.dim() != 2 or x.dtype != weight.dtype:
        return False
    if x.dtype not in (torch.float16, torch.bfloat16, torch.float32) or not (x.is_contiguous()
                                                                          and weight.is_contiguous()):
        return False
    rows, k = weight.shape
    return (x.shape[1] == k and rows % 2 == 0 and (rows // 2) % config.block_n == 0
            and (k * x.element_size()) % 16 == 0)


def swiglu_linear(x: torch.Tensor, weight: torch.Tensor, config: Config = DEFAULT,
                  programs: int | None = None) -> torch.Tensor:
    """``silu(x @ W[:N].T) * (x @ W[N:].T)`` for ``x [M, K]``, ``weight [2N, K]`` in one kernel (the caller checks
    :func:`supported`). ``programs``: the persistent grid size (default: the device's SM count)."""
    m, k = x.shape
    n = weight.shape[0] // 2
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    bm, bn, bk = config.block_m, config.block_n, config.block_k
    tiles = triton.cdiv(m, bm) * (n // bn)
    if config.persistent:
        if programs is None:
            programs = (torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 4)
        grid = min(programs, tiles)
    else:
        grid = tiles
    _swiglu_kernel[(grid,)](
        TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(weight, [bn, bk]),
        TensorDescriptor.from_tensor(out, [bm, bn]), n, triton.cdiv(m, bm), n // bn,
        K=k, ITERS=triton.cdiv(tiles, grid), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=config.group_m,
        PROGRAMS=grid, WARP_SPECIALIZE=config.warp_specialize, num_warps=config.warps, num_stages=config.stages)
    return out


if triton is not None:

    @triton.jit
    def _tile_of(tile, tiles_m, tiles_n, GROUP_M: tl.constexpr):
        """Grouped order: ``GROUP_M`` row tiles advance together along the columns."""
        per_group = GROUP_M * tiles_n
        first_m = (tile // per_group) * GROUP_M
        group_rows = tl.minimum(tiles_m - first_m, GROUP_M)
        return first_m + (tile % per_group) % group_rows, (tile % per_group) // group_rows

    @triton.jit
    def _swiglu_kernel(x_desc, w_desc, out_desc, N, tiles_m, tiles_n, K: tl.constexpr, ITERS: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PROGRAMS: tl.constexpr,
                       WARP_SPECIALIZE: tl.constexpr):
        out_dtype = out_desc.dtype
        first = tl.program_id(0)
        # a constant trip count (``ITERS`` tiles per program, the last one guarded) rather than a range over the
        # tile indices: the same code runs under the interpreter, where program ids are arrays
        for it in tl.range(0, ITERS, flatten=True, warp_specialize=WARP_SPECIALIZE):
            tile = first + it * PROGRAMS
            pid_m, pid_n = _tile_of(tile, tiles_m, tiles_n, GROUP_M)
            pid_m = tl.where(tile < tiles_m * tiles_n, pid_m, tiles_m)  # past the last tile: rows beyond M
            row = pid_m * BLOCK_M
            col = pid_n * BLOCK_N
            acc_gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for step in range(tl.cdiv(K, BLOCK_K)):
                inner = step * BLOCK_K
                a = x_desc.load([row, inner])
                acc_gate = tl.dot(a, w_desc.load([col, inner]).T, acc_gate)
                acc_up = tl.dot(a, w_desc.load([N + col, inner]).T, acc_up)
            gate = acc_gate.to(out_dtype).to(tl.float32)
            up = acc_up.to(out_dtype).to(tl.float32)
            act = (gate * tl.sigmoid(gate)).to(out_dtype).to(tl.float32)
            out_desc.store([row, col], (act * up).to(out_dtype))


HIDDEN, FFN = 4096, 12288
CONFIGS = ([Config(bm, bn, bk, stages, warps, persistent=False)
            for bm, bn, bk, stages, warps in [(128, 128, 64, 3, 8), (128, 128, 64, 4, 8), (128, 128, 32, 6, 8),
                                              (128, 128, 128, 2, 8), (256, 64, 64, 3, 8), (256, 64, 64, 4, 8),
                                              (128, 64, 64, 4, 4), (128, 64, 64, 5, 8), (64, 256, 64, 3, 8),
                                              (64, 128, 64, 4, 4), (64, 128, 128, 3, 4)]]
           + [Config(128, 128, 64, stages, 8, persistent=True, warp_specialize=ws) for stages in (3, 4)
              for ws in (False, True)])
"""Default sweep: (rows, columns, inner) tiles x stages x warps with one program per tile, and the 128 x 128 x 64
tile persistent, with or without warp specialisation (the first H200 sweep: persistent programs 1.2-2.2x slower
than one per tile; 64-row tiles persistent hit an illegal instruction under Triton 3.6)."""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, nargs="+", default=[512, 256, 224],
                   help="query rows of the step (512 256 224)")
    p.add_argument("--layers", type=int, default=32, help="layers' weights cycled per replay (32)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds for the finalists (5)")
    p.add_argument("--top", type=int, default=3, help="kernel configurations re-timed per row count (3)")
    p.add_argument("--configs", nargs="*", default=None,
                   help="only these configurations, by label (e.g. 128x128x64s4w8g8)")
    args = p.parse_args(argv)
    if min(args.rows) < 1 or args.layers < 1 or args.rounds < 1 or args.top < 1:
        p.error("--rows, --layers, --rounds and --top take counts >= 1")
    configs = CONFIGS if args.configs is None else [c for c in CONFIGS if c.label() in set(args.configs)]
    if not configs:
        p.error(f"--configs: no such configuration; known: {' '.join(c.label() for c in CONFIGS)}")
    if triton is None:
        p.error("needs Triton (it ships with PyTorch's CUDA builds)")
    require_cuda("swiglu_gemm.py")
    dev, dt = torch.device("cuda"), torch.bfloat16
    weights = [torch.randn(2 * FFN, HIDDEN, device=dev, dtype=dt) * 0.02 for _ in range(args.layers)]
    act = torch.compile(lambda y: F.silu(y[:, :FFN]) * y[:, FFN:], dynamic=False)
    linear = F.linear
    for rows in args.rows:
        x = torch.randn(rows, HIDDEN, device=dev, dtype=dt)
        baselines = {"mm": lambda: [linear(x, w) for w in weights],
                     "mm+act": lambda: [act(linear(x, w)) for w in weights],
                     "mm+eager": lambda: [swiglu_reference(x, w) for w in weights]}
        sweep = {}
        for config in configs:
            if not supported(x, weights[0], config):
                continue
            try:  # the kernel runs before the reference so that its output cannot land on the reference's memory
                out = swiglu_linear(x, weights[0], config).float()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - a configuration the compiler rejects is skipped, with its reason
                print(f"M={rows:<4d} {config.label():24s} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}",
                      flush=True)
                continue
            ref = swiglu_reference(x, weights[0]).float()
            err = ((out - ref).norm() / ref.norm()).item()
            differ = (out != ref).float().mean().item()
            us = graph_us(lambda c=config: [swiglu_linear(x, w, c) for w in weights], reps=2) / args.layers
            sweep[config] = us
            print(f"M={rows:<4d} {config.label():24s} {us:7.2f} us  rel err {err:.1e}, "
                  f"{100 * differ:.3f} % of values differ", flush=True)
        finalists = sorted(sweep, key=sweep.get)[:args.top]
        variants = dict(baselines)
        for c in finalists:
            variants[c.label()] = lambda c=c: [swiglu_linear(x, w, c) for w in weights]
        times = {v: [] for v in variants}
        for _ in range(args.rounds):
            for v, fn in variants.items():
                times[v].append(graph_us(fn, reps=2) / args.layers)
        median = {v: statistics.median(t) for v, t in times.items()}
        base = median["mm+act"]
        for v, t in times.items():
            print(f"M={rows:<4d} {v:24s} {median[v]:7.2f} +-{max(t) - min(t):5.2f} us  "
                  f"{base / median[v]:.3f}x vs mm+act  ({2 * rows * HIDDEN * 2 * FFN / median[v] / 1e6:.0f} TFLOP/s)",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
