#!/usr/bin/env python
"""A static step's token proposals (GPU): the one-pass kernel against the compiled tensor ops, inside CUDA graphs::

    python benchmarks/proposal.py
    python benchmarks/proposal.py --shapes 16,32,126464 --temperatures 0 1 --json proposal.json
    python benchmarks/proposal.py --sampler dream --shapes 1,256,152064 16,256,152064   # neg_entropy confidence
    python benchmarks/proposal.py --sampler dream --top-p 0.95 --temperatures 1   # the top-p kernel's nuclei

Each shape is ``batch,window,vocabulary`` of bf16 logits (defaults: LLaDA-8B B=1 and B=16 windows of 32, SDAR-8B
B=1 and B=64 blocks of 4). For every shape and temperature it prints microseconds per proposal for
``dare.rollout.engine.proposal_kernel`` and for the compiled ops it replaces (``DARE_PROPOSAL_KERNEL=0``), the
floor of reading the logits once, and the fraction of proposed tokens the two agree on (greedy: all). The
confidence settings are ``--sampler``'s preset (default ``llada``: the token's probability; ``dream``: the
negative entropy of the sampling distribution). ``--top-p`` / ``--top-k`` add the filters, and the
``unfiltered us`` column times the same call without them, so the filters' cost reads off one row. With top-p
alone the kernel reads the nuclei of :mod:`dare.rollout.engine.top_p_kernel` (no filtered copies) and the
compiled ops the same kernel's filtered float32 copies; with top-k both columns time the compiled ops.
``--sweep`` also times the kernel under other launch settings (tile size, warps, programs per multiprocessor)::

    python benchmarks/proposal.py --sweep
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from common import graph_us, memory_bandwidth, require_cuda  # noqa: E402
from dare.rollout import SAMPLERS, SamplerConfig  # noqa: E402
from dare.rollout.engine import noise, proposal_kernel, sampling  # noqa: E402

SHAPES = ["1,32,126464", "16,32,126464", "1,4,151936", "64,4,151936"]
SWEEP = [(1024, 4, 2), (1024, 4, 4), (1024, 4, 8), (2048, 4, 2), (2048, 4, 4), (2048, 8, 2), (2048, 8, 4),
         (4096, 8, 2), (4096, 8, 4)]
"""``--sweep``: (BLOCK, NUM_WARPS, PROGRAMS_PER_SM) of :mod:`dare.rollout.engine.proposal_kernel`."""


def shape(text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    if len(parts) != 3 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"a shape is batch,window,vocabulary (positive whole numbers), got {text!r}")
    return tuple(int(p) for p in parts)


def temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"a temperature is a number >= 0, got {text!r}")
    return value


def propose_with(logits, eligible, args, kernel: bool):
    os.environ["DARE_PROPOSAL_KERNEL"] = "1" if kernel else "0"
    return sampling.propose_static(logits, eligible, **args)


def sweep(run) -> dict[str, float]:
    """Microseconds of ``run`` under each launch setting of :data:`SWEEP` (the module's defaults restored)."""
    defaults = proposal_kernel.BLOCK, proposal_kernel.NUM_WARPS, proposal_kernel.PROGRAMS_PER_SM
    times = {}
    try:
        for setting in SWEEP:
            proposal_kernel.BLOCK, proposal_kernel.NUM_WARPS, proposal_kernel.PROGRAMS_PER_SM = setting
            times["/".join(map(str, setting))] = graph_us(run)
    finally:
        proposal_kernel.BLOCK, proposal_kernel.NUM_WARPS, proposal_kernel.PROGRAMS_PER_SM = defaults
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shapes", nargs="+", type=shape, default=[shape(s) for s in SHAPES])
    p.add_argument("--temperatures", nargs="+", type=temperature, default=[0.0, 1.0])
    p.add_argument("--sampler", default="llada", choices=sorted(SAMPLERS),
                   help="the preset whose confidence settings are timed (default llada)")
    p.add_argument("--top-p", type=float, help="top-p filter of the timed settings (0 < p < 1)")
    p.add_argument("--top-k", type=int, help="top-k filter of the timed settings (k > 0)")
    p.add_argument("--json", help="also write the rows to this file")
    p.add_argument("--sweep", action="store_true", help="also time the kernel under each launch setting of SWEEP")
    args = p.parse_args()
    if args.top_p is not None and not 0 < args.top_p < 1:
        p.error(f"--top-p must lie in (0, 1), got {args.top_p}")
    if args.top_k is not None and args.top_k < 1:
        p.error(f"--top-k must be >= 1, got {args.top_k}")
    filters = {k: v for k, v in dict(top_p=args.top_p, top_k=args.top_k).items() if v is not None}
    require_cuda("proposal.py")
    bandwidth = memory_bandwidth(torch.device("cuda"), 2**30)
    rows = []
    print(f"sampler {args.sampler}" + "".join(f", {k} {v}" for k, v in filters.items()))
    print("| B | W | V | T | kernel us | compiled us | compiled / kernel | read floor us | same tokens |"
          + (" unfiltered us |" if filters else ""))
    print("|---|---|---|---|---|---|---|---|---|" + ("---|" if filters else ""))
    for b, w, v in args.shapes:
        torch.manual_seed(0)
        logits = torch.randn(b, w, v, device="cuda", dtype=torch.bfloat16) * 4
        eligible = torch.rand(b, w, device="cuda") < 0.8
        keys = noise.row_keys(list(range(b)), "cuda")
        counters = torch.arange(b, device="cuda")
        positions = torch.arange(w, device="cuda")[None].expand(b, w)
        for t in args.temperatures:
            config = SamplerConfig(sampler=args.sampler, temperature=t, **filters).resolved()
            call = dict(config=config, banned=7, keys=keys, counters=counters, positions=positions)
            fast = propose_with(logits, eligible, call, kernel=True)
            slow = propose_with(logits, eligible, call, kernel=False)
            same = (fast.tokens == slow.tokens)[eligible].float().mean().item()
            times = {k: graph_us(lambda k=k: propose_with(logits, eligible, call, kernel=k)) for k in (True, False)}
            floor = logits.numel() * logits.element_size() / bandwidth * 1e6
            row = dict(sampler=args.sampler, confidence=config.confidence, batch=b, window=w, vocab=v, temperature=t,
                       kernel_us=times[True], compiled_us=times[False],
                       read_floor_us=floor, same_tokens=same)
            if filters:
                plain = dict(call, config=SamplerConfig(sampler=args.sampler, temperature=t).resolved())
                row.update(filters, unfiltered_us=graph_us(lambda: propose_with(logits, eligible, plain, kernel=True)))
            if args.sweep:
                row["sweep"] = sweep(lambda: propose_with(logits, eligible, call, kernel=True))
            rows.append(row)
            print(f"| {b} | {w} | {v} | {t:g} | {times[True]:.1f} | {times[False]:.1f} | "
                  f"{times[False] / times[True]:.2f}x | {floor:.1f} | {100 * same:.2f} % |"
                  + (f" {row['unfiltered_us']:.1f} |" if filters else ""), flush=True)
            if args.sweep:
                print("|  | sweep (block, warps, programs per SM): " + ", ".join(
                    f"{k} {us:.1f}" for k, us in row["sweep"].items()) + " |||||||", flush=True)
    os.environ.pop("DARE_PROPOSAL_KERNEL", None)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)  # as the other benchmarks' result files
        Path(args.json).write_text(json.dumps({"rows": rows, "device": torch.cuda.get_device_name()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
