#!/usr/bin/env python
"""One BGPO RL step on an SDAR-8B-shaped block-diffusion model: naive vs optimised paths, per phase.

GPU run (one H200; random bf16 weights built on the GPU in seconds; < 5 minutes in all, hard-stopped at
``--hard-limit-s``)::

    python benchmarks/bd_rl_step.py --json $OUT/bd_rl_step.json

CPU smoke test (tiny SDAR; numbers meaningless; part of the test suite)::

    python benchmarks/bd_rl_step.py --tiny

The structure is ``rl_step.py``'s (the harness ``rl_harness.py``): one RL step is one rollout cycle of DARE's real
workflow (``dare.trainer.Trainer`` with a ``dare.trainer.rl.RolloutSource`` and the registered ``bgpo`` plug-in,
settings of ``configs/sdar/bgpo_8b.yaml`` unless noted):

1. **rollout**: ``P`` prompts x ``G`` samples (default 4 x 8 = 32 rows; prompts of 96-160 random tokens,
   left-padded; generation 256, block 4, 4 steps per block, temperature 1.0, top-k 50) with the current policy;
2. **reward**: decode + a synthetic reward (fraction of even token ids) + z-score group advantages;
3. **log-probs**: BGPO's stored views (``mc_num`` stratified corruptions of each completion, global over the
   response; on-policy, mu = 1, so no old or reference forwards);
4. **update**: one optimizer step: ``mc_num`` ``[noisy ; clean]`` forwards + backwards per micro-batch (per-term
   ELBO bounds, clip 0.2, dual clip 3, ELBO normalised by the valid response length), gradient clipping, AdamW.

Variants (equal settings otherwise: same prompts, seeds, LoRA, MC terms, micro-batches):

* ``naive``: SDAR's sampler without the block KV cache (every step recomputes prompt + finished blocks + current
  block, full logits of the whole sequence), one token per step (``low_confidence_static``), eager attention in
  rollout and training, full ``[B, L, V]`` training logits (``model.logits_chunk_size=0``);
* ``optimised``: exact block KV cache, dynamic threshold decoding (``low_confidence_dynamic`` 0.9, at least one
  token per step), sdpa, the chunked LM head at the scored positions only. (``configs/sdar/bgpo_8b.yaml`` trains
  with ``flex`` attention on CUDA: ``--optimised-attn flex`` measures that instead.)

Model: SDAR-8B shape (36 layers, d 4096, MLP 12288, GQA 32:8, vocab 151936) in bf16 with a LoRA adapter (r 128,
alpha 64, dropout 0.05; the recipe fine-tunes every weight with FSDP2 over 8 GPUs, which one GPU cannot hold:
``--no-lora --layers 18`` measures full fine-tuning of a half-depth model); training forwards under bf16 autocast.

Random weights give near-uniform predictions, so the dynamic threshold would never fire;
``--confident-fraction f`` (default 0.5, as ``bd_rollout.py``) raises the top logit of a random fraction ``f`` of
the positions by 20 in every **rollout** forward, and tokens per forward (TPF) is printed. A batch forward runs
while any row still has masks in its block, so the batch's nfe follows its slowest row: with block 4 and 32 rows
dynamic decoding rarely saves a forward (the per-row rate is printed too: ``rollout/tokens_per_forward``, tokens
per row step). ``--max-blocks N`` (default 8 of 64) decodes only the first ``N`` blocks of every rollout in both
variants; the full-length rollout is projected per variant: cached decoding costs the same per block
(``x blocks / N``), full recompute grows with the prefix (``x`` the ratio of the tokens its forwards process,
exact when compute-bound). ``--mc-num`` (default 4) MC terms are timed; the recipe's
16 are projected (``projected_bgpo_mc16_s``: log-prob and update phases scale linearly with the terms).
``--engine eager|graph|auto`` sets ``rollout.sampler.engine`` of both variants when ``SamplerConfig`` has that
field.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import rl_harness  # noqa: E402
from common import build_sdar  # noqa: E402
from rl_harness import PHASES  # noqa: E402,F401  (the phases of the table and the JSON)

TITLE = "BGPO block-diffusion RL step"
VARIANTS = {
    "naive": dict(sampler=dict(sampler="sdar", cache="none", decoder="quota", full_logits=True,
                               attn_backend="eager"), attn="eager", logits_chunk=0),
    "optimised": dict(sampler=dict(sampler="sdar", cache="block", decoder="dynamic"), attn="sdpa",
                      logits_chunk=2048),
}
BGPO_MC = 16  # the recipe's MC terms (configs/sdar/bgpo_8b.yaml)
PROJECTIONS = {"projected_bgpo_mc16_s": f"BGPO step, {BGPO_MC} MC terms (projected)"}


def configure(p) -> None:
    p.add_argument("--block", type=int, default=4, help="block length = SDAR's training block (4)")
    p.add_argument("--temperature", type=float, default=1.0, help="rollout temperature (BGPO recipe: 1.0)")
    p.add_argument("--top-k", type=int, default=50, help="rollout top-k (BGPO recipe: 50)")
    p.add_argument("--mc-num", type=int, help="BGPO MC terms timed (default 4; tiny 2); 16 are projected")
    p.add_argument("--optimised-attn", default="sdpa", choices=("sdpa", "flex"),
                   help="training attention of the optimised variant (recipe on CUDA: flex)")
    p.add_argument("--layers", type=int, help="transformer layers of the 8B shape (default 36)")


def defaults(args, pick) -> None:
    args.max_blocks = pick(args.max_blocks, 8, None)
    args.inner_steps = pick(args.inner_steps, 1, 1)
    args.micro_batch = pick(args.micro_batch, 4, 4)
    args.confident_fraction = pick(args.confident_fraction, 0.5, 0.5)
    args.mc_num = pick(args.mc_num, 4, 2)


def overrides(args, variant: dict) -> dict:
    attn = {"model.attn_backend": args.optimised_attn} if variant is VARIANTS["optimised"] else {}
    return {**attn, "model.path": "random:sdar" if not args.tiny else "tiny:sdar",
            "rollout.sampler.block_steps": args.block, "rollout.sampler.top_k": args.top_k,
            "algorithm.name": "bgpo", "algorithm.advantage": "zscore", "algorithm.mc_num": args.mc_num,
            "algorithm.clip": 0.2, "algorithm.dual_clip": 3.0, "algorithm.normalize": "valid",
            "optim.lr": 5.0e-7, "optim.weight_decay": 0.0, "optim.grad_clip": 1.0}


def build_model(args):
    if args.tiny:
        from dare.models.tiny import tiny_model

        return tiny_model("sdar", seed=0).to(args.device)
    return build_sdar(args.device, **({"num_hidden_layers": args.layers} if args.layers else {}))


def vocab_limit(args) -> int:
    return 256 if args.tiny else 151000  # below every special id


def rollout_scale(args, variant: dict, measured_blocks: int, blocks: int) -> float:
    """Cached decoding: constant cost per block. Full recompute: a forward of block ``k`` processes the padded
    prompt and ``k + 1`` blocks, so the cost follows the summed forward lengths."""
    if variant["sampler"]["cache"] != "none":
        return blocks / measured_blocks
    prompt = args.prompt_length + args.prompt_spread  # the padded prompt width

    def tokens(n: int) -> int:
        return sum(prompt + (k + 1) * args.block for k in range(n))

    return tokens(blocks) / tokens(measured_blocks)


def projections(result: dict, args) -> dict:
    """The recipe's step (16 MC terms): full-length rollout, reward, and views and update scaled by the terms."""
    scale, ph = BGPO_MC / args.mc_num, result["phases_s"]
    return {"projected_bgpo_mc16_s": (result["projected_rollout_s"] + ph["reward"] + ph["logprobs"] * scale
                                      + ph["update"] * scale)}


def main(argv=None) -> int:
    return rl_harness.main(globals(), argv)


if __name__ == "__main__":
    sys.exit(main())
