#!/usr/bin/env python
"""Can a block's decoding loop run inside one CUDA graph? A probe of CUDA-graph conditional (IF) nodes (GPU).

The block engine of a threshold-style decoder reads a device flag after every step, and the GPU idles while the
host launches the next step's graph. PyTorch's ``CUDAGraph.begin_capture_to_if_node`` (CUDA 12.4+) records a body
that the GPU runs only while a device scalar is true, so a block's ``S`` steps could be one graph: the first step,
then ``S - 1`` steps each guarded by the previous step's "more" flag. This probe times a stand-in step (``--layers``
matmuls of ``--rows`` x 4096 x 4096 plus a compiled elementwise kernel, and the flag update) three ways:

* a host loop: replay one step's graph, read the flag, repeat (what the engine does now);
* one graph of ``--steps`` IF-guarded steps, with the flag ending the loop after ``n`` steps;
* the same graph when every guarded body is skipped (the cost of a skipped body)::

    python benchmarks/conditional_steps.py --rows 256 --layers 8 --steps 4
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import require_cuda  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", type=int, default=256)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--steps", type=int, default=4, help="steps per block (IF-guarded steps: steps - 1)")
    p.add_argument("--reps", type=int, default=20)
    args = p.parse_args(argv)
    if min(args.rows, args.layers, args.steps, args.reps) < 1:
        p.error("--rows, --layers, --steps and --reps take counts >= 1")
    require_cuda("conditional_steps.py")
    dev, dt = torch.device("cuda"), torch.bfloat16
    x = torch.randn(args.rows, 4096, device=dev, dtype=dt)
    weights = [torch.randn(4096, 4096, device=dev, dtype=dt) * 0.02 for _ in range(args.layers)]
    count = torch.zeros((), dtype=torch.long, device=dev)
    limit = torch.full((), args.steps, dtype=torch.long, device=dev)
    more = torch.ones((), dtype=torch.bool, device=dev)
    act = torch.compile(lambda a: F.silu(a) * a, dynamic=False)

    def step():
        h = x
        for w in weights:
            h = act(F.linear(h, w))
        count.add_(1)
        torch.lt(count, limit, out=more)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    one = torch.cuda.CUDAGraph()
    with torch.cuda.graph(one):
        step()
    try:
        block = torch.cuda.CUDAGraph()
        with torch.cuda.graph(block):
            step()
            for _ in range(args.steps - 1):
                capturing = if_node_target(block)
                capturing.begin_capture_to_if_node(more)
                try:
                    step()
                finally:
                    capturing.end_capture_to_conditional_node()
    except (AttributeError, RuntimeError) as error:
        print(f"conditional nodes unavailable with torch {torch.__version__}: {str(error).splitlines()[0][:160]}")
        return 1
    host = torch.zeros((), dtype=torch.long).pin_memory()

    def host_loop(n):
        count.zero_()
        limit.fill_(n)
        while True:
            one.replay()
            host.copy_(more.long(), non_blocking=True)
            torch.cuda.current_stream().synchronize()
            if not host.item():
                break

    def in_graph(n):
        count.zero_()
        limit.fill_(n)
        block.replay()

    def ms(fn, n):
        fn(n)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.reps):
            fn(n)
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / args.reps * 1000

    for n in sorted({1, max(1, args.steps // 2), args.steps}):
        in_graph(n)
        torch.cuda.synchronize()
        ran = int(count)
        print(f"{n} of {args.steps} steps: host loop {ms(host_loop, n):7.3f} ms, one graph {ms(in_graph, n):7.3f} ms "
              f"(steps run in the graph: {ran})", flush=True)
    return 0


def if_node_target(graph):
    """The object that opens IF bodies: the capturing graph as newer PyTorch returns it, else ``graph`` itself."""
    capturing = getattr(torch.cuda.CUDAGraph, "get_currently_capturing_graph", None)
    return capturing() if capturing is not None else graph


if __name__ == "__main__":
    sys.exit(main())
