#!/usr/bin/env python
"""Rollout throughput: naive decoding vs Fast-dLLM prefix/dual caches vs threshold parallel decoding.

GPU run (LLaDA-8B shape, random bf16 weights built on the GPU in seconds, ~5 minutes on one H200)::

    python benchmarks/rollout.py --json benchmarks/rollout_results.json

CPU smoke test (tiny model)::

    python benchmarks/rollout.py --tiny

``--family dream`` runs the same configurations on a Dream-7B-shaped model with the ``fastdllm_dream`` preset
(``--confidence neg_entropy`` gives Dream's own entropy confidence instead of the preset's probability).

What is measured, per batch size and generation length (block 32, greedy unless ``--temperature``, no early stop):

* ``naive``: full forward every step, one token per step (``steps = gen_length``): the LLaDA/Fast-dLLM
  baseline;
* ``prefix`` / ``dual``: the same schedule with Fast-dLLM's prefix / dual KV cache; ``dual/4``: the dual
  cache committing 4 tokens per step (``steps = gen_length / 4``);
* ``threshold``, ``prefix+threshold``, ``dual+threshold``: Fast-dLLM threshold decoding (tau = 0.9).

tokens/s counts generated tokens of the whole batch; ``x naive`` is the ratio to ``naive`` at the same
batch and length. Random weights give near-uniform predictions (top probability ~1e-3), so threshold
decoding would commit one token per step; ``--confident-fraction f`` injects confidence honestly and
visibly: at every forward a random fraction ``f`` of the positions gets its top logit raised by 20 (its
probability becomes ~1, above tau). Tokens per forward (TPF) is printed for every run. ``--max-blocks``
decodes only the first blocks of each generation (a time bound; conservative for ``prefix``, whose early
blocks carry the longest uncached suffix). The floor is the weights-only memory-bandwidth bound:
``nfe x (bytes of the weights read per forward) / measured HBM bandwidth``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402,F401
    LLADA_8B,
    ConfidenceInjection,
    ForwardShapes,
    Roofline,
    add_engine_arguments,
    apply_compile,
    build_dream,
    build_llada,
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

CONFIGS = {
    "naive": dict(cache="none", decoder="quota"),
    "prefix": dict(cache="prefix", decoder="quota"),
    "dual": dict(cache="dual", decoder="quota"),
    "dual/4": dict(cache="dual", decoder="quota", tokens_per_step=4),
    "threshold": dict(cache="none", decoder="threshold"),
    "prefix+threshold": dict(cache="prefix", decoder="threshold"),
    "dual+threshold": dict(cache="dual", decoder="threshold"),
}


class Family(NamedTuple):
    """A benchmarked model shape: its builder, its Fast-dLLM sampler preset, and the prompt ids drawn
    (``[0, prompt_ids)``: below every special token)."""

    build: Callable
    sampler: str
    prompt_ids: int


FAMILIES = {
    "llada": Family(build_llada, "fastdllm", 126000),
    "dream": Family(build_dream, "fastdllm_dream", 151000),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny model of the family on CPU (smoke test)")
    p.add_argument("--family", choices=list(FAMILIES), default="llada",
                   help="model shape and sampler preset: llada (LLaDA-8B, fastdllm) or dream (Dream-7B, "
                   "fastdllm_dream)")
    p.add_argument("--confidence", choices=["prob", "margin", "neg_entropy"],
                   help="confidence of the decoders (default: the preset's, prob)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature (default 0: greedy; > 0 draws, as RL rollouts do: engines then draw "
                   "from different random streams, so their tokens differ)")
    p.add_argument("--top-p", type=float, help="top-p filter of the sampling distribution (0 < p < 1)")
    p.add_argument("--device", help="default: cuda if available (cpu with --tiny)")
    p.add_argument("--batch", type=int, nargs="+", help="batch sizes (default 1 16; tiny: 1 4)")
    p.add_argument("--gen", type=int, nargs="+", help="generation lengths (default 256 512; tiny: 32 64)")
    p.add_argument("--block", type=int, help="block length (default 32; tiny: 8)")
    p.add_argument("--prompt-length", type=int, help="prompt tokens (default 128; tiny: 16)")
    p.add_argument("--threshold", type=float, default=0.9, help="threshold of the parallel decoder (0.9)")
    p.add_argument("--confident-fraction", type=float, default=0.25,
                   help="fraction of positions made confident at each forward (0 = raw random weights)")
    p.add_argument("--max-blocks", type=int, help="decode only the first N blocks (default 4; tiny: all)")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--lora-rank", type=int, help="wrap the model in LoRA adapters of this rank on the family's default "
                   "targets (alpha = 2 x rank), as an RL policy decodes (d1's recipe: 128); peft keeps the adapter "
                   "weights in fp32, so add --autocast to decode them in bf16 as the RL trainer does")
    p.add_argument("--fp32-weights", action="store_true",
                   help="keep the weights in fp32, as master weights (the weights floor stays that of bf16 weights; "
                   "the roofline counts the dtype the decode computes in); with --autocast they decode in bf16 as "
                   "the RL trainer's rollouts on one GPU without FSDP")
    p.add_argument("--autocast", action="store_true",
                   help="decode under bf16 autocast (the RL trainer's rollouts on one GPU)")
    p.add_argument("--budget-s", type=float, default=450.0, help="skip runs that would exceed this total time")
    add_engine_arguments(p)
    p.add_argument("--json", help="write all results to this file")
    args = p.parse_args(argv)
    tiny = args.tiny
    args.device = args.device or ("cpu" if tiny or not torch.cuda.is_available() else "cuda")
    args.engines = args.engines or default_engines(args.device)
    check_engine_arguments(p, args)
    if args.temperature < 0:
        p.error(f"--temperature must be >= 0, got {args.temperature}")
    if args.top_p is not None and not 0 < args.top_p < 1:
        p.error(f"--top-p must lie in (0, 1), got {args.top_p}")
    if args.lora_rank is not None and args.lora_rank < 1:
        p.error(f"--lora-rank must be >= 1, got {args.lora_rank}")
    args.batch = args.batch or ([1, 4] if tiny else [1, 16])
    args.gen = args.gen or ([32, 64] if tiny else [256, 512])
    args.block = args.block or (8 if tiny else 32)
    args.prompt_length = args.prompt_length or (16 if tiny else 128)
    if args.max_blocks is None and not tiny:
        args.max_blocks = 4
    return args


def build_model(family: str, tiny: bool, device: torch.device):
    """Tiny fp32 model of ``family``, or its real shape (LLaDA-8B, Dream-7B) with random bf16 weights initialised
    on ``device``."""
    from dare.models.tiny import tiny_model

    if tiny:
        return tiny_model(family, seed=0).to(device)
    return FAMILIES[family].build(device)


def inject_confidence(model, fraction: float, device: torch.device, margin: float = 20.0):
    """Raise the top logit by ``margin`` at a random ``fraction`` of the positions of every forward."""
    return ConfidenceInjection(model, fraction, device, margin).handle


def run_once(model, prompts, gen_length, args, overrides, max_blocks, engine="eager", weights="model"):
    from dare.rollout import SamplerConfig, generate

    overrides = dict(overrides)
    steps = gen_length // overrides.pop("tokens_per_step", 1)
    if args.confidence:
        overrides["confidence"] = args.confidence
    config = SamplerConfig(sampler=FAMILIES[args.family].sampler, gen_length=gen_length, block_length=args.block,
                           steps=steps, temperature=args.temperature, top_p=args.top_p, eos_early_stop=False,
                           max_blocks=max_blocks, engine=engine, weights=weights,
                           **threshold_setting(overrides["decoder"], args.threshold), **overrides)
    device = prompts.device
    sync(device)
    start = time.perf_counter()
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.autocast):
        out = generate(model, prompts, None, config)
    sync(device)
    seconds = time.perf_counter() - start
    decoded = int((out.step_map >= 0).sum())
    return out, decoded, seconds


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # tiny models: extra OpenMP threads only add contention
    t_start = time.perf_counter()
    model = build_model(args.family, args.tiny, device)
    vocab_hi = 256 if args.tiny else FAMILIES[args.family].prompt_ids  # prompt ids below every special token
    bandwidth, wbytes = weights_floor(model, device, t_start)
    if args.fp32_weights:  # after the floor: the decode still computes in bf16 (under --autocast)
        model.float()
    if args.lora_rank:
        from dare.models.lora import apply_lora

        model = apply_lora(model, r=args.lora_rank, alpha=2 * args.lora_rank)
    apply_compile(model, args)
    floor_forward = wbytes / bandwidth
    inject_confidence(model, args.confident_fraction, device)

    compute = torch.bfloat16 if args.autocast else next(model.parameters()).dtype  # fp32 weights: bf16 copies
    roofline = Roofline(model, bandwidth, matmul_rate(device, compute, 256 if args.tiny else 8192, 20),
                        element_size=compute.itemsize)
    results, records = [], []
    gen_cpu = torch.Generator().manual_seed(0)
    for batch in args.batch:
        for gen_length in args.gen:
            prompts = torch.randint(0, vocab_hi, (batch, args.prompt_length), generator=gen_cpu).to(device)
            blocks = gen_length // args.block
            measured_blocks = min(blocks, args.max_blocks) if args.max_blocks else blocks
            width = args.prompt_length + gen_length
            for name in args.configs:
                overrides = CONFIGS[name]
                if time.perf_counter() - t_start > args.budget_s:
                    print(f"skip  B={batch:<3d} G={gen_length:<4d} {name:<17s} (time budget spent)", flush=True)
                    continue
                warm = warm_seconds(lambda: run_once(model, prompts, gen_length, args, overrides, max_blocks=1), args)
                estimate = warm * measured_blocks
                elapsed = time.perf_counter() - t_start
                if elapsed + estimate > args.budget_s:
                    print(f"skip  B={batch:<3d} G={gen_length:<4d} {name:<17s} (estimated {estimate:.0f}s, "
                          f"{elapsed:.0f}s used of the {args.budget_s:.0f}s budget)", flush=True)
                    continue
                shapes = ForwardShapes(model)
                out, decoded, seconds = run_once(model, prompts, gen_length, args, overrides, measured_blocks)
                shapes.remove()
                cached = overrides["cache"] != "none"
                # a step reads the logits of its block's rows only
                forwards = [(b, w, width - w if cached else 0, min(w, args.block)) for b, w in shapes.shapes]
                floor = out.nfe * floor_forward
                row = dict(batch=batch, gen_length=gen_length, config=name, blocks=measured_blocks, nfe=out.nfe,
                           tokens=decoded, seconds=seconds, tokens_per_s=decoded / seconds,
                           tokens_per_forward=decoded / batch / out.nfe, floor_s=floor, gap_to_floor=seconds / floor)
                results.append(row)
                common = dict(family=args.family, sampler=FAMILIES[args.family].sampler, cache=overrides["cache"],
                              decoder=overrides["decoder"], batch=batch, gen_length=gen_length,
                              steps=gen_length // overrides.get("tokens_per_step", 1)
                              if overrides["decoder"] == "quota" else None, roofline=roofline,
                              forwards=forwards)
                records.append(engine_record(engine="eager", out=out, seconds=seconds, **common))
                print(f"run   B={batch:<3d} G={gen_length:<4d} {name:<17s} {row['tokens_per_s']:9.1f} tok/s  "
                      f"nfe={out.nfe:<4d} TPF={row['tokens_per_forward']:5.2f}  {seconds:7.2f}s  "
                      f"{row['gap_to_floor']:5.2f}x floor", flush=True)
                def timed(engine, weights):
                    fast, _, fast_s = run_once(model, prompts, gen_length, args, overrides, measured_blocks, engine,
                                               weights)
                    return fast, fast_s

                label = f"B={batch:<3d} G={gen_length:<4d} {name:<17s}"
                records += time_engines(model, args, timed, out, common, label)

    print_table(results, args)
    drawn = "greedy" if args.temperature == 0 else f"T {args.temperature:g}"
    drawn += f" top-p {args.top_p:g}" if args.top_p else ""
    print_engine_table(records, f"engines (prompt {args.prompt_length}, block {args.block}, {drawn}, confident "
                                f"fraction {args.confident_fraction}): tokens/s (ms per forward) [weights floor, roofline]")
    for record in records:  # settings of the decoded model that the engine records do not name
        record.update(lora_rank=args.lora_rank, autocast=args.autocast, confidence=args.confidence or "prob",
                      temperature=args.temperature, top_p=args.top_p)
    write_engine_records(args, bandwidth, wbytes, roofline, records)
    if args.json:
        Path(args.json).write_text(json.dumps(dict(args=vars(args), bandwidth=bandwidth, weight_bytes=wbytes,
                                                   results=results), indent=2) + "\n")
    print(f"total {time.perf_counter() - t_start:.1f}s", flush=True)
    return 0


def print_table(results, args) -> None:
    shapes = sorted({(r["batch"], r["gen_length"]) for r in results})
    if not shapes:
        return
    by = {(r["batch"], r["gen_length"], r["config"]): r for r in results}
    head = "| config | " + " | ".join(f"B={b} G={g}" for b, g in shapes) + " |"
    print("\ntokens/s (x naive) [gap to weights floor]; block", args.block, "threshold", args.threshold,
          "confident fraction", args.confident_fraction)
    print(head)
    print("|" + "---|" * (len(shapes) + 1))
    for name in args.configs:
        cells = []
        for b, g in shapes:
            r, base = by.get((b, g, name)), by.get((b, g, "naive"))
            if r is None:
                cells.append("skipped")
                continue
            ratio = f" ({r['tokens_per_s'] / base['tokens_per_s']:.2f}x)" if base else ""
            cells.append(f"{r['tokens_per_s']:.1f}{ratio} [{r['gap_to_floor']:.1f}x]")
        print(f"| {name} | " + " | ".join(cells) + " |")
    best = {}
    for (b, g, name), r in by.items():
        base = by.get((b, g, "naive"))
        if base and "threshold" in name and name != "threshold":
            best[(b, g)] = max(best.get((b, g), 0.0), r["tokens_per_s"] / base["tokens_per_s"])
    for (b, g), ratio in sorted(best.items()):
        verdict = "meets" if ratio >= 2.2 else "MISSES"
        print(f"B={b} G={g}: best cached+parallel = {ratio:.2f}x naive ({verdict} the 2.2x target)")


if __name__ == "__main__":
    sys.exit(main())
