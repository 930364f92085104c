"""Worker for tests/test_distributed.py: gradients and optimizer steps of a few training variants.

Run as ``torchrun --nproc_per_node N tests/dist_worker.py OUT_DIR`` (FSDP2 over gloo) or as a plain
``python`` process (no process group). Rank 0 writes ``OUT_DIR/result.pt``: per SFT variant the step-0 loss, the
full gradients and the weights after two optimizer steps (also exported to ``OUT_DIR/VARIANT/final``); per RL
variant additionally every rollout of the run gathered from all ranks (completions, rewards, advantages, old /
reference log-probs), ordered by the rollout's global row index.
"""

import sys
from pathlib import Path

import torch

VARIANTS = {
    "padded": ["trainer.micro_batch_size=2"],
    "packed": ["data.packing=true", "data.pack_length=48", "data.max_length=48", "algorithm.normalize=masked"],
    "lora": ["lora.enabled=true", "lora.r=4", "model.path=tiny:dream:1", "algorithm.schedule=discrete"],
    "block": ["model.path=tiny:sdar:1", "algorithm.per_block_t=true", "algorithm.normalize=d1", "data.packing=true",
              "data.pack_length=48", "data.fixed_shapes=true"],  # block diffusion: [noisy ; clean] layout
}


ROOT = Path(__file__).resolve().parents[1]
RL_COMMON = ["data.num_examples=8", "trainer.batch_size=8", "rollout.group_size=4", "trainer.micro_batch_size=2",
             "rollout.reward=dist_varied", "rollout.samples_file=false", "optim.lr=1e-3"]
RL_VARIANTS = {  # recipe, overrides, optimizer steps (a second rollout after mu steps samples the updated policy)
    "rl_d1": ("configs/llada/d1_tiny.yaml", ["algorithm.inner_steps=2"], 3),  # old + frozen-copy reference
    "rl_coupled_lora": ("configs/llada/coupled_grpo_tiny.yaml",  # reference = the adapter-disabled FSDP policy
                        ["algorithm.inner_steps=1", "lora.enabled=true", "lora.r=4"], 2),
    "rl_sdar_bgpo": ("configs/sdar/bgpo_tiny.yaml", ["algorithm.mc_num=2"], 2),  # block cache sampler, MC terms
    "rl_justgrpo": ("configs/llada/justgrpo_tiny.yaml",  # left-to-right rollouts, old + frozen-copy reference
                    ["algorithm.inner_steps=2", "algorithm.kl_coef=0.04", "algorithm.positions_per_forward=3"], 3),
    # no KL: only the views of rollouts with a non-zero advantage; micro-batches of a flat group run empty views
    "rl_justgrpo_skip": ("configs/llada/justgrpo_tiny.yaml",
                         ["algorithm.inner_steps=2", "rollout.reward=dist_half_flat",
                          "algorithm.positions_per_forward=3"], 2),
    # two-pass sequence gradient; Adam's eps 1e-6: at 1e-8 it turned a 1e-8 gradient's fp32 round-off between
    # the 1- and 2-process sums (6 %, on an Intel CPU) into a 1.5e-5 weight difference
    "rl_espo": ("configs/llada/espo_tiny.yaml", ["algorithm.inner_steps=1", "optim.eps=1e-6"], 2),
    "rl_gdpo_dynamic": ("configs/llada/gdpo_tiny.yaml",  # dynamic sampling: extra rounds, groups moved across ranks
                        ["rollout.dynamic_sampling=true", "rollout.reward=dist_half_flat"], 2),
    "rl_dtreerpo": ("configs/llada/dtreerpo_tiny.yaml", ["algorithm.distill_horizon=1"], 3),  # tree rollouts
    # re-rolls of failed groups; lr 5e-4: Adam turned fp32 round-off into a 5.7e-6 weight difference at 1e-3
    "rl_igpo": ("configs/llada/igpo_tiny.yaml", ["algorithm.inner_steps=1", "optim.lr=5e-4"], 2),
    "rl_sdar_dipo": ("configs/sdar/dipo_tiny.yaml", [], 2),  # step rounds of the block sampler
}
ROLLOUT_FIELDS = ("rewards", "advantages", "old_logp", "ref_logp", "old_elbo", "ref_elbo")


def register_test_reward() -> None:
    """``dist_varied``: a reward that differs between almost any two completions (non-zero advantages even for a
    random tiny model, so the policy-gradient term is exercised, not only the KL)."""
    from dare.rewards import Reward, RewardResult
    from dare.rewards.base import REWARDS, register_reward

    if "dist_varied" in REWARDS:  # the single-process run imports this module in the pytest process
        return

    class DistVaried(Reward):
        def score_one(self, completion, sample):
            return RewardResult(reward=(sum(map(ord, completion)) % 11) / 10, correct=False)

    register_reward("dist_varied")(DistVaried)

    class DistHalfFlat(Reward):  # constant on answers of even length: those groups are flat
        def score_one(self, completion, sample):
            if len(sample["answer"]) % 2 == 0:
                return RewardResult(reward=1.0, correct=True)
            return RewardResult(reward=(sum(map(ord, completion)) % 11) / 10, correct=False)

    register_reward("dist_half_flat")(DistHalfFlat)


def gather(value, info) -> list:
    """``value`` of every rank, in rank order (``[value]`` without a process group)."""
    import torch.distributed as dist

    if not info.initialized:
        return [value]
    out = [None] * info.world_size
    dist.all_gather_object(out, value)
    return out


def rollout_record(micro, info) -> dict:
    """This step's rollouts from every rank: completion tokens (the generated columns, independent of the left
    padding), rewards, advantages and old / reference log-probs at the generated columns, by global row.
    ``micro`` is the last inner step's (the first inner step stores no old log-probs: it trains on-policy)."""
    local = []
    for mb in micro:
        gen = mb["generated"]
        rows = {"row": mb["rollout_index"], "completion": mb["input_ids"][gen].reshape(len(gen), -1)}
        for key in ROLLOUT_FIELDS:
            if key in mb.keys():
                value = mb[key]
                # per-column fields ([R, S] or [R, terms, S]): the generated columns (the same in every row)
                rows[key] = value[..., gen[0]] if value.shape[-1] == gen.shape[1] and value.ndim > 1 else value
        local.append({k: v.detach().cpu() for k, v in rows.items()})
    parts = [part for rank in gather(local, info) for part in rank]
    merged = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    order = merged["row"].argsort(stable=True)
    out = {k: v[order] for k, v in merged.items()}
    first = torch.ones(len(order), dtype=torch.bool)  # sequence-parallel ranks hold the same rollouts: keep one
    first[1:] = out["row"][1:] != out["row"][:-1]
    out = {k: v[first] for k, v in out.items()}
    out["width_per_rank"] = gather(micro[0]["input_ids"].shape[1], info)  # prompt + completion, left-padded
    return out


def run_rl(name: str, out_dir: Path, info, extra: tuple[str, ...] = ()) -> dict:
    from rollout_helpers import sprinkle_token

    from dare.models import family_of
    from dare.models.loading import load_model
    from dare.trainer import Trainer, load_train_config

    recipe, overrides, steps = RL_VARIANTS[name]
    config = load_train_config(ROOT / recipe, [f"trainer.output_dir={out_dir / name}", "trainer.progress=false",
                                               f"trainer.max_steps={steps}", *RL_COMMON, *overrides, *extra])
    # EOS sprinkled into the logits: rows stop early at steps that differ between rows (and ranks), completion
    # lengths differ (a non-zero on-policy loss), and the early-stopping sampler runs different numbers of
    # forwards on different ranks
    model = load_model(config.model.path)
    sprinkle_token(model, family_of(model).token_ids(model.config).eos, rate=0.1)
    trainer = Trainer(config, info=info, model=model)
    nfe: list[int] = []  # this rank's denoiser forwards per rollout
    generate = trainer.source._generate

    def counting(*args):
        outputs = generate(*args)
        nfe.append(sum(out.nfe for out in outputs))
        return outputs

    trainer.source._generate = counting
    record: dict = {"losses": [], "rollouts": []}
    for step in range(steps):
        trainer.step = step
        metrics = trainer.forward_backward(step)
        record["losses"].append(float(metrics["loss"]))
        if step % trainer.source.mu == 0:  # a fresh rollout of the current policy
            record["rollouts"].append(rollout_record(trainer.source._cache[1][-1], info))
            record.setdefault("step_metrics", []).append(dict(trainer.source.step_metrics))
        if step == 0:
            record["grads"] = {n: full(p.grad).clone() for n, p in trainer.model.named_parameters()
                               if p.grad is not None}
        trainer.optimizer_step()
    record["params"] = {n: full(p.detach()).clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    record["micro_batches_rank0"] = len(trainer.source.batch(steps - 1))
    record["nfe_per_rank"] = gather(nfe, info)
    return record


def full(tensor):
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def main(out_dir: Path) -> None:
    from dare.distributed import init_distributed, shutdown
    from dare.trainer import Trainer, load_train_config

    info = init_distributed("gloo", "cpu")
    register_test_reward()
    result = {"world_size": info.world_size}
    for name, overrides in VARIANTS.items():
        config = load_train_config(None, [
            f"trainer.output_dir={out_dir / name}", "trainer.progress=false", "data.num_examples=24",
            "data.max_length=48", "trainer.batch_size=8", "trainer.max_steps=2", "optim.lr=1e-3", *overrides,
        ])
        trainer = Trainer(config, info=info)
        metrics = trainer.forward_backward(0)
        grads = {n: full(p.grad).clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
        trainer.optimizer_step()
        trainer.step = 1
        metrics_1 = trainer.forward_backward(1)
        trainer.optimizer_step()
        state = {n: full(p.detach()).clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
        micro = len(trainer.source.batch(0))
        trainer.step = 2
        trainer.save()  # sharded checkpoint of the two steps (collective): what dare export reads in one process
        trainer.export(out_dir / name / "final")  # gathers the sharded weights (collective)
        result[name] = {"loss": float(metrics["loss"]), "loss_1": float(metrics_1["loss"]), "grads": grads,
                        "params": state, "micro_batches_rank0": micro}
    for name in RL_VARIANTS:
        result[name] = run_rl(name, out_dir, info)
    if info.is_main:
        torch.save(result, out_dir / "result.pt")
    shutdown(info)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
