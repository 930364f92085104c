#!/usr/bin/env python
"""The top-p filter alone (GPU): the sort-free kernel against the sorted filter, inside CUDA graphs::

    python benchmarks/top_p.py
    python benchmarks/top_p.py --shapes 512,152064 16,126464 --top-p 0.9 0.95 --temperature 0.8 --json top_p.json
    python benchmarks/top_p.py --sweep   # the histogram passes' tile size and warps
    python benchmarks/top_p.py --profile # where the bf16 filter's and the pair's time goes, kernel by kernel
    python benchmarks/top_p.py --slices  # more vocabulary slices per row (programs per launch)

Each shape is ``rows,vocabulary`` of bf16 logits (defaults: a B=16 window of 32 and a B=1 window of 256 of
Dream-7B, an SDAR-8B B=64 block of 4). For every shape and ``top_p`` it prints microseconds per call of

* ``sorted``: :func:`dare.rollout.kernels.top_p_sorted` on the float32 scores (logits / temperature);
* ``float32``: :func:`dare.rollout.engine.top_p_kernel.top_p_filter` on the same scores (32-bit keys, 8 passes);
* ``bf16``: the kernel on the bf16 logits, dividing by the temperature itself (16-bit keys, 4 passes);
* ``pair``: :func:`~dare.rollout.engine.top_p_kernel.top_p_filter_pair`, a static step's drawn (mask id removed)
  and confidence distributions in shared passes (two filters per step before it);

the floor of reading the bf16 logits once, the share of rows whose drawn filter needed its own passes, and the
tokens the bf16 kernel's and the sorted filter's kept sets differ on (only where a cumulative sum lies within
rounding of ``top_p``, or among tied values at the threshold).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from common import graph_us, memory_bandwidth, require_cuda  # noqa: E402
from dare.rollout.engine import top_p_kernel  # noqa: E402
from dare.rollout.kernels import top_p_sorted  # noqa: E402

SHAPES = ["512,152064", "256,152064", "256,151936"]
SWEEP = [(128, 4), (256, 4), (256, 8), (512, 8)]
"""``--sweep``: (RADIX_BLOCK, RADIX_WARPS) of :mod:`dare.rollout.engine.top_p_kernel`."""
SLICE_FACTORS = [1, 2, 4, 8]
"""``--slices``: the pair with the slicing of ``factor`` x the GPU's multiprocessor count (more slices per row)."""
BANNED = 7
"""The column the pair removes from the drawn distribution (the mask id of a static step)."""


def shape(text: str) -> tuple[int, int]:
    parts = text.split(",")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"a shape is rows,vocabulary (positive whole numbers), got {text!r}")
    return int(parts[0]), int(parts[1])


def sweep(run) -> dict[str, float]:
    """Microseconds of ``run`` under each setting of :data:`SWEEP` (the module's defaults restored)."""
    defaults = top_p_kernel.RADIX_BLOCK, top_p_kernel.RADIX_WARPS
    times = {}
    try:
        for setting in SWEEP:
            top_p_kernel.RADIX_BLOCK, top_p_kernel.RADIX_WARPS = setting
            times["/".join(map(str, setting))] = graph_us(run)
    finally:
        top_p_kernel.RADIX_BLOCK, top_p_kernel.RADIX_WARPS = defaults
    return times


def kernel_us(run, calls: int = 10) -> dict[str, float]:
    """Microseconds per call of each GPU kernel ``run`` launches (torch profiler over ``calls`` calls), longest
    first."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            run()
        torch.cuda.synchronize()
    events = sorted(prof.key_averages(), key=lambda e: e.self_device_time_total, reverse=True)
    return {e.key: e.self_device_time_total / calls for e in events if e.self_device_time_total > 0}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", type=shape, default=[shape(s) for s in SHAPES])
    p.add_argument("--top-p", nargs="+", type=float, default=[0.95], dest="top_ps")
    p.add_argument("--temperature", type=float, default=1.0, help="divides the logits (default 1)")
    p.add_argument("--scale", type=float, default=4.0, help="standard deviation of the random logits (default 4)")
    p.add_argument("--sweep", action="store_true", help="also time the pair under each setting of SWEEP")
    p.add_argument("--slices", action="store_true", help="also time the pair under each factor of SLICE_FACTORS")
    p.add_argument("--profile", action="store_true", help="also time the bf16 filter's and the pair's kernels")
    p.add_argument("--json", help="also write the rows to this file")
    args = p.parse_args()
    if not all(0 < t < 1 for t in args.top_ps):
        p.error(f"every --top-p must lie in (0, 1), got {args.top_ps}")
    if not args.temperature > 0:
        p.error(f"--temperature must be > 0, got {args.temperature}")
    require_cuda("top_p.py")
    bandwidth = memory_bandwidth(torch.device("cuda"), 2**30)
    t = args.temperature
    rows = []
    print(f"temperature {t:g}, logits N(0, {args.scale:g}^2) in bf16")
    print("| rows | V | top_p | sorted us | float32 us | bf16 us | pair us | 2 x sorted / pair | read floor us |"
          " pair / floor | own passes | differing tokens | kept (mean) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n, v in args.shapes:
        torch.manual_seed(0)
        logits = (torch.randn(n, v, device="cuda") * args.scale).bfloat16()
        scores = logits.float() / t
        for top_p in args.top_ps:
            calls = dict(
                sorted=lambda: top_p_sorted(scores, top_p),
                float32=lambda: top_p_kernel.top_p_filter(scores, top_p),
                bf16=lambda: top_p_kernel.top_p_filter(logits, top_p, temperature=t),
                pair=lambda: top_p_kernel.top_p_filter_pair(logits, top_p, banned=BANNED, temperature=t))
            us = {name: graph_us(call) for name, call in calls.items()}
            fast = torch.isfinite(calls["bf16"]())
            slow = torch.isfinite(calls["sorted"]())
            own = top_p_kernel._nucleus(logits, top_p, t, BANNED, pair=True, processors=None)[2]
            floor = logits.numel() * logits.element_size() / bandwidth * 1e6
            row = dict(rows=n, vocab=v, top_p=top_p, temperature=t, **{f"{k}_us": x for k, x in us.items()},
                       read_floor_us=floor, own_passes=own.float().mean().item(),
                       differing_tokens=int((fast != slow).sum()), kept_mean=fast.sum(-1).float().mean().item())
            if args.sweep:
                row["sweep"] = sweep(calls["pair"])
            if args.slices:
                sms = torch.cuda.get_device_properties(0).multi_processor_count
                row["slices"] = {factor: graph_us(lambda: top_p_kernel.top_p_filter_pair(
                    logits, top_p, banned=BANNED, temperature=t, processors=factor * sms))
                    for factor in SLICE_FACTORS}
            if args.profile:
                row["kernels_us"] = {name: kernel_us(calls[name]) for name in ("bf16", "pair")}
            rows.append(row)
            print(f"| {n} | {v} | {top_p:g} | {us['sorted']:.1f} | {us['float32']:.1f} | {us['bf16']:.1f} | "
                  f"{us['pair']:.1f} | {2 * us['sorted'] / us['pair']:.1f}x | {floor:.1f} | "
                  f"{us['pair'] / floor:.1f}x | {100 * row['own_passes']:.1f} % | {row['differing_tokens']} | "
                  f"{row['kept_mean']:.0f} |", flush=True)
            if args.sweep:
                print("|  | pair under (tile, warps): " + ", ".join(f"{k} {x:.1f}" for k, x in row["sweep"].items())
                      + " |||||||||||", flush=True)
            if args.slices:
                print("|  | pair with slices for k x the multiprocessors: " + ", ".join(
                    f"k={k} {x:.1f}" for k, x in row["slices"].items()) + " |||||||||||", flush=True)
            if args.profile:
                for name, kernels in row["kernels_us"].items():
                    print(f"|  | {name} by kernel (us per call): "
                          + ", ".join(f"{k} {x:.1f}" for k, x in kernels.items()) + " |||||||||||", flush=True)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"rows": rows, "device": torch.cuda.get_device_name()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
