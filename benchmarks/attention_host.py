#!/usr/bin/env python
"""Host (CPU) time of a block-diffusion training forward + backward, per attention backend.

BGPO's update on SDAR-8B left the GPU idle ~1.8 s longer per update with ``flex`` than with ``sdpa`` at copies of
~390 tokens (forty-second session, one H200), while both backends made the same synchronising calls (forty-third
session). This times the host side alone: a model of SDAR's layout and depth whose GPU work is tiny (hidden 64),
fed the ``[noisy ; clean]`` rows of a BGPO micro-batch (padded rows included), one forward + backward per
iteration. Per backend and block mode it reports

* ``host_ms``: the median time to enqueue one forward + backward (the GPU runs behind it), the host cost a real
  model hides only where its kernels take longer;
* ``wall_ms``: the mean time per iteration, synchronised once at the end;
* ``block_mask_ms`` (``flex``): the median host time of building one forward's ``BlockMask`` (a fresh layout per
  call, as every micro-batch builds one).

    python benchmarks/attention_host.py                        # 36 layers, 4 rows x 390 tokens per copy
    python benchmarks/attention_host.py --length 2170          # the recipe's length (2048 generated tokens)
    python benchmarks/attention_host.py --tiny                 # CPU smoke test: sdpa and eager (flex has no CPU backward)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.isdir(os.path.join(HERE, "..", "src", "dare")):  # this checkout's dare, installed or not
    sys.path.insert(0, os.path.join(HERE, "..", "src"))

import torch  # noqa: E402

from dare.algorithms.logprobs import denoiser_outputs  # noqa: E402
from dare.models.attention import build_layout  # noqa: E402
from dare.models.block_diffusion import two_copy_inputs  # noqa: E402
from dare.models.compile import compile_blocks  # noqa: E402
from dare.models.tiny import tiny_model  # noqa: E402

MODES = ("eager", "compiled")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def micro_batch(rows: int, length: int, device: torch.device, mask_id: int):
    """``(noisy, clean, attention_mask)``: random clean rows (ids below the mask id), the second half of each noisy row masked, and two
    left-padded rows (about 10 % and 3 % of the length), as BGPO's micro-batches of mixed prompt lengths are."""
    gen = torch.Generator().manual_seed(0)
    clean = torch.randint(0, mask_id, (rows, length), generator=gen).to(device)
    noisy = clean.clone()
    noisy[:, length // 2:] = mask_id
    mask = torch.ones(rows, length, dtype=torch.long)
    for row, share in ((1, 0.10), (3, 0.03)):
        if row < rows:
            mask[row, : max(1, int(length * share))] = 0
    return noisy, clean, mask.to(device)


def time_backend(backend: str, mode: str, args, device: torch.device) -> dict:
    torch.manual_seed(0)
    model = tiny_model("sdar", num_hidden_layers=args.layers, max_position_embeddings=4 * args.length,
                       dtype=torch.bfloat16 if device.type == "cuda" else torch.float32).to(device)
    if mode == "compiled":
        compile_blocks(model)
    noisy, clean, mask = micro_batch(args.batch, args.length, device, model.config.mask_token_id)

    def step():
        hidden = denoiser_outputs(model, noisy, clean, hidden=True, attn_backend=backend, attention_mask=mask)
        hidden.float().sum().backward()

    for _ in range(args.warmup):
        step()
    sync(device)
    host = []
    began = time.perf_counter()
    for _ in range(args.iters):
        start = time.perf_counter()
        step()
        host.append(time.perf_counter() - start)
    sync(device)
    wall = (time.perf_counter() - began) / args.iters
    result = {"backend": backend, "blocks": mode, "host_ms": statistics.median(host) * 1e3, "wall_ms": wall * 1e3}
    if backend == "flex":
        result["block_mask_ms"] = block_mask_ms(args, device, noisy, clean, mask, model.config.block_size)
    return result


def block_mask_ms(args, device: torch.device, noisy, clean, mask, block_size: int) -> float:
    """Median host time of one forward's ``BlockMask``: a fresh two-copy layout per call."""
    inputs = two_copy_inputs(noisy, clean, block_size, attention_mask=mask)
    kwargs = inputs.model_kwargs()
    rows, length = kwargs["input_ids"].shape
    samples = []
    for _ in range(args.warmup + args.iters):
        layout = build_layout(rows, length, length, device, attention_mask=kwargs["attention_mask"],
                              extra=kwargs["attention_rule"])
        start = time.perf_counter()
        layout.block_mask()
        samples.append(time.perf_counter() - start)
    sync(device)
    return statistics.median(samples[args.warmup:]) * 1e3


def print_table(results: list[dict]) -> None:
    print("| backend | blocks | host ms per forward + backward | wall ms | BlockMask host ms |")
    print("|---|---|---|---|---|")
    for r in results:
        mask = f"{r['block_mask_ms']:.2f}" if "block_mask_ms" in r else ""
        print(f"| {r['backend']} | {r['blocks']} | {r['host_ms']:.2f} | {r['wall_ms']:.2f} | {mask} |")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tiny", action="store_true", help="CPU smoke test: 2 layers, 16 tokens, sdpa and eager")
    p.add_argument("--device", help="default: cuda if available (cpu with --tiny)")
    p.add_argument("--layers", type=int, default=36, help="transformer layers (SDAR-8B: 36)")
    p.add_argument("--batch", type=int, default=4, help="rows per micro-batch (bd_rl_step's default: 4)")
    p.add_argument("--length", type=int, default=390, help="tokens per copy (prompt + generation)")
    p.add_argument("--backends", nargs="+", default=["sdpa", "flex"], choices=["sdpa", "flex", "eager"])
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="blocks eager and/or compiled")
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--json", help="write the results to this file")
    args = p.parse_args(argv)
    if min(args.layers, args.batch, args.iters) < 1 or args.length < 2 or args.warmup < 0:
        p.error("--layers, --batch and --iters take counts >= 1, --length >= 2 (a noisy half to mask), "
                "--warmup >= 0")
    if args.tiny:
        args.layers, args.length, args.batch, args.warmup, args.iters = 2, 16, 2, 1, 2
        args.backends, args.modes = ["sdpa", "eager"], ["eager"]
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not args.tiny else "cpu"))
    if device.type == "cpu" and "flex" in args.backends:
        p.error("flex has no backward pass on the CPU: run on a GPU or pass --backends sdpa eager")
    results = []
    for mode in args.modes:
        for backend in args.backends:
            results.append(time_backend(backend, mode, args, device))
            print(json.dumps(results[-1]), flush=True)
    print_table(results)
    report = {"device": str(device), "torch": torch.__version__, "layers": args.layers, "batch": args.batch,
              "length": args.length, "results": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
