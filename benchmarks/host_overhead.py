#!/usr/bin/env python
"""Host (CPU) cost of one training step's data path: collation, corruption, loss normalisers.

These run on the CPU before the step's GPU work (``Trainer.forward_backward``: ``source.batch`` ->
``algorithm.corrupt`` -> ``algorithm.totals``) and add to the step time unless they overlap with it. The
corruption loops over examples in Python on purpose: every example draws from its own generator so the noise
never depends on batching, ranks or resume. This measures whether that loop matters at realistic sizes.

    python benchmarks/host_overhead.py --out benchmarks/results/host_overhead_cpu.json
    python benchmarks/host_overhead.py --tiny        # seconds (test)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
if os.path.isdir(os.path.join(HERE, "..", "src", "dare")):  # this checkout's dare, installed or not
    sys.path.insert(0, os.path.join(HERE, "..", "src"))

import torch  # noqa: E402

from workload import fixed_workload, make_workload  # noqa: E402

MASK_ID, EOS_ID, PAD_ID = 126336, 126081, 126081  # LLaDA's ids (only their values' range matters here)


def timed(fn, repeats: int) -> tuple[float, object]:
    result = fn()  # warm-up (allocator, first-call costs)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3, result


def measure(name: str, workload, layout: str, args, micro_rows: int, mc: int = 1) -> list[dict]:
    from dare.algorithms import get_algorithm, resolve_algorithm_config
    from dare.diffusion import corrupt_mc, nelbo_weights
    from dare.models.spec import TokenIds
    from dare.trainer.sources import DatasetSource

    source = DatasetSource(workload.examples, batch_size=len(workload.examples), micro_batch_size=micro_rows,
                           shuffle=False, packing=layout == "packed", pack_length=args.pack_length, eos_id=EOS_ID,
                           pad_id=PAD_ID, eos_padding=False)
    algo = get_algorithm("sft")(resolve_algorithm_config("sft"), token_ids=TokenIds(mask=MASK_ID, eos=EOS_ID, pad=PAD_ID))
    ms_collate, micro = timed(lambda: source.batch(0), args.repeats)
    ms_corrupt, micro = timed(lambda: [algo.corrupt(mb.clone(), 0) for mb in micro], args.repeats)  # clone: tiny

    def global_totals():
        totals = {}
        for mb in micro:
            for key, value in algo.totals(mb).items():
                totals[key] = totals.get(key, 0) + value
        return totals

    ms_totals, totals = timed(global_totals, args.repeats)
    ms_weights, _ = timed(lambda: [nelbo_weights(mb["mask"], mb["p_mask"], mb["maskable"], mb["example_index"], totals)
                                   for mb in micro], args.repeats)
    common = {"workload": name, "layout": layout, "examples": len(workload.examples), "tokens": workload.tokens,
              "micro_batches": len(micro)}
    rows = [{**common, "stage": "collate", "ms": round(ms_collate, 2)},
            {**common, "stage": "corrupt", "ms": round(ms_corrupt, 2)},
            {**common, "stage": "totals", "ms": round(ms_totals, 2)},
            {**common, "stage": "weights", "ms": round(ms_weights, 2)}]  # on the GPU inside loss() in training
    if mc > 1:
        ms_mc, _ = timed(lambda: [corrupt_mc(mb["input_ids"], mb["maskable"], mb["example_index"], MASK_ID, seed=0,
                                             step=0, n=mc) for mb in micro], args.repeats)
        rows.append({**common, "stage": f"corrupt_mc(n={mc})", "ms": round(ms_mc, 2)})
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="small sizes (seconds)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (the trainer's host thread: 1)")
    parser.add_argument("--micro-rows", type=int, default=2, help="padded rows per SFT micro-batch")
    parser.add_argument("--rl-micro-rows", type=int, default=8, help="rows per RL micro-batch")
    parser.add_argument("--pack-length", type=int, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tiny = args.tiny
    args.pack_length = args.pack_length or (192 if tiny else 8192)
    sft = make_workload(384 if tiny else 16384, 8 if tiny else 64, 64 if tiny else 2048, vocab_limit=100_000)
    rl = fixed_workload(16 if tiny else 512, 64 if tiny else 1024, 16 if tiny else 256, vocab_limit=100_000)
    rows = []
    plan = (("sft", sft, ("padded", "packed"), args.micro_rows, 1), ("rl", rl, ("padded",), args.rl_micro_rows, 4))
    for name, workload, layouts, micro_rows, mc in plan:
        for layout in layouts:
            for row in measure(name, workload, layout, args, micro_rows, mc):
                rows.append(row)
                print(f"{row['workload']:4} {row['layout']:7} {row['examples']:4} ex {row['tokens']:7} tok "
                      f"{row['micro_batches']:4} mb  {row['stage']:17} {row['ms']:9.2f} ms", flush=True)
    report = {"device": "cpu", "threads": args.threads, "torch": torch.__version__, "repeats": args.repeats,
              "rows": rows}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
