#!/usr/bin/env python
"""Block-diffusion rollout throughput: cached block decoding vs full recompute (SDAR-8B shape).

GPU run (SDAR-8B shape, random bf16 weights built on the GPU in seconds, time-bounded to < 4 minutes on one
H200)::

    python benchmarks/bd_rollout.py --json bd_rollout.json

CPU smoke test (tiny SDAR)::

    python benchmarks/bd_rollout.py --tiny

What is measured, per batch size (block 4, 4 denoising steps per block, greedy, no early stop, generation
length 256), for the ``sdar`` sampler:

* ``static`` (``low_confidence_static``: one token per step) and ``dynamic`` (``low_confidence_dynamic``,
  threshold 0.9) selection;
* ``cache=block``: prompt and finished blocks cached exactly; every step runs the 4 tokens of the current
  block (the first step of a block also stores the previous block, 8 tokens);
* ``cache=none``: every step recomputes prompt + finished blocks + current block (LLaDA2's reference
  ``generate``).

Both modes run the same number of forwards (``nfe``) and, up to bf16 rounding, commit the same tokens
(``same_tokens`` is printed: the fraction of equal completion tokens). ``x recompute`` is the throughput
ratio of the cached mode to full recompute at the same decoder and batch. Random weights give near-uniform
predictions, so the dynamic threshold would never fire; ``--confident-fraction f`` (default 0.5) raises the
top logit of a random fraction ``f`` of the positions by 20 at every forward (their probability becomes
~1, above the threshold), and tokens per forward (TPF) is printed (SDAR reports dynamic decoding at > 2x the
speed of static decoding with block 4). The floor is the weights-only
memory-bandwidth bound ``nfe x weight bytes / HBM bandwidth``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    ForwardShapes,
    Roofline,
    add_engine_arguments,
    apply_compile,
    build_sdar,
    check_engine_arguments,
    default_engines,
    engine_record,
    matmul_rate,
    print_engine_table,
    sync,
    threshold_setting,
    time_engines,
    warm_seconds,
    weights_floor,
    write_engine_records,
)
from rollout import inject_confidence  # noqa: E402  (benchmarks/rollout.py)

DECODERS = {"static": "quota", "dynamic": "dynamic"}
CACHES = ("none", "block")  # recompute first: the cached run is compared with it


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny SDAR on CPU (smoke test)")
    p.add_argument("--device", help="default: cuda if available (cpu with --tiny)")
    p.add_argument("--batch", type=int, nargs="+", help="batch sizes (default 1 16; tiny: 1 4)")
    p.add_argument("--gen", type=int, help="generation length (default 256; tiny: 16)")
    p.add_argument("--prompt-length", type=int, help="prompt tokens (default 130; tiny: 6); not a multiple of the "
                   "block, so the first decode block starts with prompt tokens")
    p.add_argument("--block", type=int, default=4, help="block length (4)")
    p.add_argument("--steps", type=int, default=4, help="denoising steps per block (4)")
    p.add_argument("--threshold", type=float, default=0.9, help="threshold of the dynamic decoder (0.9)")
    p.add_argument("--confident-fraction", type=float, default=0.5,
                   help="fraction of positions made confident at each forward (0 = raw random weights)")
    p.add_argument("--decoders", nargs="+", default=list(DECODERS), choices=list(DECODERS))
    p.add_argument("--caches", nargs="+", default=list(CACHES), choices=list(CACHES),
                   help="cache modes (default: none block; ratios need both)")
    p.add_argument("--budget-s", type=float, default=200.0, help="skip runs that would exceed this total time")
    add_engine_arguments(p)
    p.add_argument("--json", help="write all results to this file")
    args = p.parse_args(argv)
    args.device = args.device or ("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    args.engines = args.engines or default_engines(args.device)
    check_engine_arguments(p, args)
    args.batch = args.batch or ([1, 4] if args.tiny else [1, 16])
    args.gen = args.gen or (16 if args.tiny else 256)
    args.prompt_length = args.prompt_length or (6 if args.tiny else 130)
    return args


def build_model(tiny: bool, device: torch.device):
    """Tiny fp32 SDAR, or an SDAR-8B-shaped model with random N(0, 0.02) bf16 weights initialised on ``device``."""
    from dare.models.tiny import tiny_model

    if tiny:
        return tiny_model("sdar", seed=0).to(device)
    return build_sdar(device)


def run_once(model, prompts, args, decoder: str, cache: str, max_blocks: int | None = None, engine: str = "eager",
             weights: str = "model"):
    """One timed rollout; the confidence injection restarts its random stream, so both cache modes see the same
    injected logits."""
    from dare.rollout import SamplerConfig, generate

    hook = inject_confidence(model, args.confident_fraction, prompts.device)

    config = SamplerConfig(sampler="sdar", gen_length=args.gen, block_length=args.block, block_steps=args.steps,
                           decoder=DECODERS[decoder], **threshold_setting(DECODERS[decoder], args.threshold),
                           cache=cache, temperature=0.0,
                           eos_early_stop=False, max_blocks=max_blocks, engine=engine, weights=weights)
    device = prompts.device
    sync(device)
    start = time.perf_counter()
    out = generate(model, prompts, None, config)
    sync(device)
    seconds = time.perf_counter() - start
    if hook is not None:
        hook.remove()
    return out, seconds


def _forwards(shapes, args, cache: str) -> list[tuple[int, int, int, int]]:
    """(batch, query tokens, cached keys attended, logit rows) of each forward: with the block cache a query of
    ``w`` tokens ending at column ``e`` attends ``e - w`` cached keys (the query's end is tracked from the block
    grid); a step reads the logits of one block's rows."""
    if cache == "none":
        return [(b, w, 0, min(w, args.block)) for b, w in shapes]
    forwards, end = [], 0
    for b, w in shapes:
        if w > args.block:  # a block's first forward: prompt prefix (first block) or previous + current block
            end = w if end == 0 else end + args.block
        forwards.append((b, w, max(end - w, 0), min(w, args.block)))
    return forwards


def estimate(warm_s: float, warm_blocks: int, args, cache: str) -> float:
    """Seconds of a full run from a warm-up of ``warm_blocks`` blocks (full recompute grows with the prefix)."""
    blocks = -(-(args.prompt_length % args.block + args.gen) // args.block)
    per_block = warm_s / warm_blocks
    if cache == "none":
        warm_prefix = args.prompt_length + warm_blocks * args.block / 2
        per_block *= (args.prompt_length + args.gen / 2) / warm_prefix
    return per_block * blocks


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # tiny models: extra OpenMP threads only add contention
    t_start = time.perf_counter()
    model = build_model(args.tiny, device)
    vocab_hi = 256 if args.tiny else 151000  # prompt ids below every special token
    bandwidth, wbytes = weights_floor(model, device, t_start)
    apply_compile(model, args)
    floor_forward = wbytes / bandwidth

    roofline = Roofline(model, bandwidth, matmul_rate(device, next(model.parameters()).dtype,
                                                       256 if args.tiny else 8192, 20))
    results, records = [], []
    gen_cpu = torch.Generator().manual_seed(0)
    warm_blocks = 2
    for batch in args.batch:
        prompts = torch.randint(0, vocab_hi, (batch, args.prompt_length), generator=gen_cpu).to(device)
        for decoder in args.decoders:
            reference = None
            for cache in [c for c in CACHES if c in args.caches]:
                label = f"B={batch:<3d} {decoder:<8s} cache={cache:<6s}"
                warm = warm_seconds(lambda: run_once(model, prompts, args, decoder, cache, max_blocks=warm_blocks), args)
                guess = estimate(warm, warm_blocks, args, cache)
                elapsed = time.perf_counter() - t_start
                if elapsed + guess > args.budget_s:
                    print(f"skip  {label} (estimated {guess:.0f}s, {elapsed:.0f}s used of the {args.budget_s:.0f}s "
                          "budget)", flush=True)
                    continue
                shapes = ForwardShapes(model)
                out, seconds = run_once(model, prompts, args, decoder, cache)
                shapes.remove()
                forwards = _forwards(shapes.shapes, args, cache)
                decoded = int((out.step_map >= 0).sum())
                same = None
                if reference is not None:
                    same = float((out.completion == reference.completion).float().mean())
                    same = True if same == 1.0 else same
                if cache == "none":
                    reference = out
                row = dict(batch=batch, gen_length=args.gen, decoder=decoder, cache=cache, nfe=out.nfe,
                           tokens=decoded, seconds=seconds, tokens_per_s=decoded / seconds,
                           tokens_per_forward=decoded / batch / out.nfe, floor_s=out.nfe * floor_forward,
                           gap_to_floor=seconds / (out.nfe * floor_forward), same_tokens=same)
                results.append(row)
                print(f"run   {label} {row['tokens_per_s']:9.1f} tok/s  nfe={out.nfe:<4d} "
                      f"TPF={row['tokens_per_forward']:5.2f}  {seconds:7.2f}s  {row['gap_to_floor']:5.2f}x floor"
                      + ("" if same is None else f"  same tokens: {same}"), flush=True)
                common = dict(family="sdar", sampler="sdar", cache=cache, decoder=DECODERS[decoder], batch=batch,
                              gen_length=args.gen, steps=args.steps, roofline=roofline, forwards=forwards)
                records.append(engine_record(engine="eager", out=out, seconds=seconds, **common))
                timed = lambda e, w: run_once(model, prompts, args, decoder, cache, engine=e, weights=w)  # noqa: E731
                records += time_engines(model, args, timed, out, common, label)

    print_table(results, args)
    print_engine_table(records, f"engines (SDAR, block {args.block}, {args.steps} steps, prompt {args.prompt_length}, "
                                f"greedy): tokens/s (ms per forward) [weights floor, roofline]")
    write_engine_records(args, bandwidth, wbytes, roofline, records)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(args=vars(args), bandwidth=bandwidth, weight_bytes=wbytes,
                                                   results=results), indent=2) + "\n")
    print(f"total {time.perf_counter() - t_start:.1f}s", flush=True)
    return 0


def print_table(results, args) -> None:
    if not results:
        return
    by = {(r["batch"], r["decoder"], r["cache"]): r for r in results}
    batches = sorted({r["batch"] for r in results})
    print(f"\ntokens/s (x recompute) [TPF, gap to weights floor]; block {args.block}, {args.steps} steps, "
          f"gen {args.gen}, prompt {args.prompt_length}, threshold {args.threshold}, "
          f"confident fraction {args.confident_fraction}")
    print("| decoder | cache | " + " | ".join(f"B={b}" for b in batches) + " |")
    print("|---|---|" + "---|" * len(batches))
    for decoder in args.decoders:
        for cache in CACHES:
            cells = []
            for b in batches:
                r, base = by.get((b, decoder, cache)), by.get((b, decoder, "none"))
                if r is None:
                    cells.append("skipped")
                    continue
                ratio = ""
                if base and cache != "none":
                    ratio = f" ({r['tokens_per_s'] / base['tokens_per_s']:.2f}x recompute)"
                tpf, gap = r["tokens_per_forward"], r["gap_to_floor"]
                cells.append(f"{r['tokens_per_s']:.1f}{ratio} [{tpf:.2f}, {gap:.1f}x]")
            print(f"| {decoder} | {cache} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
