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
   w.p. 0.15) with old log-probs (policy, ``mu > 1``, from the second inner step on: the first trains on-policy)
   and reference log-probs (LoRA adapter disabled; k3 KL, beta 0.04);
4. **update**: ``mu`` optimizer steps (micro-batched forward/backward of the clipped d1 loss, gradient clipping,
   AdamW), i.e. ``Trainer.train_step``.

Phases 1-3 are timed inside ``RolloutSource`` (``rollout/generate_s``, ``reward_s``, ``logprob_s``, each
after a CUDA synchronisation); the update is the synchronised wall time of the ``train_step`` calls minus
those. Each variant first runs a warm-up step (a one-block rollout, one update), then the measured cycle
(the harness shared with ``bd_rl_step.py``: ``rl_harness.py``). ``--engine eager|graph|auto`` sets
``rollout.sampler.engine`` of both variants when ``SamplerConfig`` has that field. ``--profile`` (CUDA) runs one
more cycle under the profiler and prints, per phase (weight refresh, rollout, reward, log-probs, each update),
kernel time by kind, idle time and the top kernels, and sets each phase's kernel time against the timed
cycle's (the profiler's own host overhead inflates the profiled cycle's idle time). ``--syncs`` (CUDA) counts,
in that extra cycle, the calls that wait for the GPU (``torch.cuda.set_sync_debug_mode``), per phase and call
site.

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

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import rl_harness  # noqa: E402
from common import build_llada  # noqa: E402
from rl_harness import PHASES  # noqa: E402,F401  (the phases of the table and the JSON)

TITLE = "d1 RL step"
VARIANTS = {
    "naive": dict(sampler=dict(sampler="llada", cache="none", decoder="quota"), attn="eager", logits_chunk=0),
    "optimised": dict(sampler=dict(sampler="fastdllm", cache="dual", decoder="threshold"), attn="sdpa",
                      logits_chunk=2048),
}
D1_MU = 12  # d1's inner steps per rollout (the projection below)
PROJECTIONS = {"projected_d1_mu12_s": f"d1 cycle, mu {D1_MU} (projected)"}


def configure(p) -> None:
    p.add_argument("--block", type=int, help="block length (default 32; tiny 8)")
    p.add_argument("--temperature", type=float, default=0.9, help="rollout temperature (d1: 0.9)")
    p.add_argument("--kl-coef", type=float, default=0.04, help="beta of the k3 KL (0 = no reference forwards)")
    p.add_argument("--layers", type=int, help="transformer layers of the 8B shape (default 32)")


def defaults(args, pick) -> None:
    args.block = pick(args.block, 32, 8)
    args.max_blocks = pick(args.max_blocks, 2, None)
    args.inner_steps = pick(args.inner_steps, 2, 2)
    args.micro_batch = pick(args.micro_batch, 8, 4)
    args.confident_fraction = pick(args.confident_fraction, 0.25, 0.25)


def overrides(args, variant: dict) -> dict:
    return {"model.path": "random:llada" if not args.tiny else "tiny:llada",
            "algorithm.name": "d1", "algorithm.kl_coef": args.kl_coef, "algorithm.clip_low": 0.5,
            "algorithm.p_mask_prompt": 0.15, "algorithm.advantage": "mean",
            "optim.lr": 3.0e-6, "optim.betas": "[0.9,0.99]", "optim.weight_decay": 0.1, "optim.grad_clip": 0.2}


def build_model(args):
    if args.tiny:
        from dare.models.tiny import tiny_model

        return tiny_model("llada", seed=0).to(args.device)
    return build_llada(args.device, **({"n_layers": args.layers} if args.layers else {}))


def vocab_limit(args) -> int:
    return 256 if args.tiny else 126000  # below every special id


def rollout_scale(args, variant: dict, measured_blocks: int, blocks: int) -> float:
    """Both samplers cost the same per block (no cache: the whole sequence each step; dual cache: constant)."""
    return blocks / measured_blocks


def projections(result: dict, args) -> dict:
    """The cycle of d1's recipe (mu = 12): full-length rollout, reward, and 12 views and updates."""
    mu, ph = args.inner_steps, result["phases_s"]
    return {"projected_d1_mu12_s": (result["projected_rollout_s"] + ph["reward"] + ph["logprobs"] / mu * D1_MU
                                    + ph["update"] / mu * D1_MU)}


def verdict(summary: dict) -> str:
    return f"{'meets' if summary['cycle_x'] >= 4 else 'MISSES'} the 4x target as measured"


def main(argv=None) -> int:
    return rl_harness.main(globals(), argv)


if __name__ == "__main__":
    sys.exit(main())
