#!/usr/bin/env python
"""MoE experts: the loop over experts vs grouped matmuls (dare.models.moe), LLaDA2.0-mini shapes.

GPU run (one H200, random bf16 weights built on the GPU, about 3 minutes)::

    python benchmarks/moe.py --json benchmarks/results/moe_h200.json

CPU smoke test (tiny shapes, seconds)::

    python benchmarks/moe.py --smoke

What is measured (loop = one gather and three matmuls per expert, the families' code before grouped experts;
grouped = rows sorted by expert and one ``grouped_mm`` for gate+up and one for down; ``padded_bmm`` = the
batched fallback; ``auto`` is what the models use by default):

* ``layer``: forward + backward of one LLaDA2.0-mini MoE layer (hidden 2048, 256 experts, top-8, expert width
  512, 8 groups / top-4 groups, one shared expert) on ``--layer-tokens`` tokens (default 8192), bf16
  parameters with gradients. Target: grouped >= 3x the loop.
* ``model``: forward + backward (cross-entropy on every position) of an LLaDA2-mini-shaped model with
  ``--layers`` layers (default 8: layer 0 dense, 7 MoE; the released model has 20, i.e. 19 MoE layers - fewer
  keep the loop's run and the weights in budget) on ``--model-batch`` x ``--model-length`` tokens; no
  optimizer step.
* ``rollout``: the ``llada2`` sampler (block 32, threshold 0.95, block KV cache) on the same model at
  batch 1 and 16, generation ``--gen`` tokens of which the first ``--max-blocks`` blocks are decoded;
  tokens/s. Random weights are near-uniform, so a random 50% of positions get their top logit raised by 20
  at every forward (benchmarks/common.py ``ConfidenceInjection``); tokens per forward is reported.

Ratios are loop time / grouped time (higher = grouped faster). Routing of random weights is close to
balanced; ``max_load`` is the largest expert load over the mean.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ConfidenceInjection, sync  # noqa: E402

LLADA2_MINI = dict(vocab_size=157184, hidden_size=2048, intermediate_size=5120, num_hidden_layers=20,
                   num_attention_heads=16, num_key_value_heads=4, head_dim=128, rotary_dim=64, num_experts=256,
                   num_shared_experts=1, num_experts_per_tok=8, moe_intermediate_size=512, first_k_dense_replace=1,
                   n_group=8, topk_group=4, routed_scaling_factor=2.5, max_position_embeddings=32768,
                   mask_token_id=156895, eos_token_id=156892, pad_token_id=156892)
"""LLaDA2.0-mini's architecture (docs models.md 6.1)."""

SMOKE = dict(vocab_size=264, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, rotary_dim=8, num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32, n_group=4,
             topk_group=2, mask_token_id=259, eos_token_id=258, pad_token_id=256)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (fp32)")
    p.add_argument("--device", help="default: cuda if available (cpu with --smoke)")
    p.add_argument("--layers", type=int, help="layers of the model benchmark (default 8; smoke 3)")
    p.add_argument("--layer-tokens", type=int, help="tokens of the layer benchmark (default 8192; smoke 256)")
    p.add_argument("--model-batch", type=int, help="rows of the model step (default 4; smoke 2)")
    p.add_argument("--model-length", type=int, help="tokens per row of the model step (default 1024; smoke 64)")
    p.add_argument("--batch", type=int, nargs="+", help="rollout batch sizes (default 1 16)")
    p.add_argument("--gen", type=int, help="rollout generation length (default 256; smoke 32)")
    p.add_argument("--max-blocks", type=int, help="decode only the first N blocks (default 2; smoke all)")
    p.add_argument("--prompt-length", type=int, help="prompt tokens (default 64; smoke 8)")
    p.add_argument("--confident-fraction", type=float, default=0.5)
    p.add_argument("--reps", type=int, help="timed repetitions after one warm-up (default 5; smoke 2)")
    p.add_argument("--json", help="write the results to this file")
    args = p.parse_args(argv)
    smoke = args.smoke
    args.device = args.device or ("cpu" if smoke or not torch.cuda.is_available() else "cuda")
    defaults = dict(layers=(3, 8), layer_tokens=(256, 8192), model_batch=(2, 4), model_length=(64, 1024),
                    batch=([1, 4], [1, 16]), gen=(32, 256), prompt_length=(8, 64), reps=(2, 5))
    for key, (tiny, full) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, tiny if smoke else full)
    if args.max_blocks is None and not smoke:
        args.max_blocks = 2
    return args


def build_config(args):
    import dare  # noqa: F401  (registers the families)
    from dare.models.llada2 import LLaDA2MoeConfig, tiny_llada2_config

    shape = SMOKE if args.smoke else LLADA2_MINI
    raw = tiny_llada2_config(**{**shape, "num_hidden_layers": args.layers})
    raw.pop("model_type")
    return LLaDA2MoeConfig.from_dict(raw)


def init_random(module: torch.nn.Module, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """Meta-built ``module`` materialised on ``device``: N(0, 0.02) weights, norms 1, expert bias 0."""
    module = module.to(dtype).to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, 0.02, generator=gen)
        for name, buffer in module.named_buffers():
            if name.endswith("expert_bias"):
                buffer.zero_()
    return module


def timed(fn, device: torch.device, reps: int) -> float:
    """Seconds per call of ``fn`` (mean of ``reps`` calls after one warm-up call)."""
    fn()
    sync(device)
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    sync(device)
    return (time.perf_counter() - start) / reps


def bench_layer(args, config, device, dtype) -> dict:
    from dare.models.llada2 import GroupLimitedMoE
    from dare.models.moe import set_expert_backend

    with torch.device("meta"):
        layer = GroupLimitedMoE(config)
    layer = init_random(layer, device, dtype)
    gen = torch.Generator(device=device).manual_seed(1)
    x = torch.randn(args.layer_tokens, config.hidden_size, device=device, dtype=dtype, generator=gen)
    x.requires_grad_(True)
    grad = torch.randn(x.shape, device=device, dtype=dtype, generator=gen)
    with torch.no_grad():
        chosen, _ = layer.gate(x)
    load = torch.bincount(chosen.reshape(-1), minlength=config.num_experts).float()

    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        layer(x).backward(grad)

    out = {"tokens": args.layer_tokens, "max_load": float(load.max() / load.mean()),
           "idle_experts": int((load == 0).sum())}
    for backend in ("loop", "padded_bmm", "grouped_mm"):
        set_expert_backend(layer, backend)
        out[f"{backend}_ms"] = 1e3 * timed(step, device, args.reps)
        print(f"layer  {backend:<10s} {out[f'{backend}_ms']:9.2f} ms fwd+bwd", flush=True)
    out["grouped_vs_loop"] = out["loop_ms"] / out["grouped_mm_ms"]
    out["padded_bmm_vs_loop"] = out["loop_ms"] / out["padded_bmm_ms"]
    return out


def build_model(config, device, dtype):
    from dare.models.llada2 import LLaDA2MoeModelLM

    with torch.device("meta"):
        model = LLaDA2MoeModelLM(config)
    return init_random(model, device, dtype)


def bench_model_step(args, model, device) -> dict:
    from dare.models.moe import set_expert_backend

    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 156000 if not args.smoke else 256, (args.model_batch, args.model_length),
                        generator=gen).to(device)
    targets = ids.roll(1, dims=1)
    model.train()

    def step():
        model.zero_grad(set_to_none=True)
        hidden = model(ids, return_hidden=True).last_hidden_state
        loss = torch.nn.functional.cross_entropy(model.head(hidden).flatten(0, 1), targets.flatten())
        loss.backward()

    out = {"layers": len(model.blocks), "batch": args.model_batch, "length": args.model_length}
    for backend in ("loop", "auto"):
        set_expert_backend(model, backend)
        out[f"{backend}_ms"] = 1e3 * timed(step, device, max(1, args.reps - 2))
        print(f"model  {backend:<10s} {out[f'{backend}_ms']:9.2f} ms fwd+bwd", flush=True)
    model.zero_grad(set_to_none=True)
    out["grouped_vs_loop"] = out["loop_ms"] / out["auto_ms"]
    return out


def bench_rollout(args, model, device) -> list[dict]:
    from dare.models.moe import set_expert_backend
    from dare.rollout import SamplerConfig, generate

    model.eval()
    block = 8 if args.smoke else 32
    config = SamplerConfig(sampler="llada2", gen_length=args.gen, block_length=block, temperature=0.0,
                           eos_early_stop=False, max_blocks=args.max_blocks)
    rows = []
    for batch in args.batch:
        prompts = torch.randint(0, 156000 if not args.smoke else 256, (batch, args.prompt_length),
                                generator=torch.Generator().manual_seed(3)).to(device)
        row = {"batch": batch, "gen_length": args.gen, "max_blocks": args.max_blocks}
        tokens = {}
        for backend in ("loop", "auto"):
            set_expert_backend(model, backend)
            # the loop selects each expert's rows by value (host reads): it decodes eagerly, as the families' code
            # before the expert bank did; the grouped bank's steps replay recorded graphs (engine auto on CUDA)
            run_config = config.replace(engine="eager") if backend == "loop" else config
            for attempt in ("warm", "timed"):
                injection = ConfidenceInjection(model, args.confident_fraction, device)
                sync(device)
                start = time.perf_counter()
                with torch.no_grad():
                    result = generate(model, prompts, None, run_config)
                sync(device)
                seconds = time.perf_counter() - start
                if injection.handle is not None:
                    injection.handle.remove()
            decoded = int((result.step_map >= 0).sum())
            tokens[backend] = result.sequences
            row[f"{backend}_tokens_per_s"] = decoded / seconds
            row[f"{backend}_nfe"] = result.nfe
            row["tokens_per_forward"] = decoded / batch / result.nfe
            print(f"rollout B={batch:<3d} {backend:<5s} {decoded / seconds:9.1f} tok/s  nfe={result.nfe}  "
                  f"{seconds:6.2f}s", flush=True)
        row["grouped_vs_loop"] = row["auto_tokens_per_s"] / row["loop_tokens_per_s"]
        row["same_tokens"] = float((tokens["loop"] == tokens["auto"]).float().mean())
        rows.append(row)
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    dtype = torch.float32 if args.smoke else torch.bfloat16
    if device.type == "cpu":
        torch.set_num_threads(1)
    t_start = time.perf_counter()
    config = build_config(args)
    label = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.machine()})"
    results = {"device": label,
               "torch": torch.__version__, "dtype": str(dtype), "args": vars(args)}
    results["layer"] = bench_layer(args, config, device, dtype)
    model = build_model(config, device, dtype)
    results["model"] = bench_model_step(args, model, device)
    results["rollout"] = bench_rollout(args, model, device)
    results["layer_target_met"] = results["layer"]["grouped_vs_loop"] >= 3.0
    results["seconds"] = time.perf_counter() - t_start
    print_table(results)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


def print_table(results: dict) -> None:
    layer, model = results["layer"], results["model"]
    print(f"\n{results['device']}, torch {results['torch']}, {results['dtype']}")
    print("| benchmark | loop | grouped | grouped / loop |")
    print("|---|---|---|---|")
    print(f"| MoE layer fwd+bwd, {layer['tokens']} tokens | {layer['loop_ms']:.1f} ms | "
          f"{layer['grouped_mm_ms']:.1f} ms | {layer['grouped_vs_loop']:.2f}x |")
    print(f"| model step fwd+bwd, {model['layers']} layers, {model['batch']}x{model['length']} | "
          f"{model['loop_ms']:.1f} ms | {model['auto_ms']:.1f} ms | {model['grouped_vs_loop']:.2f}x |")
    for row in results["rollout"]:
        print(f"| llada2 rollout B={row['batch']} | {row['loop_tokens_per_s']:.1f} tok/s | "
              f"{row['auto_tokens_per_s']:.1f} tok/s | {row['grouped_vs_loop']:.2f}x |")
    verdict = "meets" if results["layer_target_met"] else "MISSES"
    print(f"layer: grouped = {layer['grouped_vs_loop']:.2f}x loop ({verdict} the 3x target); padded bmm "
          f"{layer['padded_bmm_vs_loop']:.2f}x; max expert load {layer['max_load']:.2f}x mean; "
          f"total {results['seconds']:.0f}s")


if __name__ == "__main__":
    sys.exit(main())
