#!/usr/bin/env python
"""Cost of torch's CPU threads on the demo's tiny model: 1 vs 2 threads, alone and next to busy processes.

The demo's model (4 layers, width 128) runs on small tensors: one training forward + backward over 128 rollouts
of ~24 tokens is a few hundred ops of a millisecond or less each. With 2 OpenMP threads each op is split in two
and both threads meet at a barrier after every op; when the cores are shared with other busy processes, one of the
two threads is often descheduled, and the other spins (burning CPU) or sleeps until it comes back. This measures
wall time and process CPU time (all threads) per call, in a fresh process per thread count
(``OMP_NUM_THREADS=T``), with ``--load N`` busy-looping processes beside it.

    python benchmarks/cpu_threads.py --load 0 --load 2 --passive --json benchmarks/results/cpu_threads_cpu.json
    python benchmarks/cpu_threads.py --smoke        # seconds
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "src")


def busy(stop) -> None:  # one process that keeps a core busy (pure Python, no threads)
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x += 1


def child(args) -> dict:
    """Runs in the measured process: time forward+backward and a no-grad forward of the demo-sized LLaDA."""
    import torch

    sys.path.insert(0, SRC)
    from dare.models.tiny import tiny_model

    torch.manual_seed(0)
    model = tiny_model("llada", n_layers=args.layers, d_model=args.hidden, n_heads=4, n_kv_heads=4,
                       mlp_hidden_size=2 * args.hidden).train()
    ids = torch.randint(0, 256, (args.rows, args.length))

    def train_step():
        model(ids).logits.float().logsumexp(-1).mean().backward()

    def decode_step():
        with torch.no_grad():
            model(ids)

    out = {"threads": torch.get_num_threads()}
    for name, fn in (("forward_backward", train_step), ("decode_forward", decode_step)):
        fn()  # warm-up
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.repeats):
            fn()
        out[name] = {"wall_ms": 1e3 * (time.perf_counter() - wall) / args.repeats,
                     "cpu_ms": 1e3 * (time.process_time() - cpu) / args.repeats}
    return out


def measure(args, threads: int, load: int, policy: str | None = None) -> dict:
    stop = multiprocessing.Event()
    hogs = [multiprocessing.Process(target=busy, args=(stop,), daemon=True) for _ in range(load)]
    for hog in hogs:
        hog.start()
    try:
        cmd = [sys.executable, __file__, "--child", "--rows", str(args.rows), "--length", str(args.length),
               "--layers", str(args.layers), "--hidden", str(args.hidden), "--repeats", str(args.repeats)]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
        if policy:
            env["OMP_WAIT_POLICY"] = policy
        result = json.loads(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout)
    finally:
        stop.set()
        for hog in hogs:
            hog.join()
    return {"load": load, "wait_policy": policy or "default", **result}


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, action="append", help="thread counts (default 1 and 2)")
    parser.add_argument("--load", type=int, action="append", help="busy processes beside it (default 0 and 2)")
    parser.add_argument("--passive", action="store_true",
                        help="also run 2 threads with OMP_WAIT_POLICY=passive (waiting threads sleep, never spin)")
    parser.add_argument("--rows", type=int, default=128, help="batch rows (demo: 16 prompts x 8 rollouts)")
    parser.add_argument("--length", type=int, default=24, help="tokens per row (demo: ~16 prompt + 8 answer)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="tiny shape, 2 repeats, no load (seconds)")
    parser.add_argument("--json", help="write the records here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args)))
        return None
    if args.smoke:
        args.rows, args.length, args.layers, args.hidden, args.repeats, args.load = 4, 8, 1, 32, 2, [0]
    variants = [(t, None) for t in (args.threads or [1, 2])] + ([(2, "passive")] if args.passive else [])
    records = [measure(args, t, n, policy) for n in (args.load or [0, 2]) for t, policy in variants]
    print("| busy processes beside | threads | OMP_WAIT_POLICY | fwd+bwd wall ms | fwd+bwd CPU ms | decode wall ms | "
          "decode CPU ms |")
    print("|---|---|---|---|---|---|---|")
    for r in records:
        fb, dec = r["forward_backward"], r["decode_forward"]
        print(f"| {r['load']} | {r['threads']} | {r['wait_policy']} | {fb['wall_ms']:.1f} | {fb['cpu_ms']:.1f} | "
              f"{dec['wall_ms']:.1f} | {dec['cpu_ms']:.1f} |")
    report = {"benchmark": "cpu_threads", "shape": vars(args), "records": records}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
