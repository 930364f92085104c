#!/usr/bin/env python
"""Where a static decoding step's time goes (GPU): time of each recorded step during a real decode, and the top
kernels of a whole decode (graph replays included). Diagnostic companion of rollout.py / bd_rollout.py::

    python benchmarks/engine_profile.py --family llada --batch 1
    python benchmarks/engine_profile.py --family sdar --batch 1
    python benchmarks/engine_profile.py --family llada --batch 1 --compile static   # blocks compiled first
    python benchmarks/engine_profile.py --gemm-only --batch 1 16                      # projection GEMMs only
    python benchmarks/engine_profile.py --gemm-only --family sdar --rows 4 --batch 64  # SDAR-8B shapes
    python benchmarks/engine_profile.py --family sdar --batch 64 --compile static --max-blocks 0 --timeline

``--timeline`` also splits the profiled decode into kernel time by kind and the GPU's idle time between kernels
(short gaps inside a recorded step vs waits on the host), and profiles one more decode's host functions
(``cProfile``). The host column overstates the waits of an unprofiled decode (the twentieth session's SDAR B=64
runs: 0.8 ms per forward less under the profiler, 0.12 ms less in the benchmark's wall time); read it as an upper
bound.

``--gemm-only`` times one layer's projection matmuls at a step's row count (``batch x block``): q/k/v and
gate/up as separate matmuls (as the checkpoints store them) vs one matmul over the concatenated weights, under
each matmul library named by ``--libraries``: the BLAS libraries PyTorch can call
(``torch.backends.cuda.preferred_blas_library``: ``cublas``, ``cublaslt``) and ``inductor-tma``, inductor's
autotuned Triton templates with its persistent TMA matmul enabled (Hopper), with the TFLOP/s each reaches (the
rollouts' 256-512-row steps run their 4096-wide projections well below the peak). Every variant is timed as
CUDA-graph replays, as the engine runs it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import build_llada, build_sdar, graph_us, require_cuda  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--family", choices=["llada", "sdar"], default="llada")
    p.add_argument("--batch", type=int, nargs="+", default=[1], help="batch size (several with --gemm-only)")
    p.add_argument("--gen", type=int, default=256)
    p.add_argument("--prompt-length", type=int, default=128)
    p.add_argument("--compile", choices=["none", "dynamic", "static"], default="none",
                   help="regional torch.compile of every block before recording (dynamic or static shapes)")
    p.add_argument("--cache", choices=["prefix", "dual"], help="llada: Fast-dLLM cache (default dual)")
    p.add_argument("--max-blocks", type=int, help="blocks decoded (default: 2 for llada, 4 for sdar; 0 = all)")
    p.add_argument("--weights", choices=["model", "fp8"], default="model",
                   help="SamplerConfig.weights of the profiled decode (fp8: FP8 projection copies)")
    p.add_argument("--gemm-only", action="store_true", help="time the projection matmuls, separate vs fused")
    p.add_argument("--rows", type=int, help="--gemm-only: query rows per batch row (the block; default 32)")
    p.add_argument("--timeline", action="store_true",
                   help="also split the profiled decode into kernel time and GPU idle time between kernels, by kernel kind")
    p.add_argument("--kernels-json", metavar="PATH",
                   help="also write every kernel of the profiled decode as [name, start_us, end_us] (JSON list, by start)")
    p.add_argument("--libraries", nargs="+", choices=sorted(MATMULS),
                   help="--gemm-only: matmul libraries to time side by side (default: cublas cublaslt)")
    args = p.parse_args(argv)
    check_arguments(p, args)
    require_cuda("engine_profile.py")
    if args.gemm_only:
        for batch in args.batch:
            for library in args.libraries or ["cublas", "cublaslt"]:
                print(f"\nmatmul library: {library}")
                gemm_fusion(batch * (args.rows or 32), lin=MATMULS[library](), **GEMM_SHAPES[args.family])
        return 0
    from dare.rollout import SamplerConfig, generate
    from dare.rollout.engine import _STATES

    device = torch.device("cuda")
    model = build_llada(device) if args.family == "llada" else build_sdar(device)
    if args.compile != "none":
        from dare.models.compile import compile_blocks

        compile_blocks(model, dynamic=args.compile == "dynamic")
    if args.family == "llada":
        config = SamplerConfig(sampler="fastdllm", cache=args.cache or "dual", decoder="quota", gen_length=args.gen, block_length=32,
                               steps=args.gen, eos_early_stop=False, max_blocks=blocks(args, 2), engine="graph",
                               weights=args.weights)
    else:
        config = SamplerConfig(sampler="sdar", cache="block", decoder="quota", gen_length=args.gen, eos_early_stop=False,
                               max_blocks=blocks(args, 4), engine="graph", weights=args.weights)
    (batch,) = args.batch
    prompts = torch.randint(0, 100000, (batch, args.prompt_length), device=device)
    generate(model, prompts, None, config)  # records the graphs
    state = next(iter(_STATES[model].values()))
    # Time each recorded step during a real second decode (replaying a graph out of its decode order is not
    # valid: block steps advance device counters), then profile a third decode's kernels.
    runner, original = state.runner, state.runner.run
    times: dict = {}

    def timed_run(key, fn):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        original(key, fn)
        end.record()
        times.setdefault(key, []).append((start, end))

    runner.run = timed_run
    generate(model, prompts, None, config)
    torch.cuda.synchronize()
    runner.run = original
    total = 0.0
    for key, pairs in times.items():
        ms = [s.elapsed_time(e) for s, e in pairs]
        total += sum(ms)
        print(f"step {key}: {len(ms)} x {sum(ms) / len(ms):.3f} ms", flush=True)
    print(f"all steps: {total:.1f} ms over {sum(len(v) for v in times.values())} forwards; graph memory "
          f"{runner.graph_bytes / 2**30:.2f} GiB; allocated {torch.cuda.memory_allocated() / 2**30:.1f} GiB",
          flush=True)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        generate(model, prompts, None, config)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=24, max_name_column_width=70), flush=True)
    kernels = kernel_intervals(prof) if args.kernels_json or args.timeline else []
    if args.kernels_json:
        import json

        Path(args.kernels_json).write_text(json.dumps(kernels))
    if args.timeline:
        forwards = sum(len(v) for v in times.values())
        print(timeline_report(kernels, forwards), flush=True)
        host_profile(lambda: generate(model, prompts, None, config))
    return 0


def host_profile(decode, rows: int = 18) -> None:
    """The host functions of one more decode, by cumulative time (cProfile; a call that waits on the GPU shows
    the wait), and the decode's wall time."""
    import cProfile
    import pstats
    import time

    torch.cuda.synchronize()
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    decode()
    torch.cuda.synchronize()
    profiler.disable()
    print(f"host profile of one decode ({1000 * (time.perf_counter() - start):.1f} ms wall, cProfile on):", flush=True)
    pstats.Stats(profiler).sort_stats("cumulative").print_stats(rows)
    pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


KERNEL_KINDS = (("copy", ("Memcpy", "Memset")),
                ("matmul", ("gemm", "nvjet", "cutlass", "sm90_xmma", "splitk", "splitK")),
                ("attention", ("_partial_kernel", "_merge_kernel", "flash", "fmha", "sdpa", "attention")),
                ("generated", ("triton_",)))
"""Kernel kinds of :func:`timeline_report`, by substrings of the kernel name (first match wins; else ``other``)."""
LAUNCH_GAP_US = 20.0
"""Idle stretches up to this long count as gaps between the kernels of one recorded step; longer ones as host
time between steps."""


def kernel_kind(name: str) -> str:
    for kind, marks in KERNEL_KINDS:
        if any(mark in name for mark in marks):
            return kind
    return "other"


def kernel_intervals(prof) -> list[tuple[str, float, float]]:
    """``(name, start_us, end_us)`` of every GPU kernel, copy and memset the profiler saw (graph replays included),
    by start."""
    out = [(event.name, float(event.time_range.start), float(event.time_range.end)) for event in prof.events()
           if event.device_type == torch.autograd.DeviceType.CUDA and event.time_range.elapsed_us() > 0]
    return sorted(out, key=lambda item: item[1])


def timeline_report(kernels: list[tuple[str, float, float]], forwards: int, unit: str = "forward") -> str:
    """Per forward (per ``unit``: what the ``forwards`` count counts): kernel time by kind, idle time between
    kernels (short gaps inside a step vs host time), and the kernel names that most often start after a gap, with
    their mean gap."""
    if not kernels:
        return "timeline: the profiler saw no kernels"
    by_kind: dict[str, float] = {}
    short_gap = long_gap = 0.0
    gaps_before: dict[str, list[float]] = {}
    durations: dict[str, list[float]] = {}
    long_gaps: list[tuple[float, float, str, str]] = []
    end, previous = kernels[0][1], ""
    for name, start, stop in kernels:
        kind = kernel_kind(name)
        by_kind[kind] = by_kind.get(kind, 0.0) + (stop - start)
        durations.setdefault(name, []).append(stop - start)
        gap = max(0.0, start - end)
        if gap <= LAUNCH_GAP_US:
            short_gap += gap
            gaps_before.setdefault(name, []).append(gap)
        else:
            long_gap += gap
            long_gaps.append((gap, end - kernels[0][1], previous, name))
        end, previous = max(end, stop), name
    span = end - kernels[0][1]
    per = 1000.0 * forwards
    lines = [f"timeline over {forwards} {unit}s, {len(kernels) / forwards:.0f} kernels per {unit}: "
             f"span {span / per:.3f} ms per {unit}"]
    for kind in sorted(by_kind, key=by_kind.get, reverse=True):
        lines.append(f"  {kind:10s} {by_kind[kind] / per:7.3f} ms ({100 * by_kind[kind] / span:4.1f} %)")
    lines.append(f"  {'gaps<=' + str(int(LAUNCH_GAP_US)) + 'us':10s} {short_gap / per:7.3f} ms "
                 f"({100 * short_gap / span:4.1f} %; {short_gap / len(kernels):.2f} us per kernel)")
    lines.append(f"  {'host':10s} {long_gap / per:7.3f} ms ({100 * long_gap / span:4.1f} %)")
    worst = sorted(gaps_before.items(), key=lambda item: sum(item[1]), reverse=True)[:12]
    lines.append(f"  kernels after the most in-step idle time (count per {unit}, mean gap us, mean length us):")
    for name, gaps in worst:
        lines.append(f"    {len(gaps) / forwards:6.1f} x gap {sum(gaps) / len(gaps):5.2f} us, "
                     f"length {sum(durations[name]) / len(durations[name]):7.2f} us  {name[:90]}")
    lines.append("  longest host gaps (us, at ms from the first kernel, kernel before -> kernel after):")
    for gap, at, before, after in sorted(long_gaps, reverse=True)[:10]:
        lines.append(f"    {gap:9.1f} us at {at / 1000:8.2f} ms  {before[:50]} -> {after[:50]}")
    return "\n".join(lines)


def blocks(args, default: int) -> int | None:
    """``--max-blocks`` as ``SamplerConfig.max_blocks`` (0: every block)."""
    return default if args.max_blocks is None else (args.max_blocks or None)


def check_arguments(p, args) -> None:
    """One-line errors for options this run would ignore."""
    if args.gemm_only and (args.compile != "none" or args.cache or args.weights != "model"):
        p.error("--gemm-only times bare matmuls: --compile, --cache and --weights apply to the profiled decode")
    if (args.timeline or args.kernels_json) and args.gemm_only:
        p.error("--timeline and --kernels-json split a profiled decode; --gemm-only times bare matmuls")
    if args.kernels_json and not Path(args.kernels_json).resolve().parent.is_dir():
        p.error(f"--kernels-json: no folder {Path(args.kernels_json).resolve().parent} to write into")
    if not args.gemm_only and (args.rows is not None or len(args.batch) > 1 or args.libraries is not None):
        p.error("--rows, --libraries and several --batch sizes apply to --gemm-only; a profiled decode takes one "
                "batch size")
    if args.max_blocks is not None and (args.gemm_only or args.max_blocks < 0):
        p.error("--max-blocks takes a count >= 0 (0 = all) and applies to a profiled decode, not --gemm-only")
    if args.cache and args.family != "llada":
        p.error("--cache chooses LLaDA's Fast-dLLM cache; SDAR decodes with its block cache")


GEMM_SHAPES = {"llada": dict(hidden=4096, kv=4096, ffn=12288, layers=32),  # LLaDA-8B
               "sdar": dict(hidden=4096, kv=1024, ffn=12288, layers=36)}  # SDAR-8B: 8 KV heads of 128
"""``--gemm-only --family F``: the projection shapes of each family's 8B model."""


def blas(library: str):
    """``F.linear`` on one of PyTorch's BLAS libraries (a process-wide switch)."""

    def make():
        torch.backends.cuda.preferred_blas_library(library)
        return torch.nn.functional.linear

    return make


def inductor_tma():
    """``F.linear`` compiled with inductor's autotuned matmul templates, its persistent TMA kernel included."""
    torch.backends.cuda.preferred_blas_library("cublas")
    return torch.compile(torch.nn.functional.linear, dynamic=False,
                         options={"max_autotune": True, "triton.enable_persistent_tma_matmul": True})


MATMULS = {"cublas": blas("cublas"), "cublaslt": blas("cublaslt"), "inductor-tma": inductor_tma}
"""``--libraries``: name -> a function returning the ``linear`` to time."""


def gemm_fusion(rows: int, hidden: int = 4096, kv: int = 4096, ffn: int = 12288, layers: int = 32,
                lin=torch.nn.functional.linear) -> None:
    """One layer's projections at ``rows`` query rows (``kv`` = key/value width), x ``layers``: separate vs
    concatenated weights through ``lin`` (an ``F.linear``), each set timed as the replay of one CUDA graph."""
    dev, dt = torch.device("cuda"), torch.bfloat16
    x = torch.randn(rows, hidden, device=dev, dtype=dt)
    h = torch.randn(rows, ffn, device=dev, dtype=dt)
    # one set of weights per layer so that nothing stays in L2 between matmuls
    q, o = ([torch.randn(hidden, hidden, device=dev, dtype=dt) * 0.02 for _ in range(layers)] for _ in range(2))
    k, v = ([torch.randn(kv, hidden, device=dev, dtype=dt) * 0.02 for _ in range(layers)] for _ in range(2))
    gate, up = ([torch.randn(ffn, hidden, device=dev, dtype=dt) * 0.02 for _ in range(layers)] for _ in range(2))
    down = [torch.randn(hidden, ffn, device=dev, dtype=dt) * 0.02 for _ in range(layers)]
    qkv = [torch.cat([a, b, c]) for a, b, c in zip(q, k, v)]
    gate_up = [torch.cat([a, b]) for a, b in zip(gate, up)]
    weight_gb = layers * (2 * hidden * hidden + 2 * kv * hidden + 3 * hidden * ffn) * 2 / 1e9

    def ms(fn) -> float:
        return graph_us(fn, reps=3) / 1000

    rows_ms = {
        "q,k,v separate": ms(lambda: [lin(x, w) for i in range(layers) for w in (q[i], k[i], v[i])]),
        "qkv fused": ms(lambda: [lin(x, qkv[i]) for i in range(layers)]),
        "gate,up separate": ms(lambda: [lin(x, w) for i in range(layers) for w in (gate[i], up[i])]),
        "gate_up fused": ms(lambda: [lin(x, gate_up[i]) for i in range(layers)]),
        "o": ms(lambda: [lin(x, o[i]) for i in range(layers)]),
        "down": ms(lambda: [lin(h, down[i]) for i in range(layers)]),
    }
    widths = {"q,k,v separate": hidden + 2 * kv, "qkv fused": hidden + 2 * kv, "gate,up separate": 2 * ffn,
              "gate_up fused": 2 * ffn, "o": hidden, "down": hidden}
    print(f"projection matmuls at M={rows}, {layers} layers ({weight_gb:.1f} GB of weights):")
    for name, ms in rows_ms.items():
        depth = ffn if name == "down" else hidden
        tflops = 2 * rows * depth * widths[name] * layers / (ms * 1e-3) / 1e12
        print(f"  {name:18s} {ms:7.3f} ms  {tflops:6.0f} TFLOP/s")
    separate = rows_ms["q,k,v separate"] + rows_ms["gate,up separate"] + rows_ms["o"] + rows_ms["down"]
    fused = rows_ms["qkv fused"] + rows_ms["gate_up fused"] + rows_ms["o"] + rows_ms["down"]
    print(f"  all projections: separate {separate:.3f} ms, fused {fused:.3f} ms "
          f"({weight_gb / separate:.2f} / {weight_gb / fused:.2f} TB/s)", flush=True)


if __name__ == "__main__":
    sys.exit(main())
