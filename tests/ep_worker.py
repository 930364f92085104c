"""Worker for tests/test_expert_parallel.py: expert-parallel outputs and gradients against the unsharded model.

Run as ``torchrun --nproc_per_node 2 tests/ep_worker.py OUT_DIR`` (gloo). Every rank builds the same tiny MoE
model, feeds its own batch through (a) the full model and (b) the model with its experts sharded over the
2 ranks, and writes ``OUT_DIR/rank{R}.pt``: logits, replicated-parameter gradients and local-expert gradients of
both runs. The full run's expert gradients are summed over ranks first (what data parallelism would reduce).
"""

import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]

CASES = {  # name: family, token counts per rank (rank 1's 1-token batch leaves most experts of a rank idle)
    "llada_moe": ("llada_moe", (2, 9)),
    "sdar_moe": ("sdar_moe", (2, 9)),
    "llada2": ("llada2", (2, 9)),
    "llada2_uneven": ("llada2", (1, 1)),
}


def step(model, ids):
    model.zero_grad()
    logits = model(ids).logits
    (logits.float() * torch.linspace(-1, 1, logits.shape[-1])).sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def main(out: Path) -> None:
    from dare.distributed import init_distributed
    from dare.distributed.expert_parallel import expert_parallel_mesh, shard_experts
    from dare.models.moe import ExpertBank
    from dare.models.tiny import tiny_model

    torch.set_num_threads(1)
    info = init_distributed("gloo", "cpu")
    mesh = expert_parallel_mesh(info, info.world_size)
    results = {}
    for name, (family, (rows, length)) in CASES.items():
        full = tiny_model(family, seed=7).train()
        sharded = copy.deepcopy(full)
        shard_experts(sharded, mesh["expert"])
        generator = torch.Generator().manual_seed(100 + info.rank)
        ids = torch.randint(0, 256, (rows, length + 4 * info.rank), generator=generator)
        ref_logits, ref_grads = step(full, ids)
        logits, grads = step(sharded, ids)
        expert_grads = {}
        for module_name, bank in sharded.named_modules():
            if isinstance(bank, ExpertBank):
                local = slice(bank.first_expert, bank.first_expert + bank.num_local_experts)
                for param in ("gate_up_proj", "down_proj"):
                    key = f"{module_name}.{param}"
                    total = ref_grads.pop(key)
                    dist.all_reduce(total)
                    expert_grads[key] = (grads.pop(key).to_local(), total[local].clone())
        results[name] = {"logits": (logits, ref_logits), "replicated": (grads, ref_grads), "experts": expert_grads,
                         "local_experts": [b.num_local_experts for b in sharded.modules() if isinstance(b, ExpertBank)]}
    frozen = tiny_model("llada2", seed=0).requires_grad_(False)  # e.g. the base weights under LoRA
    shard_experts(frozen, mesh["expert"])
    results["frozen_experts_stay_frozen"] = not any(p.requires_grad for p in frozen.parameters())
    results["trainer"] = {degree: train(out / f"ep{degree}", degree, info) for degree in (1, 2)}
    torch.save(results, out / f"rank{info.rank}.pt")
    dist.destroy_process_group()


def train(out: Path, degree: int, info) -> dict:
    """Two SFT steps of the tiny LLaDA2 recipe under FSDP2 with ``distributed.expert_parallel=degree``, then
    export: losses, gradient norms and the exported tensors (rank 0)."""
    from safetensors.torch import load_file

    from dare.trainer import Trainer, load_train_config

    config = load_train_config(ROOT / "configs/llada2/sft_tiny.yaml", [
        f"trainer.output_dir={out}", "trainer.progress=false", "trainer.max_steps=2", "trainer.batch_size=4",
        "trainer.micro_batch_size=2", f"distributed.expert_parallel={degree}",
    ])
    trainer = Trainer(config, info=info)
    record = {"loss": [], "grad_norm": []}
    for step in range(2):
        trainer.step = step
        record["loss"].append(float(trainer.forward_backward(step)["loss"]))
        record["grad_norm"].append(trainer.optimizer_step()["grad_norm"])
    trainer.export(out / "final")
    if info.is_main:
        record["exported"] = load_file(out / "final" / "model.safetensors")
    return record


if __name__ == "__main__":
    main(Path(sys.argv[1]))
