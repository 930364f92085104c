#!/usr/bin/env python
"""Longest trainable sequence of an LLaDA-8B-shaped full fine-tune on one GPU (SP=1), and the per-rank memory of
sequence parallelism (SP=P) at the same shapes, for the projection in RESULTS.md.

What one measurement is. One SFT step of one row of ``T`` tokens (prompt ``T/8``, the rest maskable) through the
real code: ``SFT.corrupt`` / ``totals`` / ``backward`` (masked-diffusion NELBO, :func:`masked_logprobs` with the
chunked LM head, ``--logits-chunk`` rows per chunk), activation checkpointing of every block, ``sdpa`` attention
(one unpadded row: no mask, the flash kernel), then the AdamW step (fused on CUDA, ``build_optimizer``). Master
weights ``--master-dtype`` (float32 + bf16 autocast: ``dare train``'s default on one GPU; or bfloat16 weights,
gradients and moments). Before the step the AdamW moments and the gradients are allocated, so

* ``static`` = ``torch.cuda.memory_allocated`` then (weights + gradients + moments),
* ``activation`` = peak during forward + backward - static (saved block inputs, one block's recompute, the
  head chunks, attention work space),
* ``optimizer`` = peak during ``optimizer.step()`` - static.

Why fewer layers. A 32-layer 8B model with fp32 master weights needs 16 bytes/parameter = 128 GB before any
activation, so the ladder is measured on ``--fit-layers`` (default 1 and 2) blocks with the full-size embedding and
LM head. Every term is linear in the block count ``n`` (``static``: parameters; ``activation`` with checkpointing:
one saved block input per block plus a block-independent working set; ``optimizer``: per parameter), so two block
counts give intercept and slope per length, and the prediction for ``--target-layers`` (32) is
``static(32) + max(activation(32, T), optimizer(32))``. The longest ``T`` whose prediction fits in the device
memory minus ``--reserve-gib`` (CUDA context, allocator fragmentation: not in ``memory_allocated``) is interpolated
linearly between the ladder points around it (extrapolated from the last two when the time budget ends the ladder
first: memory is affine in ``T``). ``--verify`` then builds the real 32-layer model and measures the
largest ladder length predicted to fit (when the time budget allows), to check the extrapolation.

Sequence parallelism without a second GPU. One rank of an SP=P group runs ``T/P`` positions through every
token-wise layer and, inside attention, ``H/P`` heads over all ``T`` positions. ``--degree P`` runs exactly those
shapes on one GPU through the real sharded code path (``model(..., sequence_parallel=...)`` and
:func:`sharded_logprobs`) with a loopback exchange (:class:`Loopback`: the all-to-alls are replaced by local
copies of the right shapes; numerics are meaningless, memory and FLOPs are rank 0's). The per-rank projection of
SP=P over ``P`` GPUs (FSDP2 over the same ``P`` ranks) is ``static / P`` (sharded weights, gradients, moments) +
the FSDP2 gather buffers (bf16: the root = embedding + LM head, kept from forward to backward, plus two blocks in
flight) + the measured per-rank activation, fitted over blocks as above. NCCL's all-to-all buffers (a few
``T/P x d_model`` tensors) are not included.

GPU (one H200, ~5 minutes; JSON via --json):
    python benchmarks/seq_len.py --json benchmarks/results/seq_len_h200.json
CPU smoke test (seconds; memory is not measured on the CPU):
    python benchmarks/seq_len.py --smoke --json /tmp/seq_len.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
if os.path.isdir(os.path.join(HERE, "..", "src", "dare")):  # this checkout's dare, installed or not
    sys.path.insert(0, os.path.join(HERE, "..", "src"))
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch  # noqa: E402

from common import LLADA_8B, build_llada, sync  # noqa: E402

from dare.distributed.sequence import SequenceParallel  # noqa: E402

GIB = 2**30
SMOKE_SHAPE = dict(d_model=64, n_heads=8, n_kv_heads=8, mlp_hidden_size=128, vocab_size=512, embedding_size=512,
                   mask_token_id=500, eos_token_id=501, pad_token_id=501)


class Loopback(SequenceParallel):
    """The last rank of a sequence-parallel group of ``degree`` on one device (it holds response tokens only, so it
    runs the most LM-head chunks): the shapes of the Ulysses exchange without communication (other ranks' shards are
    stand-in copies of this rank's), for memory and FLOP measurements."""

    def __init__(self, degree: int):
        super().__init__(group=None, degree=degree, rank=degree - 1)

    def to_heads(self, q, k, v):
        self.check_heads(q.shape[1])
        if k.shape[1] % self.degree:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        return tuple(t[:, : t.shape[1] // self.degree].repeat(1, 1, self.degree, 1) for t in (q, k, v))

    def to_sequence(self, out):
        return out[:, :, : out.shape[2] // self.degree].repeat(1, self.degree, 1, 1)

    def sum_shards(self, tensor):
        return tensor


def log(message: str = "") -> None:
    print(message, flush=True)


def sft_batch(length: int, vocab: int, seed: int = 0):
    """One row of ``length`` random tokens: prompt ``length / 8``, the rest maskable (a DatasetSource row)."""
    from tensordict import TensorDict

    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, min(vocab, 32000), (1, length), generator=gen)
    maskable = torch.zeros(1, length, dtype=torch.bool)
    maskable[:, length // 8:] = True
    ones = torch.ones(1, length, dtype=torch.long)
    return TensorDict({"input_ids": ids, "maskable": maskable, "attention_mask": ones,
                       "example_index": torch.zeros(1, length, dtype=torch.long)}, batch_size=[1])


def measure(args, device: torch.device, layers: int, length: int, degree: int, master_dtype: torch.dtype) -> dict:
    """One SFT step (see the module docstring) of a ``layers``-block model on one ``length``-token row."""
    from dare.algorithms.sft import SFT, SFTConfig
    from dare.distributed import autocast_context
    from dare.models.spec import family_of
    from dare.trainer.config import OptimConfig
    from dare.trainer.optim import build_optimizer

    record = {"layers": layers, "length": length, "degree": degree, "master_dtype": str(master_dtype).split(".")[-1]}
    model = optimizer = None
    try:
        shape = {**(SMOKE_SHAPE if args.smoke else {}), "n_layers": layers}
        model = build_llada(device, dtype=master_dtype, **shape).train()
        model.gradient_checkpointing_enable()
        model.attn_backend = "sdpa"
        algorithm = SFT(SFTConfig(), token_ids=family_of(model).token_ids(model.config), attn_backend="sdpa",
                        logits_chunk_size=args.logits_chunk)
        algorithm.bind_model(model)
        if degree > 1:
            algorithm.sequence_parallel = Loopback(degree)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = build_optimizer(params, OptimConfig(lr=1e-6))
        for p in params:  # moments and gradients allocated up front: the steady-state footprint of a run
            p.grad = torch.zeros_like(p)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        batch = algorithm.corrupt(sft_batch(length, model.config.vocab_size), 0)
        totals = {k: v.to(device) for k, v in algorithm.totals(batch).items()}
        batch = batch.to(device)
        sync(device)
        cuda = device.type == "cuda"
        static = torch.cuda.memory_allocated(device) if cuda else None
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        start = time.perf_counter()
        with autocast_context("auto", device):
            algorithm.backward(model, batch, totals)
        sync(device)
        record["step_s"] = round(time.perf_counter() - start, 3)
        if cuda:
            record["activation_gib"] = (torch.cuda.max_memory_allocated(device) - static) / GIB
            torch.cuda.reset_peak_memory_stats(device)
        optimizer.step()
        sync(device)
        if cuda:
            record["optimizer_gib"] = (torch.cuda.max_memory_allocated(device) - static) / GIB
            record["static_gib"] = static / GIB
        record["params"] = sum(p.numel() for p in params)
    except torch.cuda.OutOfMemoryError:
        record["oom"] = True
    finally:
        del model, optimizer
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return record


def linear_fit(points: list[dict], key: str) -> tuple[float, float] | None:
    """Intercept and per-block slope of ``key`` over the measured block counts (least squares; None if missing)."""
    pts = [(p["layers"], p[key]) for p in points if p.get(key) is not None]
    if len({n for n, _ in pts}) < 2:
        return None
    n = torch.tensor([float(a) for a, _ in pts], dtype=torch.float64)
    y = torch.tensor([float(b) for _, b in pts], dtype=torch.float64)
    slope = float(((n - n.mean()) * (y - y.mean())).sum() / ((n - n.mean()) ** 2).sum())
    return float(y.mean()) - slope * float(n.mean()), slope


def fsdp_buffers_gib(shape: dict, layers: int) -> float:
    """FSDP2 bf16 gather buffers per rank: the root (embedding + LM head) from forward to backward, two blocks."""
    d, mlp, vocab = shape["d_model"], shape["mlp_hidden_size"], shape["embedding_size"]
    block = 4 * d * d + 3 * d * mlp + 2 * d
    root = 2 * vocab * d + d
    return 2 * (root + 2 * block) / GIB if layers else 0.0


def predict(points: list[dict], target_layers: int, world: int, shape: dict) -> dict | None:
    """Predicted per-rank peak of ``target_layers`` blocks from measurements at fewer blocks (one length)."""
    fits = {key: linear_fit(points, key) for key in ("static_gib", "activation_gib", "optimizer_gib")}
    if any(f is None for f in fits.values()):
        return None
    value = {key: a + b * target_layers for key, (a, b) in fits.items()}
    static = value["static_gib"] / world + (fsdp_buffers_gib(shape, target_layers) if world > 1 else 0.0)
    peak = static + max(value["activation_gib"], value["optimizer_gib"] / world)
    return {"static_gib": static, "activation_gib": value["activation_gib"],
            "optimizer_gib": value["optimizer_gib"] / world, "peak_gib": peak,
            "activation_per_block_gib": fits["activation_gib"][1]}


def longest_fitting(rows: list[dict], capacity: float) -> tuple[float | None, str]:
    """Longest length whose predicted peak fits ``capacity`` and how it was found: ``interpolated`` between the
    ladder points around the crossing, or ``extrapolated`` linearly from the last two points when the ladder
    (cut by the time budget) never crosses - memory is affine in the length (flash attention keeps no ``T x T``
    state). ``(None, "none fits")`` when even the shortest length does not fit."""
    rows = sorted(rows, key=lambda r: r["length"])
    fitting = [r for r in rows if r["peak_gib"] <= capacity]
    if not fitting:
        return None, "none fits"
    best = fitting[-1]
    above = [r for r in rows if r["length"] > best["length"]]
    if above:
        lo, hi, how = best, above[0], "interpolated"
    elif len(rows) >= 2:
        lo, hi, how = rows[-2], rows[-1], "extrapolated"
    else:
        return float(best["length"]), "single point"
    slope = (hi["peak_gib"] - lo["peak_gib"]) / (hi["length"] - lo["length"])
    if slope <= 0:
        return float(best["length"]), "last fitting point"
    return lo["length"] + (capacity - lo["peak_gib"]) / slope, how


def ladder(args, device, degree: int, master_dtype, lengths: list[int], capacity: float, shape: dict,
           deadline: float, report: dict) -> list[dict]:
    """Measure every length at each fit block count until the prediction exceeds the capacity (or time is up)."""
    rows, last = [], None
    for length in lengths:
        # model builds cost the same at every length; attention makes the steps grow ~(length ratio)^2
        expected = 0.0 if last is None else last[1] + last[2] * (length / last[0]) ** 2
        if time.perf_counter() + expected > deadline:
            log(f"  time budget: T={length} skipped (~{expected:.0f}s expected)")
            break
        started = time.perf_counter()
        points = [measure(args, device, n, length, degree, master_dtype) for n in args.fit_layers]
        steps = sum(p.get("step_s", 0.0) for p in points)
        last = (length, time.perf_counter() - started - steps, steps)
        report["measurements"].extend(points)
        if any(p.get("oom") for p in points):
            log(f"  T={length:>8}: out of memory already at {args.fit_layers} blocks")
            break
        pred = predict(points, args.target_layers, degree, shape)
        if pred is None:  # CPU: no memory statistics
            log(f"  T={length:>8}: steps {steps:.2f}s (no memory statistics on {device.type})")
            continue
        rows.append({"length": length, **pred})
        log(f"  T={length:>8}: activation {pred['activation_gib']:7.2f} GiB "
            f"({pred['activation_per_block_gib'] * 1024:6.1f} MiB/block), static {pred['static_gib']:7.2f} GiB, "
            f"predicted peak {pred['peak_gib']:7.2f} GiB of {capacity:.1f}  [{steps:.1f}s]")
        if pred["peak_gib"] > capacity:
            break
    return rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="CPU smoke run: d_model-64 model, short rows")
    parser.add_argument("--json", default=None, help="write the results JSON here")
    parser.add_argument("--fit-layers", default="1,2", help="block counts measured per length (>= 2 values)")
    parser.add_argument("--target-layers", type=int, default=32, help="block count predicted (LLaDA-8B: 32)")
    parser.add_argument("--lengths", default=None, help="SP=1 ladder (default 4k..256k doubling; smoke 64,128)")
    parser.add_argument("--degree", type=int, default=8, help="sequence-parallel degree to project (1 = skip)")
    parser.add_argument("--sp-lengths", default=None,
                        help="total row lengths of the SP ladder (default 32k..512k doubling; smoke 64,128)")
    parser.add_argument("--master-dtype", default="float32,bfloat16",
                        help="master weight dtypes to measure, in order (float32 = bf16 autocast over fp32 weights)")
    parser.add_argument("--logits-chunk", type=int, default=2048, help="LM-head rows per chunk")
    parser.add_argument("--reserve-gib", type=float, default=3.0,
                        help="device memory kept free for the CUDA context and allocator fragmentation")
    parser.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True,
                        help="measure the full target-layer model at the longest ladder length predicted to fit")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds for the whole run (270; smoke 120)")
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available; smoke: cpu)")
    args = parser.parse_args(argv)
    args.fit_layers = [int(x) for x in args.fit_layers.split(",")]
    if len(set(args.fit_layers)) < 2:
        parser.error("--fit-layers needs at least two different block counts")
    if args.smoke:
        args.lengths = args.lengths or "64,128"
        args.sp_lengths = args.sp_lengths or "64,128"
        args.target_layers = min(args.target_layers, 4)
    k = 1024
    args.lengths = [int(x) for x in (args.lengths or ",".join(str(k * 2**i) for i in range(2, 9))).split(",")]
    args.sp_lengths = [int(x) for x in (args.sp_lengths or ",".join(str(k * 2**i) for i in range(5, 10))).split(",")]
    args.time_budget = args.time_budget or (120.0 if args.smoke else 270.0)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    start = time.perf_counter()
    deadline = start + args.time_budget
    device = torch.device(args.device or ("cpu" if args.smoke or not torch.cuda.is_available() else "cuda"))
    shape = {**LLADA_8B, **(SMOKE_SHAPE if args.smoke else {})}
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory / GIB
        name = torch.cuda.get_device_name(device)
    else:
        total, name = None, "cpu"
    capacity = (total - args.reserve_gib) if total is not None else float("inf")
    report = {"device": name, "total_gib": total, "capacity_gib": capacity, "shape": shape,
              "fit_layers": args.fit_layers, "target_layers": args.target_layers, "logits_chunk": args.logits_chunk,
              "torch": torch.__version__, "measurements": [], "results": {}}
    log(f"device {name}: {total and round(total, 1)} GiB, capacity {capacity:.1f} GiB after the reserve; "
        f"blocks measured {args.fit_layers}, predicted for {args.target_layers}")
    degrees = [1] + ([args.degree] if args.degree > 1 else [])
    for dtype_name in args.master_dtype.split(","):
        master = getattr(torch, dtype_name)
        for degree in degrees:
            label = f"{dtype_name}/sp{degree}"
            log(f"{label}: {'one GPU' if degree == 1 else f'per rank of SP={degree} over {degree} GPUs (FSDP2)'}")
            lengths = args.lengths if degree == 1 else args.sp_lengths
            rows = ladder(args, device, degree, master, lengths, capacity, shape, deadline, report)
            best, how = longest_fitting(rows, capacity) if rows else (None, "not measured")
            report["results"][label] = {"ladder": rows, "max_length": best, "max_length_method": how}
            if best is not None:
                log(f"{label}: longest trainable row ~{best:,.0f} tokens ({args.target_layers} blocks, {how})")
            write(report, args.json)
        if args.verify and device.type == "cuda":
            verify(args, device, master, report["results"][f"{dtype_name}/sp1"], capacity, deadline, report)
            write(report, args.json)
    report["elapsed_s"] = round(time.perf_counter() - start, 1)
    write(report, args.json)
    return report


def verify(args, device, master, result: dict, capacity: float, deadline: float, report: dict) -> None:
    """The real ``target_layers`` model at the longest ladder length predicted to fit (time permitting)."""
    fitting = [r for r in result["ladder"] if r["peak_gib"] <= capacity]
    if not fitting:
        return
    row = max(fitting, key=lambda r: r["length"])
    dtype_name = str(master).split(".")[-1]
    spent = sum(m.get("step_s", 0) for m in report["measurements"] if m["length"] == row["length"]
                and m["degree"] == 1 and m["master_dtype"] == dtype_name)
    estimate = 30 + spent * args.target_layers / max(sum(args.fit_layers), 1)
    if time.perf_counter() + estimate > deadline:
        log(f"  verify skipped (needs ~{estimate:.0f}s)")
        return
    got = measure(args, device, args.target_layers, row["length"], 1, master)
    report["measurements"].append(got)
    if got.get("oom"):
        result["verify"] = {"length": row["length"], "oom": True}
        log(f"  verify T={row['length']}: out of memory (predicted {row['peak_gib']:.1f} GiB)")
        return
    peak = got["static_gib"] + max(got["activation_gib"], got["optimizer_gib"])
    result["verify"] = {"length": row["length"], "measured_peak_gib": peak, "predicted_peak_gib": row["peak_gib"],
                        "step_s": got["step_s"]}
    log(f"  verify T={row['length']}: {args.target_layers} blocks measured peak {peak:.2f} GiB vs predicted "
        f"{row['peak_gib']:.2f} GiB; step {got['step_s']:.1f}s")


def write(report: dict, path: str | None) -> None:
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
