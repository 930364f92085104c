#!/usr/bin/env python
"""Ways to run one projection matmul at a rollout step's row count (GPU): does another cuBLAS choice beat the
default ``F.linear``? Per projection of the 8B shapes (fused q/k/v, o, fused gate/up, down; every layer's weights,
so nothing stays in L2), microseconds per layer, timed inside a CUDA graph, median over ``--rounds`` interleaved
rounds with the spread (max - min) beside it::

    python benchmarks/matmul_variants.py --family llada --rows 224 256 192 160 512 384
    python benchmarks/matmul_variants.py --family sdar --rows 256 512

Variants: ``mm`` (``F.linear``, cuBLAS), ``lt`` (the same under ``preferred_blas_library('cublaslt')``), ``T``
(``mm(W, x.T).T``: cuBLAS gets the other orientation) and ``splitK<s>`` (``bmm(..., out_dtype=float32)`` over ``s``
slices of the inner dimension, then a sum and a cast; ``--split-k``, needs a PyTorch with ``bmm``'s ``out_dtype``),
and with ``--fp8`` ``fp8`` (``torch._scaled_mm`` over operands quantised beforehand as ``SamplerConfig.weights =
"fp8"`` quantises them, :mod:`dare.models.fp8`: the matmul alone), and with ``--quack`` ``quack`` (the CuTe-DSL GEMMs
of the ``quack-kernels`` package, autotuned per shape by an eager call before the graph is recorded; not a DARE
dependency: ``pip install quack-kernels 'nvidia-cutlass-dsl[cu13]'``), and with ``--lt-algos N`` ``lt#i`` for the
first ``N`` algorithms of cuBLASLt's ranked list (``cublaslt.py``, ctypes; ``lt#0`` is the one cuBLASLt itself
runs, each checked against ``F.linear`` first), and with ``--cutlass`` ``cl:<configuration>`` for DARE's
hand-instantiated CUTLASS kernels (``cutlass_gemm.py``; ``bash benchmarks/cutlass/build.sh`` first). The best
variant and its gain over ``mm`` close each line; with several projections a last line per row count sums each
variant over them (one layer), and ``best lt#`` / ``best cl:`` sum each library's fastest algorithm per projection.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import graph_us, require_cuda  # noqa: E402
from engine_profile import GEMM_SHAPES  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", choices=sorted(GEMM_SHAPES), default="llada", help="8B projection shapes (llada)")
    p.add_argument("--rows", type=int, nargs="+", default=[256, 512], help="query rows of the step (256 512)")
    p.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds per variant (5)")
    p.add_argument("--split-k", type=int, nargs="*", default=[], help="also time split-K over these slice counts")
    p.add_argument("--fp8", action="store_true", help="also time the FP8 matmul of pre-quantised operands")
    p.add_argument("--quack", action="store_true", help="also time quack's autotuned CuTe-DSL GEMM (quack-kernels)")
    p.add_argument("--lt-algos", type=int, default=0, help="also time this many of cuBLASLt's ranked algorithms (0)")
    p.add_argument("--cutlass", action="store_true",
                   help="also time the CUTLASS configurations of cutlass/dare_gemm.cu (build.sh builds them)")
    args = p.parse_args(argv)
    if min(args.rows) < 1 or args.rounds < 1 or any(s < 2 for s in args.split_k) or args.lt_algos < 0:
        p.error("--rows and --rounds take counts >= 1, --split-k slice counts >= 2, --lt-algos a count >= 0")
    quack_gemm = load_quack(p) if args.quack else None
    if args.cutlass:
        from cutlass_gemm import missing_library

        if error := missing_library("--cutlass"):
            p.error(error)
    require_cuda("matmul_variants.py")
    shape = GEMM_SHAPES[args.family]
    hidden, kv, ffn, layers = shape["hidden"], shape["kv"], shape["ffn"], shape["layers"]
    projections = {"qkv": (hidden, hidden + 2 * kv), "o": (hidden, hidden), "gate_up": (hidden, 2 * ffn),
                   "down": (ffn, hidden)}
    dev, dt = torch.device("cuda"), torch.bfloat16
    weights = {name: [torch.randn(n, k, device=dev, dtype=dt) * 0.02 for _ in range(layers)]
               for name, (k, n) in projections.items()}
    for rows in args.rows:
        per_variant: dict[str, list[float]] = {}
        for name, (k, n) in projections.items():
            x = torch.randn(rows, k, device=dev, dtype=dt)
            variants = variants_of(x, weights[name], [s for s in args.split_k if k % s == 0], args.fp8, quack_gemm)
            labels = lt_variants(variants, x, weights[name], args.lt_algos)
            if args.cutlass:
                labels |= cutlass_variants(variants, x, weights[name])
            times = {v: [] for v in variants}
            for _ in range(args.rounds):
                for v, fn in variants.items():
                    torch.backends.cuda.preferred_blas_library("cublaslt" if v == "lt" else "cublas")
                    times[v].append(graph_us(fn, reps=4) / layers)
            torch.backends.cuda.preferred_blas_library("cublas")
            median = {v: statistics.median(t) for v, t in times.items()}
            best = min(median, key=median.get)
            cells = "  ".join(f"{v} {median[v]:7.2f} +-{max(t) - min(t):5.2f}" for v, t in times.items()
                              if not v.startswith(("lt#", "cl:")) or v in ("lt#0", best))
            print(f"{args.family} M={rows:<4d} {name:8s} {cells}  best {best} "
                  f"({100 * (1 - median[best] / median['mm']):.1f} % under mm){labels.get(best, '')}", flush=True)
            if labels:
                ranked = sorted(labels, key=median.get)
                print("    library algorithms, fastest first: " + "; ".join(
                    f"{v} {median[v]:.2f}" + (f" [{labels[v].strip(' ()')}]" if v.startswith("lt#") else "")
                    for v in ranked[:6]), flush=True)
            for v, us in median.items():
                per_variant.setdefault(v, []).append(us)
            for family in ("lt#", "cl:"):  # a library's best algorithm, chosen per projection
                if any(v.startswith(family) for v in median):
                    per_variant.setdefault(f"best {family}", []).append(
                        min(us for v, us in median.items() if v.startswith(family)))
        # variants that ran for every projection (a split-K slice count must divide each inner size)
        layer = {v: sum(us) for v, us in per_variant.items()
                 if len(us) == len(projections) and not v.startswith(("lt#", "cl:"))}
        ratio = f"  (mm / fp8 {layer['mm'] / layer['fp8']:.2f}x)" if "fp8" in layer else ""
        print(f"{args.family} M={rows:<4d} one layer: " + "  ".join(f"{v} {us:7.1f}" for v, us in layer.items())
              + ratio, flush=True)
    return 0


def load_quack(p: argparse.ArgumentParser):
    """quack's ``gemm(A, B)`` (``A @ B``, B of shape (K, N)), or a one-line error when the package is missing."""
    try:
        from quack.gemm_interface import gemm
    except Exception as e:  # noqa: BLE001 - any import failure of the optional package ends the same way
        p.error(f"--quack needs the quack-kernels package (pip install quack-kernels 'nvidia-cutlass-dsl[cu13]'): "
                f"{type(e).__name__}: {e}")
    return gemm


def variants_of(x: torch.Tensor, weights: list[torch.Tensor], splits: list[int], fp8: bool, quack_gemm=None) -> dict:
    """name -> a function running the projection of ``x`` by every layer's weight one way."""
    linear = torch.nn.functional.linear
    variants = {"mm": lambda: [linear(x, w) for w in weights],
                "lt": lambda: [linear(x, w) for w in weights],  # timed under cuBLASLt
                "T": lambda: [torch.mm(w, x.t()).t() for w in weights]}
    for s in splits:
        variants[f"splitK{s}"] = lambda s=s: [split_k(x, w, s) for w in weights]
    if fp8:
        from dare.models.fp8 import FP8, quantize_activation, quantize_rows

        xq, x_scale = quantize_activation(x)
        quantised = []
        for w in weights:
            q, scale = torch.empty(w.shape, dtype=FP8, device=w.device), torch.empty(w.shape[0], device=w.device)
            quantize_rows(w, q, scale)
            quantised.append((q, scale[None, :]))
        variants["fp8"] = lambda: [torch._scaled_mm(xq, q.t(), scale_a=x_scale, scale_b=s, out_dtype=x.dtype)
                                   for q, s in quantised]
    if quack_gemm is not None:
        quack_gemm(x, weights[0].t())  # autotunes this shape eagerly; the recorded calls reuse its plan
        variants["quack"] = lambda: [quack_gemm(x, w.t()) for w in weights]
    return variants


def lt_variants(variants: dict, x: torch.Tensor, weights: list[torch.Tensor], count: int) -> dict[str, str]:
    """Adds ``lt#i`` for each of cuBLASLt's first ``count`` ranked algorithms (see :func:`add_plans`)."""
    if count == 0:
        return {}
    from cublaslt import plans

    w0 = weights[0]
    return add_plans(variants, x, weights, [(f"lt#{plan.rank}", plan.label, plan)
                                            for plan in plans(x.shape[0], w0.shape[0], w0.shape[1], count)])


def cutlass_variants(variants: dict, x: torch.Tensor, weights: list[torch.Tensor]) -> dict[str, str]:
    """Adds ``cl:<configuration>`` for each CUTLASS configuration of ``cutlass/dare_gemm.cu`` that runs the shape."""
    from cutlass_gemm import plans

    w0 = weights[0]
    return add_plans(variants, x, weights, [(f"cl:{plan.label}", plan.label, plan)
                                            for plan in plans(x.shape[0], w0.shape[0], w0.shape[1])])


def add_plans(variants: dict, x: torch.Tensor, weights: list[torch.Tensor], named: list) -> dict[str, str]:
    """Adds each ``(name, label, plan)`` whose ``plan(x, w, out)`` computes ``F.linear``'s product (checked on the
    first layer) as a variant over every layer; returns each added variant's label."""
    w0 = weights[0]
    reference = torch.nn.functional.linear(x, w0).float()
    labels = {}
    for name, label, plan in named:
        outs = [torch.empty(x.shape[0], w0.shape[0], device=x.device, dtype=x.dtype) for _ in range(2)]
        error = (plan(x, w0, outs[0]).float() - reference).abs().max().item()
        if error > 1e-2 * reference.abs().max().item():
            print(f"    {name} skipped: differs from F.linear by {error:.3g} ({label})", flush=True)
            continue
        variants[name] = lambda plan=plan, outs=outs: [plan(x, w, outs[i % 2]) for i, w in enumerate(weights)]
        labels[name] = f" ({label})"
    return labels


def split_k(x: torch.Tensor, w: torch.Tensor, slices: int) -> torch.Tensor:
    """``x @ w.T`` as ``slices`` partial products over the inner dimension, summed in float32."""
    rows, k = x.shape
    xs = x.view(rows, slices, k // slices).transpose(0, 1)
    ws = w.view(w.shape[0], slices, k // slices).permute(1, 2, 0)
    return torch.bmm(xs, ws, out_dtype=torch.float32).sum(0).to(x.dtype)


if __name__ == "__main__":
    sys.exit(main())
