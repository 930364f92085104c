#!/usr/bin/env python
"""Where a static decoding step's time goes (GPU): replay time of each recorded graph, and the top kernels of one
eager static step. Diagnostic companion of rollout.py / bd_rollout.py::

    python benchmarks/engine_profile.py --family llada --batch 1
    python benchmarks/engine_profile.py --family sdar --batch 1
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import build_llada, build_sdar  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--family", choices=["llada", "sdar"], default="llada")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--gen", type=int, default=256)
    p.add_argument("--prompt-length", type=int, default=128)
    args = p.parse_args(argv)
    from dare.rollout import SamplerConfig, generate
    from dare.rollout.engine import _STATES

    device = torch.device("cuda")
    model = build_llada(device) if args.family == "llada" else build_sdar(device)
    if args.family == "llada":
        config = SamplerConfig(sampler="fastdllm", cache="dual", decoder="quota", gen_length=args.gen, block_length=32,
                               steps=args.gen, eos_early_stop=False, max_blocks=2, engine="graph")
    else:
        config = SamplerConfig(sampler="sdar", cache="block", decoder="quota", gen_length=args.gen, eos_early_stop=False,
                               max_blocks=4, engine="graph")
    prompts = torch.randint(0, 100000, (args.batch, args.prompt_length), device=device)
    generate(model, prompts, None, config)
    state = next(iter(_STATES[model].values()))
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for key, graph in state.runner.graphs.items():
        graph.replay()
        torch.cuda.synchronize()
        start.record()
        for _ in range(20):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        print(f"graph {key}: {start.elapsed_time(end) / 20:.3f} ms per replay", flush=True)
    print(f"graph memory reserved while recording: {state.runner.graph_bytes / 2**30:.2f} GiB; "
          f"allocated now {torch.cuda.memory_allocated() / 2**30:.1f} GiB", flush=True)
    key = next(k for k in state.runner.graphs if k[0] in ("window", "inner"))
    fn = (lambda: state.step_window(key[1])) if key[0] == "window" else (lambda: state.step(False, 1))
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad():
        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
            fn()
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
