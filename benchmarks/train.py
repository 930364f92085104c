#!/usr/bin/env python
"""SFT training-step benchmark: padded vs packed layouts and attention backends on an LLaDA-8B-shaped model.

One step = what ``dare train`` does per optimizer step, through the real code: ``DatasetSource`` collation,
``SFT.corrupt`` / ``totals`` / ``estimate`` / ``loss`` (masked-diffusion NELBO), forward + backward over the
micro-batches, gradient clipping and the AdamW step (``Trainer.train_step``). The model is built directly on
the device (meta device -> ``to_empty`` -> N(0, 0.02) init: seconds), random weights, LLaDA-8B shapes
(d_model 4096, 32 heads, MLP 12288, vocabulary 126464) with ``--layers`` blocks (default 16: a full 8B with
AdamW states and activations does not fit one 141 GB GPU without activation checkpointing; per-layer costs
are what the comparison needs).

Variants are ``LAYOUT-BACKEND[+OPTION...]``:

* layout ``padded`` (micro-batches of ``--micro-rows`` rows padded to the step's longest example, padding
  neither attended nor trained) or ``packed`` (``--pack-length`` token rows with ``cu_seqlens``);
* backend ``eager`` | ``sdpa`` | ``flex`` | ``varlen`` (``model.attn_backend``);
* ``+fullce``: full ``[B, L, V]`` logits then select (``model.logits_chunk_size=0``) instead of the default
  chunked head on masked positions; ``+compile``: ``torch.compile`` of every block (``model.compile``);
  ``+ckpt``: activation checkpointing.

Every variant trains on the same examples with the same weights and corruption, so the step-0 losses must
agree (up to bf16 rounding of different kernels): a built-in check that the layouts compute one objective.

MFU = model FLOPs per step / step time / measured bf16 matmul rate, with model FLOPs
``6 * N * T + 12 * n_layers * d_model * sum_docs(len^2)``: N = matmul parameters (blocks + LM head, not the
embedding), T = real tokens (padding excluded), the second term = bidirectional attention within documents
(QK^T and PV, forward + backward). Padding, recomputation and cross-document work count as waste.

GPU (the lead's command, < 6 minutes, prints rows as they finish, JSON via --out):
    python benchmarks/train.py --out benchmarks/results/train_h200.json
CPU smoke test (seconds; flex/varlen skipped):
    python benchmarks/train.py --tiny --out /tmp/train_tiny.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
if os.path.isdir(os.path.join(HERE, "..", "src", "dare")):  # this checkout's dare, installed or not
    sys.path.insert(0, os.path.join(HERE, "..", "src"))
# Variants allocate very different shapes one after another: expandable segments avoid fragmentation OOMs.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import torch  # noqa: E402
import torch._dynamo  # noqa: E402

from common import LLADA_8B as LLADA_8B_CONFIG  # noqa: E402
from common import build_llada, matmul_rate, sync  # noqa: E402
from workload import Workload, make_workload  # noqa: E402

DEFAULT_VARIANTS = ("padded-eager", "padded-sdpa", "packed-sdpa", "packed-varlen", "packed-varlen+fullce",
                    "packed-flex", "packed-varlen+compile")
TINY_VARIANTS = ("padded-eager", "padded-sdpa", "packed-sdpa", "packed-sdpa+fullce", "packed-sdpa+compile",
                 "packed-flex", "packed-varlen")  # every CPU path; flex / varlen print their skip note
LAYOUTS = ("padded", "packed")
BACKENDS = ("eager", "sdpa", "flex", "varlen")
OPTIONS = ("fullce", "compile", "ckpt")


@dataclass(frozen=True)
class Shape:
    """LLaDA shape of the benchmarked model (MHA, SwiGLU, untied head)."""

    d_model: int
    n_heads: int
    n_layers: int
    mlp: int
    vocab: int
    mask_id: int
    eos_id: int
    pad_id: int

    @property
    def block_params(self) -> int:
        return 4 * self.d_model * self.d_model + 3 * self.d_model * self.mlp

    @property
    def matmul_params(self) -> int:
        """Parameters that multiply every token: all blocks + the LM head (the embedding is a lookup)."""
        return self.n_layers * self.block_params + self.d_model * self.vocab

    @property
    def total_params(self) -> int:
        norms = (2 * self.n_layers + 1) * self.d_model
        return self.matmul_params + self.d_model * self.vocab + norms

    def step_flops(self, lengths: list[int]) -> float:
        tokens = sum(lengths)
        attention = 12 * self.n_layers * self.d_model * sum(n * n for n in lengths)
        return 6.0 * self.matmul_params * tokens + attention


LLADA_8B = Shape(d_model=LLADA_8B_CONFIG["d_model"], n_heads=LLADA_8B_CONFIG["n_heads"],
                 n_layers=LLADA_8B_CONFIG["n_layers"], mlp=LLADA_8B_CONFIG["mlp_hidden_size"],
                 vocab=LLADA_8B_CONFIG["vocab_size"], mask_id=LLADA_8B_CONFIG["mask_token_id"],
                 eos_id=LLADA_8B_CONFIG["eos_token_id"], pad_id=LLADA_8B_CONFIG["pad_token_id"])
TINY = Shape(d_model=64, n_heads=4, n_layers=2, mlp=128, vocab=264, mask_id=259, eos_id=258, pad_id=256)


@dataclass(frozen=True)
class Variant:
    name: str
    layout: str
    backend: str
    options: frozenset = field(default_factory=frozenset)

    @classmethod
    def parse(cls, name: str) -> Variant:
        head, *options = name.split("+")
        layout, _, backend = head.partition("-")
        if layout not in LAYOUTS or backend not in BACKENDS or any(o not in OPTIONS for o in options):
            raise SystemExit(f"error: bad variant '{name}': expected LAYOUT-BACKEND[+OPTION...] with layout in "
                             f"{LAYOUTS}, backend in {BACKENDS}, options in {OPTIONS}")
        if layout == "padded" and backend == "varlen":
            raise SystemExit(f"error: variant '{name}': varlen needs the packed layout")
        return cls(name, layout, backend, frozenset(options))


class VariantTimeout(Exception):
    pass


def count(n: float) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e8 else f"{n / 1e6:.2f} M"


def log(message: str = "") -> None:
    print(message, flush=True)


# ---- model and calibration -------------------------------------------------------------------------
def build_model(shape: Shape, dtype: torch.dtype, device: torch.device, seed: int = 0):
    """A randomly initialised LLaDA of ``shape`` allocated directly on ``device`` (``common.build_llada``)."""
    return build_llada(device, dtype=dtype, seed=seed, d_model=shape.d_model, n_heads=shape.n_heads,
                       n_kv_heads=shape.n_heads, n_layers=shape.n_layers, mlp_hidden_size=shape.mlp,
                       vocab_size=shape.vocab, embedding_size=shape.vocab, mask_token_id=shape.mask_id,
                       eos_token_id=shape.eos_id, pad_token_id=shape.pad_id).train()


def trainer_for(variant: Variant, args, shape: Shape, workload: Workload, device: torch.device, out_dir: Path):
    from dare.trainer import Trainer, load_train_config
    from dare.trainer.sources import DatasetSource

    overrides = [
        f"trainer.output_dir={out_dir}", "trainer.progress=false", "trainer.export=false", "trainer.resume=never",
        f"trainer.batch_size={len(workload.examples)}", f"trainer.micro_batch_size={args.micro_rows}",
        f"trainer.max_steps={args.warmup + args.steps}", f"trainer.seed={args.seed}",
        f"data.packing={variant.layout == 'packed'}", f"data.pack_length={args.pack_length}",
        f"data.max_length={args.max_len}", "data.eos_padding=false", "data.shuffle=false",
        f"model.attn_backend={variant.backend}",
        f"model.logits_chunk_size={0 if 'fullce' in variant.options else args.logits_chunk}",
        f"model.compile={'compile' in variant.options}", f"model.compile_backend={args.compile_backend}",
        f"model.gradient_checkpointing={'ckpt' in variant.options or args.grad_ckpt}",
        f"distributed.device={device.type}", "optim.lr=1e-6", "optim.grad_clip=1.0",
    ]
    config = load_train_config(None, overrides)
    source = DatasetSource(
        workload.examples, batch_size=len(workload.examples), micro_batch_size=args.micro_rows, shuffle=False,
        packing=variant.layout == "packed", pack_length=args.pack_length, eos_id=shape.eos_id, pad_id=shape.pad_id,
        eos_padding=False, fixed_width=config.fixed_width(), seed=args.seed,
    )
    model = build_model(shape, args.torch_dtype, device, seed=args.seed)
    return Trainer(config, source=source, model=model)


def layout_tokens(trainer) -> int:
    """Tokens the model actually processes per step (real + padding)."""
    return sum(int(mb["input_ids"].numel()) for mb in trainer.source.batch(0))


def profile_step(trainer, step: int, device: torch.device, rows: int = 12) -> list[dict]:
    """Top operators by self device (CPU: host) time of one profiled step."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        trainer.train_step(step)
        sync(device)
    attr = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, attr), reverse=True)[:rows]
    total = sum(getattr(e, attr) for e in prof.key_averages()) or 1.0
    table = [{"op": e.key[:80], "self_ms": round(getattr(e, attr) / 1e3, 3), "share": round(getattr(e, attr) / total, 4),
              "calls": e.count} for e in events]
    log(f"    profile ({'device' if device.type == 'cuda' else 'host'} self time):")
    for row in table:
        log(f"      {row['self_ms']:10.2f} ms {100 * row['share']:5.1f}% x{row['calls']:<5} {row['op']}")
    return table


def run_variant(variant: Variant, args, shape: Shape, workload: Workload, device: torch.device, out_dir: Path,
                share: float) -> dict:
    """Warm up, then time up to ``args.steps`` steps: at least one, more while they fit in ``share`` seconds."""
    result: dict = {"name": variant.name, "layout": variant.layout, "backend": variant.backend,
                    "options": sorted(variant.options)}
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    begin = time.perf_counter()
    trainer = trainer_for(variant, args, shape, workload, device, out_dir / variant.name.replace("+", "_"))
    result["build_s"] = round(time.perf_counter() - begin, 3)
    result["processed_tokens"] = layout_tokens(trainer)
    result["micro_batches"] = len(trainer.source.batch(0))
    times, records = [], []
    try:
        for step in range(args.warmup):
            start = time.perf_counter()
            records.append(trainer.train_step(step))
            sync(device)
            result.setdefault("warmup_s", []).append(round(time.perf_counter() - start, 4))
        step = args.warmup
        while len(times) < args.steps and not (times and time.perf_counter() + times[-1] > begin + share):
            start = time.perf_counter()
            records.append(trainer.train_step(step))
            sync(device)
            times.append(time.perf_counter() - start)
            step += 1
        if args.profile:
            result["profile"] = profile_step(trainer, step, device)
    finally:
        result["peak_mem_gib"] = (round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
                                  if device.type == "cuda" else None)
        result["losses"] = [round(r["loss"], 6) for r in records]
        del trainer
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    times.sort()
    result["step_times_s"] = [round(t, 4) for t in times]
    result["step_s"] = round(times[len(times) // 2], 4)  # median
    return result


def fill_rates(result: dict, workload: Workload, shape: Shape, peak_flops: float) -> None:
    step = result["step_s"]
    result["tokens_per_s"] = round(workload.tokens / step, 1)
    result["padding_fraction"] = round(1 - workload.tokens / result["processed_tokens"], 4)
    result["model_tflops_per_s"] = round(shape.step_flops(workload.lengths) / step / 1e12, 2)
    result["mfu"] = round(shape.step_flops(workload.lengths) / step / peak_flops, 4)


# ---- the run -----------------------------------------------------------------------------------------
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run: 2-layer d_model-64 model, small steps")
    parser.add_argument("--variants", default=None,
                        help=f"comma-separated LAYOUT-BACKEND[+OPT] (default {','.join(DEFAULT_VARIANTS)}; "
                             f"tiny: {','.join(TINY_VARIANTS)})")
    parser.add_argument("--baseline", default="padded-eager", help="variant the speed-ups are relative to")
    parser.add_argument("--layers", type=int, default=None, help="transformer blocks (default 16; tiny 2)")
    parser.add_argument("--tokens-per-step", type=int, default=None, help="real tokens per optimizer step (16384)")
    parser.add_argument("--min-len", type=int, default=None, help="shortest example (64)")
    parser.add_argument("--max-len", type=int, default=None, help="longest example (2048)")
    parser.add_argument("--pack-length", type=int, default=None, help="tokens per packed row (8192)")
    parser.add_argument("--micro-rows", type=int, default=None, help="padded rows per micro-batch (2; tiny 4)")
    parser.add_argument("--logits-chunk", type=int, default=2048, help="LM-head rows per chunk (chunked CE)")
    parser.add_argument("--steps", "--repeats", type=int, default=3, help="timed steps per variant (fewer if time is short)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (compilation, allocator)")
    parser.add_argument("--dtype", default=None, help="weight dtype: bfloat16 (GPU default) or float32 (tiny)")
    parser.add_argument("--grad-ckpt", action="store_true", help="activation checkpointing in every variant")
    parser.add_argument("--compile-backend", default=None, help="torch.compile backend (inductor; tiny: aot_eager)")
    parser.add_argument("--profile", action="store_true", help="profile one extra step per variant (top ops)")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds for the whole run (300; tiny 120)")
    parser.add_argument("--matmul-size", type=int, default=None, help="n of the n x n x n calibration matmul (8192)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available; tiny: cpu)")
    parser.add_argument("--out", default=None, help="write the results JSON here (rewritten after each variant)")
    args = parser.parse_args(argv)
    tiny = args.tiny
    defaults = {"variants": ",".join(TINY_VARIANTS if tiny else DEFAULT_VARIANTS), "layers": 2 if tiny else 16, "tokens_per_step": 256 if tiny else 16384, "min_len": 8 if tiny else 64,
                "max_len": 64 if tiny else 2048, "pack_length": 128 if tiny else 8192, "micro_rows": 4 if tiny else 2,
                "dtype": "float32" if tiny else "bfloat16", "compile_backend": "aot_eager" if tiny else "inductor",
                "time_budget": 120.0 if tiny else 300.0, "matmul_size": 256 if tiny else 8192,
                "device": "cpu" if tiny else ("cuda" if torch.cuda.is_available() else "cpu")}
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if tiny:
        args.logits_chunk = min(args.logits_chunk, 16)  # several chunks even at tiny sizes
    args.torch_dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    if args.pack_length < args.max_len:
        parser.error(f"--pack-length {args.pack_length} must be at least --max-len {args.max_len}")
    return args


def skip_reason(variant: Variant, device: torch.device) -> str | None:
    if device.type == "cpu" and variant.backend == "flex":
        return "FlexAttention has no backward pass on CPU"
    if device.type == "cpu" and variant.backend == "varlen":
        return "varlen attention needs CUDA"
    return None


def print_table(results: list[dict], baseline: str) -> None:
    base = next((r for r in results if r["name"] == baseline and r["status"] == "ok"), None)
    log("")
    log(f"{'variant':28} {'step s':>8} {'tok/s':>10} {'x ' + baseline:>18} {'MFU':>6} {'pad':>5} {'peak GiB':>9} "
        f"{'loss@0':>9}")
    for r in results:
        if r["status"] != "ok":
            log(f"{r['name']:28} {r['status']}: {r.get('note', '')}")
            continue
        ratio = f"{base['step_s'] / r['step_s']:.2f}x" if base else "-"
        peak = f"{r['peak_mem_gib']:.1f}" if r["peak_mem_gib"] is not None else "-"
        log(f"{r['name']:28} {r['step_s']:8.3f} {r['tokens_per_s']:10.0f} {ratio:>18} {100 * r['mfu']:5.1f}% "
            f"{100 * r['padding_fraction']:4.0f}% {peak:>9} {r['losses'][0]:9.4f}")


def main(argv=None) -> dict:
    started = time.perf_counter()
    args = parse_args(argv)
    variants = [Variant.parse(v) for v in args.variants.split(",") if v]
    device = torch.device(args.device)
    base_shape = TINY if args.tiny else LLADA_8B
    shape = Shape(**{**base_shape.__dict__, "n_layers": args.layers})
    special = min(shape.mask_id, shape.eos_id, shape.pad_id)
    workload = make_workload(args.tokens_per_step, args.min_len, args.max_len, vocab_limit=special, seed=args.seed)

    import dare  # registers the families

    peak = matmul_rate(device, args.torch_dtype, args.matmul_size, iters=50 if device.type == "cuda" else 20)
    report = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "dare": os.path.dirname(os.path.abspath(dare.__file__)),
        "argv": sys.argv[1:] if argv is None else list(argv),
        "shape": {**shape.__dict__, "matmul_params": shape.matmul_params, "total_params": shape.total_params},
        "dtype": args.dtype, "workload": workload.summary(),
        "step_flops": shape.step_flops(workload.lengths),
        "matmul_tflops_per_s": round(peak / 1e12, 2), "matmul_size": args.matmul_size,
        "mfu_formula": "(6 * matmul_params * real_tokens + 12 * layers * d_model * sum(doc_len^2)) / step_s / matmul rate",
        "variants": [],
    }
    log(f"device {report['device']}  torch {torch.__version__}  dtype {args.dtype}  dare from {report['dare']}")
    log(f"model: LLaDA shape d_model {shape.d_model}, {shape.n_layers} layers, {shape.n_heads} heads, mlp {shape.mlp}, "
        f"vocab {shape.vocab}: {count(shape.total_params)} params ({count(shape.matmul_params)} in matmuls)")
    log(f"step: {json.dumps(workload.summary())}  pack_length {args.pack_length}  micro_rows {args.micro_rows}")
    log(f"measured {args.dtype} matmul ({args.matmul_size}^3): {peak / 1e12:.1f} TFLOP/s; "
        f"model FLOPs per step {report['step_flops'] / 1e12:.2f} TFLOP")

    def on_alarm(signum, frame):
        raise VariantTimeout("time budget exhausted")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    out_dir = Path(tempfile.mkdtemp(prefix="dare_bench_train_"))
    try:
        for position, variant in enumerate(variants):
            time_left = args.time_budget - (time.perf_counter() - started)
            row: dict = {"name": variant.name, "status": "skipped"}
            reason = skip_reason(variant, device)
            if reason is None and time_left < 15:
                reason = f"time budget ({args.time_budget:.0f} s) exhausted"
            if reason is not None:
                row["note"] = reason
                log(f"  {variant.name}: skipped ({reason})")
            else:
                share = time_left / (len(variants) - position)
                signal.setitimer(signal.ITIMER_REAL, max(1.0, time_left - 5))
                try:
                    row = {**run_variant(variant, args, shape, workload, device, out_dir, share), "status": "ok"}
                    fill_rates(row, workload, shape, peak)
                    log(f"  {variant.name}: {row['step_s']:.3f} s/step  {row['tokens_per_s']:.0f} tok/s  "
                        f"MFU {100 * row['mfu']:.1f}%  peak {row['peak_mem_gib']} GiB  loss@0 {row['losses'][0]:.4f}  "
                        f"(warm-up {row.get('warmup_s')}, steps {row['step_times_s']})")
                except Exception as err:  # noqa: BLE001 - report the variant, keep going
                    row = {"name": variant.name, "status": "failed",
                           "note": f"{type(err).__name__}: {str(err).splitlines()[0][:300] if str(err) else ''}"}
                    log(f"  {variant.name}: FAILED {row['note']}")
                    traceback.print_exc(limit=6, file=sys.stderr)
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                if "compile" in variant.options or variant.backend == "flex":
                    torch._dynamo.reset()
                gc.collect()  # after the except block: a traceback keeps the failed variant's model alive
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            report["variants"].append(row)
            if args.out:
                write_json(report, args.out)
    finally:
        signal.signal(signal.SIGALRM, previous)
    base = next((r for r in report["variants"] if r["name"] == args.baseline and r["status"] == "ok"), None)
    for r in report["variants"]:
        if base and r["status"] == "ok":
            r["speedup"] = round(base["step_s"] / r["step_s"], 3)
    print_table(report["variants"], args.baseline)
    report["wall_s"] = round(time.perf_counter() - started, 1)
    log(f"total {report['wall_s']} s")
    if args.out:
        write_json(report, args.out)
        log(f"wrote {args.out}")
    return report


def write_json(report: dict, path: str) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
