#!/usr/bin/env python
"""One d1 (diffu-GRPO) RL step on an LLaDA-8B-shaped model: naive vs optimised paths, per phase.

GPU run (one H200; random bf16 weights built on the GPU in seconds; < 5 minutes in all, hard-stopped at
``--hard-limit-s``)::

    python benchmarks/rl_step.py --json $OUT/rl_step.json

CPU smoke test (tiny LLaDA; numbers meaningless; part of the test suite)::

    python benchmarks/rl_step.py --tiny

One RL step is one rollout cycle of DARE's real workflow (``dare.trainer.Trainer`` with a
``dare.trainer.rl.RolloutSource`` and the registered ``d1`` plug-in; nothing is re-implemented here):

1. **rollout**: ``P`` prompts x ``G`` samples (default 4 x 8 = 32 rows; prompts of 96-160 random tokens,
   left-padded; generation 256, block 32, temperature 0.9) with the current policy;
2. **reward**: decode + a synthetic reward (fraction of even token ids: cheap, varies within a group) +
   mean-only group advantages;
3. **log-probs**: for each of the ``mu`` inner steps the d1 views (completion masked, prompt tokens masked
   w.p. 0.15) with old log-probs (policy, ``mu > 1``) and reference log-probs (LoRA adapter disabled; k3 KL,
   beta 0.04);
4. **update**: ``mu`` optimizer steps (micro-batched forward/backward of the clipped d1 loss, gradient clipping,
   AdamW), i.e. ``Trainer.train_step``.

Phases 1-3 are timed inside ``RolloutSource`` (``rollout/generate_s``, ``reward_s``, ``logprob_s``, each
after a CUDA synchronisation); the update is the synchronised wall time of the ``train_step`` calls minus
those. Each variant first runs a warm-up step (a one-block rollout, one update), then the measured cycle.

Variants (equal settings otherwise: same prompts, seeds, LoRA, mu, micro-batches):

* ``naive``: LLaDA's sampler (no cache, one token per step: ``steps = gen_length``), training forwards with
  ``eager`` attention on the padded batch and full ``[B, L, V]`` logits (``model.logits_chunk_size=0``);
* ``optimised``: Fast-dLLM dual KV cache + threshold (0.9) parallel decoding, training with ``sdpa`` and the
  chunked LM head at the scored positions only.
  (RL batches are padded rows; packing them is not supported by the RL source, so sdpa is the best existing
  training path; the printed padding fraction bounds what packing could save.)

Model: LLaDA-8B shape (32 layers, d 4096, MLP 12288, vocab 126464) in bf16 with a LoRA adapter as in
``configs/llada/d1_8b.yaml`` (r 128, alpha 64, dropout 0.05; the reference is the adapter-disabled policy, so no
second copy of the weights); training forwards under bf16 autocast. ``--no-lora`` trains every weight instead
(AdamW states + a frozen reference copy: use ``--layers 16`` to fit).

Random weights give near-uniform predictions, so threshold decoding would commit one token per forward;
``--confident-fraction f`` (default 0.25) raises the top logit of a random fraction ``f`` of the positions by 20
in every **rollout** forward (not in training forwards), as ``benchmarks/rollout.py`` does; tokens per forward
(TPF) is printed. ``--max-blocks N`` decodes only the first ``N`` blocks of every rollout in both variants (a
time bound; per-block costs are constant for both samplers, so the full-length rollout time is projected as
``measured x blocks / N`` and reported next to the measured ratio).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import ConfidenceInjection, build_llada, clock  # noqa: E402

VARIANTS = {
    "naive": dict(sampler=dict(sampler="llada", cache="none", decoder="quota"), attn="eager", logits_chunk=0),
    "optimised": dict(sampler=dict(sampler="fastdllm", cache="dual", decoder="threshold"), attn="sdpa",
                      logits_chunk=2048),
}
PHASES = ("rollout", "reward", "logprobs", "update")
D1_MU = 12  # d1's inner steps per rollout (the projection below)


class BudgetExceeded(Exception):
    """The hard time limit fired (SIGALRM)."""


# ----------------------------------------------------------------------------------- workload pieces
class IdTokenizer:
    """Decodes ids as space-separated numbers (random models have no tokenizer; the reward reads the ids)."""

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(str(i) for i in ids)


def parity_reward():
    """Synthetic reward: the fraction of even token ids in the completion (cheap; varies within a group)."""
    from dare.rewards import Reward, RewardResult

    class EvenFraction(Reward):
        name = "even_fraction"

        def score_one(self, completion, sample):
            ids = completion.split()
            frac = sum(int(i) % 2 == 0 for i in ids) / max(len(ids), 1)
            return RewardResult(reward=frac, correct=frac > 0.5)

    return EvenFraction()


def make_prompts(n: int, length: int, spread: int, vocab_limit: int, seed: int = 0):
    """``n`` prompts of ``length +- spread`` random ids below ``vocab_limit`` (no special token)."""
    from dare.data.prompts import PromptItem

    rng = random.Random(seed)
    out = []
    for i in range(n):
        size = max(1, length + rng.randint(-spread, spread))
        out.append(PromptItem(tuple(rng.randrange(vocab_limit) for _ in range(size)), {}, i))
    return out


def source_factory(prompts, injection: ConfidenceInjection):
    """``Trainer(source=...)`` callable: DARE's RolloutSource, with the confidence injection active only while
    rollouts are generated."""
    from dare.trainer.rl import RolloutSource

    class InjectingSource(RolloutSource):
        def _generate(self, *args, **kwargs):
            with injection.enabled():
                return super()._generate(*args, **kwargs)

    def build(trainer):
        cfg = trainer.config
        return InjectingSource(
            prompts, policy=trainer.model, algorithm=trainer.algorithm, tokenizer=IdTokenizer(),
            reward=parity_reward(), config=cfg.rollout, batch_size=cfg.trainer.batch_size,
            micro_batch_size=cfg.trainer.micro_batch_size, info=trainer.info, seed=cfg.trainer.seed, shuffle=False,
            reference=trainer.reference, output_dir=None)

    return build


def overrides(args, variant: dict, out_dir: str) -> list[str]:
    """The ``dare train`` overrides of one variant (the model itself is injected)."""
    sampler = {"gen_length": args.gen, "block_length": args.block, "temperature": args.temperature,
               "threshold": args.threshold, "attn_backend": "sdpa", **variant["sampler"]}
    if args.max_blocks:
        sampler["max_blocks"] = args.max_blocks
    values = {
        "model.path": "random:llada" if not args.tiny else "tiny:llada",
        "model.dtype": "float32" if args.tiny else "bfloat16",
        "model.attn_backend": variant["attn"], "model.logits_chunk_size": variant["logits_chunk"],
        "model.gradient_checkpointing": args.grad_ckpt,
        "lora.enabled": not args.no_lora, "lora.r": args.lora_r, "lora.alpha": args.lora_alpha,
        "lora.dropout": args.lora_dropout,
        "rollout.group_size": args.group, "rollout.samples_file": False,
        "algorithm.name": "d1", "algorithm.inner_steps": args.inner_steps, "algorithm.kl_coef": args.kl_coef,
        "algorithm.clip_low": 0.5, "algorithm.p_mask_prompt": 0.15, "algorithm.advantage": "mean",
        "optim.lr": 3.0e-6, "optim.betas": "[0.9,0.99]", "optim.weight_decay": 0.1, "optim.grad_clip": 0.2,
        "trainer.output_dir": out_dir, "trainer.batch_size": args.prompts * args.group,
        "trainer.micro_batch_size": args.micro_batch, "trainer.max_steps": 2 * args.inner_steps,
        "trainer.progress": False, "trainer.export": False, "distributed.device": args.device.type,
    }
    values.update({f"rollout.sampler.{k}": v for k, v in sampler.items()})
    return [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()]


# ----------------------------------------------------------------------------------- one variant
def build_model(args):
    if args.tiny:
        from dare.models.tiny import tiny_model

        return tiny_model("llada", seed=0).to(args.device)
    return build_llada(args.device, **({"n_layers": args.layers} if args.layers else {}))


def timed_step(trainer, step: int, device) -> tuple[dict, float]:
    start = clock(device)
    record = trainer.train_step(step)
    return record, clock(device) - start


def release(device: torch.device) -> None:
    """Return the finished variant's memory (call once its frames and tracebacks are gone)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def run_variant(name: str, args, prompts, log) -> dict:
    """Build the model and trainer of variant ``name``, run the warm-up step, then time one rollout cycle."""
    from dare.trainer import Trainer, load_train_config

    device = args.device
    variant = VARIANTS[name]
    began = time.perf_counter()
    model = build_model(args)
    injection = ConfidenceInjection(model, args.confident_fraction, device, active=False)
    try:
        with tempfile.TemporaryDirectory() as out_dir:
            config = load_train_config(None, overrides(args, variant, out_dir))
            trainer = Trainer(config, model=model, source=source_factory(prompts, injection))
            source, mu = trainer.source, args.inner_steps
            setup_s = time.perf_counter() - began
            trainable = sum(p.numel() for p in trainer.model.parameters() if p.requires_grad)
            log(f"  [{name}] model + trainer built in {setup_s:.1f}s ({trainable / 1e6:.2f}M trainable parameters)")

            measured = source.sampler
            source.sampler = measured.replace(max_blocks=1)  # warm-up: a one-block rollout and one update
            warm, warm_s = timed_step(trainer, 0, device)
            source.sampler = measured
            log(f"  [{name}] warm-up step {warm_s:.1f}s (one-block rollout {warm['rollout/generate_s']:.1f}s)")
            blocks = args.gen // args.block
            timed_blocks = min(blocks, args.max_blocks or blocks)
            estimate = warm["rollout/generate_s"] * timed_blocks + (warm_s - warm["rollout/generate_s"]) * mu
            left = args.deadline - time.perf_counter()
            if estimate > left:
                return {"skipped": f"estimated {estimate:.0f}s > {left:.0f}s left of the time budget"}

            records, walls = [], []
            for k in range(mu):
                record, wall = timed_step(trainer, mu + k, device)
                records.append(record)
                walls.append(wall)
            first = records[0]
            phases = {"rollout": first["rollout/generate_s"], "reward": first["rollout/reward_s"],
                      "logprobs": first["rollout/logprob_s"]}
            updates = [walls[0] - first["rollout/time_s"], *walls[1:]]
            phases["update"] = sum(updates)
            micro = source.batch(mu)  # the cached micro-batches of the measured cycle
            rows = sum(mb.batch_size[0] for mb in micro)
            slots = sum(mb["input_ids"].numel() for mb in micro)
            real = int(sum(mb["attention_mask"].sum() for mb in micro))
            decoded = first["rollout/decoded"] * rows
            cycle = sum(walls)
            result = {
                "phases_s": phases, "updates_s": updates, "cycle_s": cycle, "setup_s": setup_s, "warmup_s": warm_s,
                "rows": rows, "nfe": first["rollout/nfe"], "decoded_tokens": decoded,
                "tokens_per_forward": decoded / rows / max(first["rollout/nfe"], 1),
                "rollout_tokens_per_s": decoded / phases["rollout"], "step_tokens_per_s": decoded / cycle,
                "train_tokens_per_s": real * mu / phases["update"], "train_tokens": real, "train_slots": slots,
                "padding_fraction": 1 - real / slots, "blocks_timed": timed_blocks, "blocks": blocks,
                "reward": first["rollout/reward"], "loss": [r["loss"] for r in records],
                "kl": [r.get("policy/kl") for r in records], "grad_norm": [r["grad_norm"] for r in records],
                "config": overrides(args, variant, "OUT"),
            }
            full_rollout = phases["rollout"] * blocks / timed_blocks
            result["projected_full_cycle_s"] = cycle - phases["rollout"] + full_rollout
            per_view = phases["logprobs"] / mu
            result["projected_d1_mu12_s"] = (full_rollout + phases["reward"] + per_view * D1_MU
                                             + sum(updates) / mu * D1_MU)
            if device.type == "cuda":
                result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 2**30
            return result
    finally:
        injection.remove()


# ----------------------------------------------------------------------------------- driver
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny LLaDA on CPU (smoke test)")
    p.add_argument("--device", help="default: cuda if available (cpu with --tiny)")
    p.add_argument("--variants", nargs="+", default=["optimised", "naive"], choices=list(VARIANTS),
                   help="run order (default: optimised first, the naive one uses the rest of the budget)")
    p.add_argument("--prompts", type=int, help="prompts per step (default 4; tiny 2)")
    p.add_argument("--group", type=int, help="samples per prompt G (default 8; tiny 4)")
    p.add_argument("--prompt-length", type=int, help="mean prompt tokens (default 128; tiny 12)")
    p.add_argument("--prompt-spread", type=int, help="prompt lengths are mean +- spread, uniform (default 32; tiny 4)")
    p.add_argument("--gen", type=int, help="generation length (default 256; tiny 16)")
    p.add_argument("--block", type=int, help="block length (default 32; tiny 8)")
    p.add_argument("--max-blocks", type=int,
                   help="decode only the first N blocks in both variants (default 2; tiny all)")
    p.add_argument("--temperature", type=float, default=0.9, help="rollout temperature (d1: 0.9)")
    p.add_argument("--threshold", type=float, default=0.9, help="confidence threshold of the optimised sampler")
    p.add_argument("--confident-fraction", type=float, default=0.25,
                   help="fraction of positions made confident in every rollout forward (0 = raw random weights)")
    p.add_argument("--inner-steps", type=int, default=2, help="mu: optimizer steps per rollout (default 2)")
    p.add_argument("--kl-coef", type=float, default=0.04, help="beta of the k3 KL (0 = no reference forwards)")
    p.add_argument("--micro-batch", type=int, help="rows per forward/backward (default 8; tiny 4)")
    p.add_argument("--no-lora", action="store_true", help="train every weight (frozen reference copy)")
    p.add_argument("--layers", type=int, help="transformer layers of the 8B shape (default 32)")
    p.add_argument("--lora-r", type=int, help="LoRA rank (default 128 as configs/llada/d1_8b.yaml; tiny 8)")
    p.add_argument("--lora-alpha", type=int, help="LoRA alpha (default 64; tiny 16)")
    p.add_argument("--lora-dropout", type=float, default=0.05, help="LoRA dropout (d1: 0.05)")
    p.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing in the update")
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="skip a variant whose measured cycle would end past this many seconds (from the start)")
    p.add_argument("--hard-limit-s", type=int, default=285, help="abort whatever runs after this many seconds")
    p.add_argument("--json", help="write the results to this file")
    args = p.parse_args(argv)
    tiny = args.tiny
    pick = lambda value, default, small: value if value is not None else (small if tiny else default)  # noqa: E731
    args.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() and not tiny else "cpu"))
    args.prompts = pick(args.prompts, 4, 2)
    args.group = pick(args.group, 8, 4)
    args.prompt_length = pick(args.prompt_length, 128, 12)
    args.prompt_spread = pick(args.prompt_spread, 32, 4)
    args.gen = pick(args.gen, 256, 16)
    args.block = pick(args.block, 32, 8)
    args.max_blocks = pick(args.max_blocks, 2, None)
    args.micro_batch = pick(args.micro_batch, 8, 4)
    args.lora_r = pick(args.lora_r, 128, 8)
    args.lora_alpha = pick(args.lora_alpha, 64, 16)
    if args.gen % args.block:
        p.error(f"--block {args.block} must divide --gen {args.gen}")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    args.deadline = start + args.budget_s

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - start:6.1f}s] {message}", flush=True)

    def on_alarm(signum, frame):
        raise BudgetExceeded(f"hard limit of {args.hard_limit_s}s reached")

    if args.device.type == "cpu":
        torch.set_num_threads(1)  # tiny models: extra OpenMP threads only add contention
    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(args.hard_limit_s)
    results: dict = {}
    try:
        import dare  # noqa: F401

        name = torch.cuda.get_device_name(args.device) if args.device.type == "cuda" else "cpu"
        log(f"device {args.device} ({name}), torch {torch.__version__}; {args.prompts} prompts x {args.group} "
            f"samples, prompt {args.prompt_length}+-{args.prompt_spread}, gen {args.gen} (first "
            f"{args.max_blocks or 'all'} blocks of {args.block} timed), mu {args.inner_steps}, micro-batch "
            f"{args.micro_batch}, {'full fine-tuning' if args.no_lora else f'LoRA r {args.lora_r}'}")
        vocab_limit = 256 if args.tiny else 126000  # below every special id
        prompts = make_prompts(2 * args.prompts, args.prompt_length, args.prompt_spread, vocab_limit)
        release(args.device)
        for name in args.variants:
            if time.perf_counter() > args.deadline:
                results[name] = {"skipped": "time budget spent"}
                log(f"skip {name}: time budget spent")
                continue
            log(f"run {name}")
            try:
                results[name] = run_variant(name, args, prompts, log)
            except (Exception, BudgetExceeded) as err:  # a failing variant is reported, not fatal
                results[name] = {"error": f"{type(err).__name__}: {err}",
                                 "traceback": traceback.format_exc(limit=6)[-3000:]}
                log(f"FAILED {name}: {type(err).__name__}: {str(err)[:300]}")
                if isinstance(err, BudgetExceeded):
                    break
            else:
                report_variant(name, results[name], log)
            release(args.device)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    summary = summarise(results)
    print_table(results, summary, args)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"args": {k: str(v) if isinstance(v, torch.device) else v for k, v in vars(args).items()},
             "device": str(args.device), "torch": torch.__version__, "results": results, "summary": summary},
            indent=2) + "\n")
    log("done")
    return 0


def report_variant(name: str, r: dict, log) -> None:
    if "skipped" in r:
        log(f"skip {name}: {r['skipped']}")
        return
    ph = r["phases_s"]
    log(f"  [{name}] cycle {r['cycle_s']:.2f}s = rollout {ph['rollout']:.2f} + reward {ph['reward']:.2f} + "
        f"log-probs {ph['logprobs']:.2f} + update {ph['update']:.2f}; nfe {r['nfe']:.0f}, "
        f"TPF {r['tokens_per_forward']:.2f}, rollout {r['rollout_tokens_per_s']:.1f} tok/s"
        + (f", peak {r['peak_memory_gib']:.1f} GiB" if "peak_memory_gib" in r else ""))


def summarise(results: dict) -> dict:
    naive, fast = results.get("naive", {}), results.get("optimised", {})
    if "cycle_s" not in naive or "cycle_s" not in fast:
        return {}
    out = {f"{p}_x": naive["phases_s"][p] / max(fast["phases_s"][p], 1e-9) for p in PHASES}
    out["cycle_x"] = naive["cycle_s"] / fast["cycle_s"]
    out["projected_full_cycle_x"] = naive["projected_full_cycle_s"] / fast["projected_full_cycle_s"]
    out["projected_d1_mu12_x"] = naive["projected_d1_mu12_s"] / fast["projected_d1_mu12_s"]
    return out


def print_table(results: dict, summary: dict, args) -> None:
    done = [n for n in args.variants if "cycle_s" in results.get(n, {})]
    print(f"\nd1 RL step: {args.prompts}x{args.group} rollouts, gen {args.gen} (first {args.max_blocks or 'all'} "
          f"blocks timed), mu {args.inner_steps}; seconds (x naive / optimised)")
    print("| phase | " + " | ".join(done) + " | speed-up |")
    print("|---|" + "---|" * (len(done) + 1))
    for phase in PHASES:
        cells = [f"{results[n]['phases_s'][phase]:.2f}" for n in done]
        ratio = f"{summary[phase + '_x']:.2f}x" if summary else ""
        print(f"| {phase} | " + " | ".join(cells) + f" | {ratio} |")
    rows = (("RL step (measured)", "cycle_s", "cycle_x"),
            ("RL step, full-length rollout (projected)", "projected_full_cycle_s", "projected_full_cycle_x"),
            (f"d1 cycle, mu {D1_MU} (projected)", "projected_d1_mu12_s", "projected_d1_mu12_x"))
    for label, key, ratio_key in rows:
        cells = [f"{results[n][key]:.2f}" for n in done]
        ratio = f"{summary[ratio_key]:.2f}x" if summary else ""
        print(f"| {label} | " + " | ".join(cells) + f" | {ratio} |")
    for label, key, fmt in (("rollout tok/s", "rollout_tokens_per_s", "{:.1f}"),
                            ("RL-step tok/s (generated)", "step_tokens_per_s", "{:.1f}"),
                            ("train tok/s", "train_tokens_per_s", "{:.0f}"),
                            ("tokens per forward", "tokens_per_forward", "{:.2f}"),
                            ("padding fraction", "padding_fraction", "{:.2f}"),
                            ("peak memory GiB", "peak_memory_gib", "{:.1f}")):
        if all(key in results[n] for n in done):
            print(f"| {label} | " + " | ".join(fmt.format(results[n][key]) for n in done) + " | |")
    for name in args.variants:
        r = results.get(name, {})
        if "cycle_s" not in r:
            print(f"{name}: {r.get('skipped') or r.get('error') or 'not run'}")
    if summary:
        verdict = "meets" if summary["cycle_x"] >= 4 else "MISSES"
        print(f"end to end: {summary['cycle_x']:.2f}x measured, {summary['projected_full_cycle_x']:.2f}x with the "
              f"full-length rollout projected ({verdict} the 4x target as measured)")


if __name__ == "__main__":
    sys.exit(main())
