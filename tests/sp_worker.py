"""Worker for tests/test_sequence_parallel.py: SFT and RL steps under ``distributed.sequence_parallel``.

Run as ``torchrun --nproc_per_node N tests/sp_worker.py OUT_DIR DEGREE [VARIANT,...]`` (FSDP2 over gloo, N / DEGREE
data-parallel groups; default every variant) or as a plain ``python`` process (no process group, DEGREE 1). Rank 0
writes ``OUT_DIR/result.pt``: per SFT variant the step-0 loss, the full gradients, the corrupted tokens of every
example (gathered from all ranks, by global example index) and the row widths rank 0's first block saw; per RL
variant the record of :func:`dist_worker.run_rl`; ``families``: sharded against unsharded forwards of every family
(:func:`run_families`).

Row lengths are chosen so that rows do not divide the degrees (45 tokens, two-copy rows of 90): the model pads
them, so every shard boundary and padding rule is exercised.
"""

import sys
from pathlib import Path

import torch

from dist_worker import full, gather, register_test_reward, run_rl

SFT_VARIANTS = {
    # full-attention MDLM, padded rows of different widths (eos_padding=false: real key padding)
    "mdlm_padded": ["model.path=tiny:llada:1", "trainer.micro_batch_size=2", "data.eos_padding=false"],
    # Dream: shifted logits across shard boundaries, packed documents, 4 query / 2 KV heads
    "dream_packed": ["model.path=tiny:dream:1", "data.packing=true", "data.pack_length=45", "data.max_length=45",
                     "algorithm.normalize=masked", "model.logits_chunk_size=7"],
    # block diffusion: [noisy ; clean] with its block mask, packed (filler document) and padded rows
    "block_packed": ["model.path=tiny:sdar:1", "algorithm.per_block_t=true", "algorithm.normalize=d1",
                     "data.packing=true", "data.pack_length=45", "data.max_length=45", "data.fixed_shapes=true"],
    "block_padded": ["model.path=tiny:sdar:1", "trainer.micro_batch_size=2", "data.eos_padding=false",
                     "model.logits_chunk_size=0"],
}
RL_VARIANTS = ("rl_d1", "rl_sdar_bgpo")


def noise_record(micro, info) -> dict:
    """Corrupted tokens of every real example of this step on every rank, by global example index."""
    local = {}
    for mb in micro:
        for row in range(mb.batch_size[0]):
            index, noisy = mb["example_index"][row], mb["noisy_ids"][row]
            for ex in index[index >= 0].unique().tolist():
                local[ex] = noisy[index == ex].clone()
    merged = {}
    for part in gather(local, info):
        merged.update(part)
    return merged


def run_sft(name: str, overrides: list[str], out_dir: Path, info, degree: int) -> dict:
    from dare.models.loading import unwrap
    from dare.trainer import Trainer, load_train_config

    config = load_train_config(None, [
        f"trainer.output_dir={out_dir / name}", "trainer.progress=false", "data.num_examples=16",
        "data.max_length=45", "trainer.batch_size=8", "trainer.max_steps=1", f"distributed.sequence_parallel={degree}",
        *overrides,
    ])
    trainer = Trainer(config, info=info)
    widths = []  # positions each forward runs through the first transformer block on this rank
    first_block = unwrap(trainer.model).blocks[0]
    hook = first_block.register_forward_pre_hook(lambda module, args: widths.append(args[0].shape[1]))
    metrics = trainer.forward_backward(0)
    hook.remove()
    grads = {n: full(p.grad).clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    micro = [trainer.algorithm.corrupt(mb, 0) for mb in trainer.source.batch(0)]
    return {"loss": float(metrics["loss"]), "grads": grads, "noise": noise_record(micro, trainer.info),
            "block_widths": widths}


def run_families(info, degree: int) -> dict:
    """Every registered family (MoE and LLaDA2 included), padded (left padding) and packed rows: log-probs and
    gradients of one sharded denoiser forward against the unsharded forward on the same rank (gradients summed
    over the sequence group, as FSDP2 does)."""
    import torch.distributed as dist

    from dare.algorithms.logprobs import masked_logprobs
    from dare.distributed.sequence import build_sequence_parallel
    from dare.models import family_of
    from dare.models.spec import FAMILIES
    from dare.models.tiny import tiny_model

    sequence, _ = build_sequence_parallel(info, degree)
    out = {}
    for family in sorted(FAMILIES):
        model = tiny_model(family, seed=3).train()
        mask_id = family_of(model).token_ids(model.config).mask
        gen = torch.Generator().manual_seed(0)
        layouts = {"padded": (2, 21, {"attention_mask": torch.ones(2, 21, dtype=torch.long)}),
                   "packed": (1, 23, {"cu_seqlens": torch.tensor([0, 9, 23])})}
        layouts["padded"][2]["attention_mask"][1, :4] = 0
        for name, (rows, length, layout) in layouts.items():
            ids = torch.randint(0, 256, (rows, length), generator=gen)
            select = torch.rand(rows, length, generator=gen) < 0.5
            if "attention_mask" in layout:
                select &= layout["attention_mask"].bool()
            noisy = torch.where(select, torch.full_like(ids, mask_id), ids)
            weights = torch.rand(rows, length, generator=gen)
            record = {}
            for label, shards in (("full", None), ("sharded", sequence)):
                model.zero_grad(set_to_none=True)
                logp = masked_logprobs(model, noisy, ids, select, chunk_size=5, sequence=shards, **layout)
                (weights * logp).sum().backward()
                grads = {n: (p.grad if p.grad is not None else torch.zeros_like(p)).clone()
                         for n, p in model.named_parameters()}
                if shards is not None:
                    for grad in grads.values():
                        dist.all_reduce(grad, group=shards.group)
                record[label] = {"logp": logp.detach().clone(), "grads": grads}
            out[f"{family}/{name}"] = record
    return out


def main(out_dir: Path, degree: int = 1, variants: list[str] | None = None) -> None:
    from dare.distributed import init_distributed, shutdown

    info = init_distributed("gloo", "cpu")
    register_test_reward()
    result = {"world_size": info.world_size, "degree": degree}
    for name in variants or [*SFT_VARIANTS, *RL_VARIANTS]:  # "families" needs a process group: ask for it by name
        if name == "families":
            result[name] = run_families(info, degree)
        elif name in SFT_VARIANTS:
            result[name] = run_sft(name, SFT_VARIANTS[name], out_dir, info, degree)
        else:
            result[name] = run_rl(name, out_dir, info, extra=(f"distributed.sequence_parallel={degree}",))
    if info.is_main:
        torch.save(result, out_dir / "result.pt")
    shutdown(info)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3].split(",") if len(sys.argv) > 3 else None)
